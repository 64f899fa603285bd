"""Cost of the flightrec recorder on the hot path, and of one dump.

Per-call time of a 1-element ``all_reduce`` on a 1-rank gloo group, called from 18 frames
deep (a realistic training-loop depth), in four modes:

  a  PyTorch's C++ flight recorder off (TORCH_FR_BUFFER_SIZE=0), flightrec off
  b  PyTorch's recorder at its default (on),                      flightrec off
  c  flightrec on, 16-frame stacks,                               PyTorch's recorder off
  d  flightrec on, no stacks (FLIGHTREC_STACK_DEPTH=0),           PyTorch's recorder off
  e  as c, with the black box off (FLIGHTREC_BLACKBOX=0: the ring in memory, not in a
     memory-mapped file): c against e is what the black box costs

Then the black box alone, in one process: the recording work of two recorders, one writing
into the memory-mapped file and one into memory, in interleaved batches.

Each measurement is a separate process; processes of the four modes are interleaved so that
drift on a shared machine hits every mode alike. Each process reports the median of its
batches; the figure per mode is the median over its processes. flightrec is turned on the way
users turn it on, with FLIGHTREC=1 in the child's environment.

Then the dump: a full 2,000-entry ring with 16-frame stacks from several call sites, dumped
several times; median wall time and file size.

With ``--instructions`` (needs valgrind), instead: instructions per call counted by callgrind
for torch's call alone and with each hot path, a figure other processes cannot disturb.

Run: ``python benchmarks/bench_recorder.py [--rounds N] [--calls N] [--instructions]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPTH = 18
MODES = {
    "a": ("torch FR off, flightrec off", {"TORCH_FR_BUFFER_SIZE": "0"}),
    "b": ("torch FR on (default), flightrec off", {}),
    "c": ("flightrec on (16-frame stacks), torch FR off",
          {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1", "FLIGHTREC_STACK_DEPTH": "16"}),
    "d": ("flightrec on (no stacks), torch FR off",
          {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1", "FLIGHTREC_STACK_DEPTH": "0"}),
    "e": ("flightrec on (16-frame stacks), no black box",
          {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1", "FLIGHTREC_STACK_DEPTH": "16",
           "FLIGHTREC_BLACKBOX": "0"}),
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init() -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )


def _finish() -> None:
    # An undestroyed gloo group sometimes aborts the interpreter at exit (torch 2.13).
    import torch.distributed as dist

    dist.destroy_process_group()


def _at_depth(depth: int, fn, *args):  # type: ignore[no-untyped-def]
    """Call ``fn`` with ``depth`` more frames on the stack."""
    if depth <= 0:
        return fn(*args)
    return _at_depth(depth - 1, fn, *args)


def _python_path(fn):  # type: ignore[no-untyped-def]
    """``fn`` wrapped like the installed wrapper, but on the pure-Python hot path (what runs
    where the C extension is not built), recording into the same recorder."""
    from flightrec.recorder import codegen, runtime
    from flightrec.recorder.specs import spec_for

    rt = runtime.current()
    assert rt is not None
    saved, codegen.USE_FAST = codegen.USE_FAST, False
    try:
        return codegen.generate(
            spec_for("all_reduce", rt.hooks.originals["all_reduce"]), fn, rt.recorder
        )
    finally:
        codegen.USE_FAST = saved


def _fast_built() -> bool:
    from flightrec.recorder import codegen

    return codegen.USE_FAST


def _calls(n: int, batches: int) -> dict[str, list[float]]:
    """Per-call µs of batches through ``dist.all_reduce``; with flightrec on, each batch is
    paired with one through torch's original function (and, where the C hot path is built,
    one through a pure-Python-path wrapper), so the difference of a pair is flightrec's cost
    under the same machine load (the machine may be shared)."""
    import torch
    import torch.distributed as dist

    original = getattr(dist.all_reduce, "__flightrec_original__", None)
    t = torch.ones(1)
    fns = {"traced": dist.all_reduce}
    if original is not None:
        fns["original"] = original
        if _fast_built():
            fns["python"] = _python_path(original)
    out: dict[str, list[float]] = {name: [] for name in fns}
    out.update({f"{name}_cpu": [] for name in fns})
    for _ in range(batches):
        for name, fn in fns.items():
            cpu = time.thread_time_ns()
            start = time.perf_counter_ns()
            for _ in range(n):
                fn(t)
            out[name].append((time.perf_counter_ns() - start) / n / 1000)
            # The calling thread's CPU time: what recording adds there, without the time
            # this thread spent preempted by other processes on a shared machine.
            out[f"{name}_cpu"].append((time.thread_time_ns() - cpu) / n / 1000)
    return out


def _noop(tensor, op=None, group=None, async_op=False):  # type: ignore[no-untyped-def]
    """A collective that does nothing, with all_reduce's signature (``op``'s default is set
    to torch's ReduceOp.SUM below: with None, every call would intern a new reduce-op name
    and time the recorder's slow path instead of its hot path)."""
    return None


def _with_torch_defaults() -> None:
    import torch.distributed as dist

    _noop.__defaults__ = (dist.ReduceOp.SUM, None, False)


def _recording_cost(wrapped, t, calls: int = 2000) -> float:  # type: ignore[no-untyped-def]
    """µs per call of ``wrapped`` (generated around ``_noop``) minus ``_noop`` itself: the
    recording work alone. The two loops run back to back, so they share the machine's load."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        wrapped(t)
    mid = time.perf_counter_ns()
    for _ in range(calls):
        _noop(t)
    return ((mid - start) - (time.perf_counter_ns() - mid)) / calls / 1000


def _noop_cost(batches: int, python_path: bool = False) -> float:
    """µs the recording itself takes: a wrapper generated for a no-op with all_reduce's
    signature, minus the no-op. Nothing else runs between calls, so caches stay warm."""
    import torch

    from flightrec.recorder import runtime
    from flightrec.recorder.codegen import generate
    from flightrec.recorder.specs import spec_for

    rt = runtime.current()
    assert rt is not None

    if python_path:
        wrapped = _python_path(_noop)
    else:
        spec = spec_for("all_reduce", rt.hooks.originals["all_reduce"])
        wrapped = generate(spec, _noop, rt.recorder)
    t = torch.ones(1)
    return statistics.median(_recording_cost(wrapped, t) for _ in range(batches))


def child_calls(calls: int) -> None:
    _init()
    _with_torch_defaults()
    # Frames: this one + _at_depth chain + _calls = DEPTH frames under the module level.
    _at_depth(DEPTH - 3, _calls, 500, 2)  # warm-up
    got = _at_depth(DEPTH - 3, _calls, 500, max(1, calls // 500))
    med = {name: statistics.median(v) for name, v in got.items()}
    result = {"us": med["traced"]}
    if "original" in med:
        pairs = list(zip(got["traced"], got["original"], strict=True))
        result["paired_us"] = statistics.median(a - b for a, b in pairs)
        pairs = list(zip(got["traced_cpu"], got["original_cpu"], strict=True))
        result["paired_cpu_us"] = statistics.median(a - b for a, b in pairs)
        result["noop_us"] = _at_depth(DEPTH - 3, _noop_cost, 10)
        result["fast"] = _fast_built()
        if "python" in got:
            pairs = list(zip(got["python"], got["original"], strict=True))
            result["paired_py_us"] = statistics.median(a - b for a, b in pairs)
            pairs = list(zip(got["python_cpu"], got["original_cpu"], strict=True))
            result["paired_py_cpu_us"] = statistics.median(a - b for a, b in pairs)
            result["noop_py_us"] = _at_depth(DEPTH - 3, _noop_cost, 10, True)
    print(json.dumps(result), flush=True)
    _finish()


def _site_a(t):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    dist.all_reduce(t)


def _site_b(t):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    dist.broadcast(t, 0)


def _site_c(t):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    dist.all_reduce(t, async_op=True).wait()


def child_dump(entries: int) -> None:
    import torch

    import flightrec

    _init()
    shapes = [torch.ones(n) for n in (1, 8, 64, 1024)]
    sites = (_site_a, _site_b, _site_c)
    for i in range(entries):
        _at_depth(DEPTH - 4 + i % 5, sites[i % 3], shapes[i % 4])
    times, sizes = [], []
    for _ in range(5):
        start = time.perf_counter()
        path = flightrec.dump("benchmark")
        times.append((time.perf_counter() - start) * 1000)
        assert path is not None
        sizes.append(path.stat().st_size)
    print(json.dumps({"ms": statistics.median(times), "bytes": max(sizes)}), flush=True)
    _finish()


def child_blackbox(batches: int) -> None:
    """Same process, interleaved batches: the recording work (no-op collective) of a recorder
    whose ring is the black box's memory-mapped file against one whose ring is in memory."""
    import torch
    import torch.distributed as dist

    from flightrec.recorder.codegen import generate
    from flightrec.recorder.config import Config
    from flightrec.recorder.recorder import Recorder
    from flightrec.recorder.specs import spec_for

    _init()
    _with_torch_defaults()

    spec = spec_for("all_reduce", dist.distributed_c10d.all_reduce)
    wrapped = {}
    for name, on in (("mmap", True), ("memory", False)):
        cfg = Config(enabled=True, directory=os.environ["FLIGHTREC_DIR"], blackbox=on)
        rec = Recorder(cfg)
        assert (rec.blackbox is not None) == on
        wrapped[name] = generate(spec, _noop, rec)
    t = torch.ones(1)
    costs: dict[str, list[float]] = {name: [] for name in wrapped}

    for _ in range(batches):
        for name, fn in wrapped.items():
            costs[name].append(_at_depth(DEPTH - 3, _recording_cost, fn, t))
    print(json.dumps({name: statistics.median(v) for name, v in costs.items()}), flush=True)
    _finish()


def _run_child(args: list[str], env_extra: dict[str, str], tmp: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))}
    env.update(env_extra)
    env["FLIGHTREC_DIR"] = tmp
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, __file__, *args], env=env, capture_output=True, text=True
        )
        # torch 2.13's gloo teardown occasionally aborts at interpreter exit, after the
        # child printed its figure: the figure is still good.
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if lines:
            return dict(json.loads(lines[-1]))
    raise RuntimeError(f"benchmark child failed ({out.returncode}): {out.stderr[-2000:]}")


INSTRUCTION_MODES = {
    "torch": ("torch's all_reduce alone (flightrec off)", {}),
    "c": ("flightrec, C hot path, 16-frame stacks", {"FLIGHTREC": "1"}),
    "c0": ("flightrec, C hot path, no stacks", {"FLIGHTREC": "1", "FLIGHTREC_STACK_DEPTH": "0"}),
    "python": ("flightrec, pure-Python hot path, 16-frame stacks", {"FLIGHTREC": "1"}),
}  # fmt: skip


def child_instructions(mode: str, calls: int) -> None:
    """The measured loop for ``--instructions``: it runs inside a ctypes call, the only code
    callgrind counts (--collect-atstart=no --toggle-collect=_ctypes_callproc)."""
    import ctypes

    import torch
    import torch.distributed as dist

    _init()
    original = getattr(dist.all_reduce, "__flightrec_original__", dist.all_reduce)
    fn = {"torch": original, "c": dist.all_reduce, "c0": dist.all_reduce}.get(mode)
    if mode == "python":
        fn = _python_path(original)
    t = torch.ones(1)
    for _ in range(200):  # caches filled, as in a training loop
        fn(t)

    def loop() -> None:
        for _ in range(calls):
            fn(t)

    ctypes.CFUNCTYPE(None)(lambda: _at_depth(DEPTH - 3, loop))()
    _finish()


def instructions(calls: int) -> None:
    """Instructions per call counted by valgrind's callgrind: deterministic, so unaffected by
    other processes on the machine (wall time is not). Needs valgrind on PATH."""
    import re
    import shutil

    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind")
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, (label, extra) in INSTRUCTION_MODES.items():
            env = {
                k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))
            }
            env.update(extra, TORCH_FR_BUFFER_SIZE="0", FLIGHTREC_DIR=tmp)
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                 "--toggle-collect=_ctypes_callproc", f"--callgrind-out-file={tmp}/cg.{mode}",
                 sys.executable, __file__, "--child", f"instr-{mode}", "--calls", str(calls)],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            found = re.findall(r"I\s+refs:\s+([\d,]+)", out.stderr)
            if not found:
                raise RuntimeError(f"callgrind run {mode} failed: {out.stderr[-2000:]}")
            counts[mode] = int(found[-1].replace(",", "")) / calls
            print(f"  {label:<52} {counts[mode]:9,.0f} instructions/call", flush=True)
    base = counts["torch"]
    for mode in ("c", "c0", "python"):
        print(f"  {INSTRUCTION_MODES[mode][0]} adds {counts[mode] - base:7,.0f} "
              f"({(counts[mode] - base) / base:.0%} of torch's call)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="processes per mode")
    parser.add_argument("--calls", type=int, default=20000, help="measured calls per process")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per call with valgrind (deterministic on a busy machine)",
    )
    children = ["calls", "dump", "blackbox", *(f"instr-{m}" for m in INSTRUCTION_MODES)]
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=2000)
    opts = parser.parse_args()
    if opts.child and opts.child.startswith("instr-"):
        return child_instructions(opts.child.removeprefix("instr-"), opts.calls)
    if opts.instructions:
        print(f"instructions per all_reduce(1 element), 1-rank gloo, {DEPTH} frames deep, "
              f"{min(opts.calls, 1000)} calls under callgrind")  # fmt: skip
        return instructions(min(opts.calls, 1000))
    if opts.child == "calls":
        return child_calls(opts.calls)
    if opts.child == "dump":
        return child_dump(opts.entries)
    if opts.child == "blackbox":
        return child_blackbox(60)

    results: dict[str, list[float]] = {m: [] for m in MODES}
    paired: dict[str, list[float]] = {m: [] for m in MODES}
    noop: dict[str, list[float]] = {m: [] for m in MODES}
    paired_py: dict[str, list[float]] = {m: [] for m in MODES}
    paired_cpu: dict[str, list[float]] = {m: [] for m in MODES}
    paired_py_cpu: dict[str, list[float]] = {m: [] for m in MODES}
    noop_py: dict[str, list[float]] = {m: [] for m in MODES}
    fast = False
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(opts.rounds):
            for mode, (_, env) in MODES.items():
                r = _run_child(["--child", "calls", "--calls", str(opts.calls)], env, tmp)
                results[mode].append(r["us"])
                if "paired_us" in r:
                    paired[mode].append(r["paired_us"])
                    paired_cpu[mode].append(r["paired_cpu_us"])
                    noop[mode].append(r["noop_us"])
                    fast = bool(r["fast"])
                if "paired_py_us" in r:
                    paired_py[mode].append(r["paired_py_us"])
                    paired_py_cpu[mode].append(r["paired_py_cpu_us"])
                    noop_py[mode].append(r["noop_py_us"])
        dump = _run_child(
            ["--child", "dump", "--entries", str(opts.entries)],
            {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1", "FLIGHTREC_BUFFER": str(opts.entries)},
            tmp,
        )
        blackbox = _run_child(["--child", "blackbox"], {"TORCH_FR_BUFFER_SIZE": "0"}, tmp)
    med = {m: statistics.median(v) for m, v in results.items()}
    print(f"per-call time of all_reduce(1 element), 1-rank gloo, {DEPTH} frames deep, "
          f"median of {opts.rounds} interleaved processes x {opts.calls} calls")  # fmt: skip
    for mode, (label, _) in MODES.items():
        spread = ", ".join(f"{x:.2f}" for x in results[mode])
        print(f"  ({mode}) {label:<46} {med[mode]:7.2f} us   [{spread}]")
    torch_cost = med["b"] - med["a"]
    fr_cost = med["c"] - med["a"]
    print(f"  PyTorch recorder adds            {torch_cost:6.2f} us/call  (b - a)")
    print(f"  flightrec with stacks adds       {fr_cost:6.2f} us/call  (c - a; target <= 3.00)")
    print(f"  flightrec without stacks adds    {med['d'] - med['a']:6.2f} us/call  (d - a)")
    if torch_cost > 0:
        print(f"  ratio flightrec / PyTorch recorder: {fr_cost / torch_cost:.2f}")
    print(
        f"  hot path of (c)-(e): {'C extension (flightrec.recorder._fast)' if fast else 'pure Python (C extension not built)'}"
    )
    for mode in ("c", "d", "e"):
        # Same process, alternating batches through the wrapper and through torch's own
        # function: immune to load from other processes, which the cross-process figures
        # are not on a shared machine.
        print(f"  ({mode}) paired in-process cost of flightrec: "
              f"{statistics.median(paired[mode]):6.2f} us/call  "
              f"[{', '.join(f'{x:.2f}' for x in paired[mode])}]; calling thread's CPU time "
              f"{statistics.median(paired_cpu[mode]):5.2f} us/call")  # fmt: skip
    for mode in ("c", "d", "e"):
        print(f"  ({mode}) recording work alone (no-op collective, warm caches): "
              f"{statistics.median(noop[mode]):5.2f} us/call")  # fmt: skip
    if fast:
        for mode in ("c", "d"):
            # The same comparisons for the pure-Python hot path (what runs where the
            # extension is not built), in the same processes.
            print(f"  ({mode}) pure-Python hot path: paired {statistics.median(paired_py[mode]):5.2f} "
                  f"us/call (CPU {statistics.median(paired_py_cpu[mode]):5.2f}), recording work "
                  f"alone {statistics.median(noop_py[mode]):5.2f} us/call")  # fmt: skip
    print(f"black box, same process, recording work alone: ring in a memory-mapped file "
          f"{blackbox['mmap']:.2f} us/call, ring in memory {blackbox['memory']:.2f} us/call")  # fmt: skip
    print(f"dump of a full {opts.entries}-entry ring with stacks: "
          f"{dump['ms']:.1f} ms (target <= 100), {dump['bytes'] / 1000:.0f} KB (target <= 300)")  # fmt: skip


if __name__ == "__main__":
    main()
