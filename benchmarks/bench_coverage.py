"""Per-call cost of the ways to see collectives issued outside Python (issue 16), and of the
dump-time harvest of PyTorch's recorder that flightrec chose.

The user's harness of issue 15: a fresh process per measurement, ``dist.all_reduce`` of a
1-element tensor on a 1-rank gloo group, called ``--nest`` frames deep, best of 5 batches of
5,000 calls after 2,000 warm-up calls; modes interleaved, ``--rounds`` processes each; the
figure per mode is the median over its processes (the minimum is shown too: this machine is
shared). Modes:

  bare              PyTorch's recorder off (TORCH_FR_BUFFER_SIZE=0), flightrec off
  native            PyTorch's recorder at its default (on: 2,000 entries), flightrec off
  bare, deep        as bare, 60 frames deep
  native, deep      as native, 60 frames deep: the extra 46 frames price torch's stack walk
  flightrec only    FLIGHTREC=1, PyTorch's recorder off (hooks, no coverage beyond Python)
  flightrec+native  FLIGHTREC=1 with torch's default: the chosen design (hooks for stacks,
                    torch's recorder for coverage and numbering, merged at dump time)
  dispatcher        option A: a Python kernel on ``c10d::allreduce_`` (AutogradCPU key),
                    recording a tuple and redispatching below autograd, recorder off

Then the harvest itself: ``_dump_fr_trace`` of a full native ring with and without stacks,
and parsing it, as one dump does.

Run: ``python benchmarks/bench_coverage.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOOP = textwrap.dedent(
    """
    import os, time, torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    if os.environ.get("BENCH_DISPATCH"):
        import threading
        seen = []
        lib = torch.library.Library("c10d", "IMPL")
        op = torch.ops.c10d.allreduce_.default
        def rec(*args):
            seen.append((time.monotonic_ns(), threading.get_ident(), args[1], args[0][0].shape))
            if len(seen) > 2000:
                seen.clear()
            with torch._C._AutoDispatchBelowAutograd():
                return op(*args)
        lib.impl("allreduce_", rec, "AutogradCPU")
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1)
    def step(t): dist.all_reduce(t)
    def train(n):
        for _ in range(n): step(t)
    def nest(depth, fn): return fn() if depth == 0 else nest(depth - 1, fn)
    def measure():
        train(2000); best = []
        for _ in range(5):
            t0 = time.perf_counter_ns(); train(5000)
            best.append((time.perf_counter_ns() - t0) / 5000 / 1000)
        return min(best)
    print(nest(int(os.environ.get("NEST", "14")), measure))
    dist.destroy_process_group()
    """
)

HARVEST = textwrap.dedent(
    """
    import os, pickle, time, torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    for _ in range(2500): dist.all_reduce(torch.ones(1))
    from flightrec.recorder.native import harvest as native_harvest
    dump = torch._C._distributed_c10d._dump_fr_trace
    for stacks in (False, True):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            with native_harvest._no_inductor_import():
                raw = dump(includeCollectives=True, includeStackTraces=stacks, onlyActive=False)
            t1 = time.perf_counter()
            pickle.loads(raw)
            times.append((t1 - t0, time.perf_counter() - t1))
        best = min(times)
        print(f"stacks={stacks}: dump {best[0]*1e3:.1f} ms, unpickle {best[1]*1e3:.1f} ms")
    t0 = time.perf_counter()
    h = native_harvest.harvest(16)
    print(f"harvest(16) of {len(h.ops)} entries: {(time.perf_counter() - t0)*1e3:.1f} ms")
    dist.destroy_process_group()
    """
)

MODES = {
    "bare": {"TORCH_FR_BUFFER_SIZE": "0"},
    "native": {},
    "bare, deep": {"TORCH_FR_BUFFER_SIZE": "0", "NEST": "60"},
    "native, deep": {"NEST": "60"},
    "flightrec only": {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1"},
    "flightrec+native": {"FLIGHTREC": "1"},
    "dispatcher": {"TORCH_FR_BUFFER_SIZE": "0", "BENCH_DISPATCH": "1"},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str], tmp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(PORT=str(_port()), FLIGHTREC_DIR=tmp, **extra)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        loop = Path(tmp) / "loop.py"
        loop.write_text(LOOP)
        results: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode, extra in MODES.items():
                out = subprocess.run(
                    [sys.executable, str(loop)], env=_env(extra, tmp), capture_output=True,
                    text=True, timeout=600,
                )  # fmt: skip
                try:
                    results[mode].append(float(out.stdout.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    print(f"{mode}: failed\n{out.stderr[-800:]}", file=sys.stderr)
        base = statistics.median(results["bare"])
        print(f"{'mode':18s} {'median':>8s} {'added':>8s} {'min':>7s}  (us per call)")
        for mode, values in results.items():
            if not values:
                continue
            med = statistics.median(values)
            ref = statistics.median(results["bare, deep"]) if "deep" in mode else base
            print(f"{mode:18s} {med:8.2f} {med - ref:+8.2f} {min(values):7.2f}")
        harvest = Path(tmp) / "harvest.py"
        harvest.write_text(HARVEST)
        out = subprocess.run(
            [sys.executable, str(harvest)], env=_env({}, tmp), capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        print(out.stdout.strip() or out.stderr[-800:])


if __name__ == "__main__":
    main()
