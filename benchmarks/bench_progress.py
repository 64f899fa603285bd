"""The reporter's reading of every rank's progress record and its first pass, at scale.

What the reporter does once a round's list of progress records is read (``unframe``): decode
every record (``flightrec.format.progress.decode_many``) and choose whose summaries to read
(``select``: the checks, then ``flightrec.live.frontier.find_frontier``). Timed with the C
reader ``flightrec.format._progress`` and with its Python path (protobuf's parser), medians
of ``--runs`` runs, on the records of a simulated job cached by benchmarks/bench_inlog.py
(a pickle with "rows": (rank, summary, progress record)).

    python benchmarks/bench_progress.py --ranks 131072
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flightrec.format import progress as progress_module
from flightrec.format.progress import Decoded, decode_many
from flightrec.live.verdict import select

CACHE = "/tmp/flightrec-bench/inlog2-{ranks}x64-tp8-pp8-stall.pickle"


def timed(raw: dict[int, bytes], world: int, runs: int) -> tuple[float, float, tuple[int, ...]]:
    """Medians of (decode, select) in seconds, and the roots the first pass found."""
    decode, choose = [], []
    roots: tuple[int, ...] = ()
    for _ in range(runs):
        decoded: Decoded = {}
        t0 = time.perf_counter()
        decode_many(raw, world, decoded)
        t1 = time.perf_counter()
        chosen = select(raw, 1, world, decoded=decoded)
        t2 = time.perf_counter()
        decode.append(t1 - t0)
        choose.append(t2 - t1)
        roots = chosen.frontier.roots if chosen.frontier is not None else ()
        del decoded, chosen
    return statistics.median(decode), statistics.median(choose), roots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=131072)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cache", default="", help="the pickle (default: " + CACHE + ")")
    args = parser.parse_args()
    path = args.cache or CACHE.format(ranks=args.ranks)
    with open(path, "rb") as f:
        rows = pickle.load(f)["rows"]  # our own cache, written by bench_inlog.py
    raw = {rank: record for rank, _, record in rows}
    built = progress_module._progress
    paths = [("C", built), ("Python", None)] if built is not None else [("Python", None)]
    if built is None:
        print("flightrec.format._progress is not built: Python path only")
    results = {}
    for name, module in paths:
        progress_module._progress = module
        results[name] = timed(raw, args.ranks, args.runs)
        d, s, roots = results[name]
        print(f"{name:>6}: decode {d:.3f} s + first pass {s:.3f} s = {d + s:.3f} s "
              f"at {args.ranks:,} ranks (roots {list(roots)})")  # fmt: skip
    progress_module._progress = built
    if len(results) == 2:
        c, py = (sum(results[k][:2]) for k in ("C", "Python"))
        same = results["C"][2] == results["Python"][2]
        print(f"ratio {py / c:.1f}x; same roots: {same}")


if __name__ == "__main__":
    main()
