"""Fuzz the dump readers for longer than CI does, and print what happened.

    python benchmarks/fuzz_readers.py --iterations 2000 [--seed 1]

Each iteration takes one of the seed files of tests/unit/test_fuzz_readers.py (a flightrec
dump, one whose groups are schema 1.2 member grids, a black-box ring, a native pickle, a
native JSON dump), damages it at random (truncate,
overwrite, insert, replace) and reads and analyzes it beside its job's other dumps. A reader
must accept the bytes or refuse them with one DumpError line; anything else is printed as a
failure with the mutation that caused it, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "cli"))

from tests.unit.test_fuzz_readers import SEEDS, check_file, damage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    outcomes: Counter[tuple[str, str]] = Counter()
    failures = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.iterations):
            kind = rng.choice(sorted(SEEDS))
            how = (
                rng.choice(["truncate", "overwrite", "overwrite", "insert", "replace"]),
                rng.randrange(1 << 20),
                rng.randbytes(rng.randint(1, 64)),
            )
            try:
                outcomes[
                    (
                        kind,
                        check_file(SEEDS[kind], damage(SEEDS[kind].read_bytes(), how), Path(tmp)),
                    )
                ] += 1
            except Exception as exc:  # the failures this script exists to find
                failures += 1
                print(f"FAIL #{i} {kind} {how[0]} at {how[1]} ({len(how[2])} bytes): {exc!r:.300}")
    elapsed = time.monotonic() - start
    print(f"{args.iterations} iterations in {elapsed:.0f} s, {failures} failures")
    for (kind, outcome), n in sorted(outcomes.items()):
        print(f"  {kind:14s} {outcome:9s} {n}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
