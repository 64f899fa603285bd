"""What object storage and metrics cost (issue 34): the job's side of an upload, and a scrape.

- ``submit``: what the dumping thread pays to hand a dump to the upload thread (a queue put;
  the thread's start is paid by the first dump only). Measured with the upload thread
  started and busy on an unreachable protocol, so nothing else competes.
- ``scrape``: one ``/metrics`` collection (what ``prometheus_client`` calls per scrape) over
  a full ring of ``--buffer`` entries with ``--pending`` of them pending: the ring's state
  bytes scanned once, the pending slots decoded. Nothing is added to the hot path: the
  collectives' own counters and the ring are read as they are.

Medians over ``--rounds`` batches (the machine may be shared: the minimum is shown too).
Run: ``python benchmarks/bench_cluster.py [--rounds 7] [--buffer 2000] [--pending 1]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from flightrec.recorder.config import Config  # noqa: E402
from flightrec.recorder.dumping.upload import Uploader  # noqa: E402
from flightrec.recorder.hotpath.groups import GroupInfo  # noqa: E402
from flightrec.recorder.hotpath.ring import COMPLETED, ENQUEUED  # noqa: E402
from flightrec.recorder.metrics import Counts, FlightrecCollector  # noqa: E402


def per_call(fn, n: int, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e6)
    return out


def show(name: str, us: list[float]) -> None:
    print(f"{name:8s} median {statistics.median(us):8.2f} us   min {min(us):8.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--buffer", type=int, default=2000)
    ap.add_argument("--pending", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flightrec-bench-"))
    spool = tmp / "spool"
    spool.mkdir()
    dump = spool / "x.frdump"
    dump.write_bytes(b"x")
    # Retries far apart: the upload thread sits in its back-off, the queue just grows.
    up = Uploader("nosuchproto://b/p", str(spool), retries=10, backoff_s=3600)
    up.submit(dump)
    show("submit", per_call(lambda: up.submit(dump), 2000, args.rounds))

    from flightrec.recorder.recording.recorder import Recorder

    rec = Recorder(Config(enabled=True, directory=str(tmp), buffer=args.buffer, blackbox=False))
    g = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
    rec.groups.groups.append(g)
    for i in range(args.buffer):
        rid = rec.ring.append(i, ENQUEUED, g.next_seq(), 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0)
        if i < args.buffer - args.pending:
            rec.ring.finish(rid, COMPLETED, i + 1)
    c = FlightrecCollector(rec, Counts(), up, lambda: (0, 2, "bench"))
    show("scrape", per_call(lambda: list(c.collect()), 200, args.rounds))
    print(f"(ring of {args.buffer} entries, {args.pending} pending)")


if __name__ == "__main__":
    main()
