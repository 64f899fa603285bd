"""Cost of the flightrec recorder, measured as a user measures it, and of one dump.

The per-call figure is the user's harness of issue 15 (``user_loop.py``: a 1-element
``all_reduce`` on a 1-rank gloo group, called as ``step(t)`` from a training loop 16 frames
deep), each run a fresh process with the package as installed (the interpreter running this
script: run it with the virtual environment's python) and tracing turned on the way users turn
it on, ``FLIGHTREC=1`` in the environment. Modes, interleaved round by round so that load on a
shared machine hits them alike; each mode's figure is the median over its processes:

  a  untraced: PyTorch's recorder off (TORCH_FR_BUFFER_SIZE=0), flightrec off
  b  PyTorch's recorder at its default (on)
  u  FLIGHTREC=1 and nothing else, as users turn it on: PyTorch's recorder stays at its
     default (flightrec reads it at dump time), so u - b is what turning flightrec on costs
  c  flightrec, 16-frame stacks (PyTorch's recorder off)
  d  flightrec, no stacks (FLIGHTREC_STACK_DEPTH=0)
  e  as c, without the black box (FLIGHTREC_BLACKBOX=0)
  p  as c, on the pure-Python hot path (the C extension not used): what the extension saves

The differences to the untraced mode come with a 95% bootstrap interval (the processes of each
mode resampled): where the loop's wake-ups are slow, fresh processes scatter by several µs,
more than the hooks cost, and ``--rounds 30`` narrows the interval to about ±1 µs.

Then the hooks alone, paired in one process (``paired_loop.py``): batches of the same loop
through the traced function and through torch's original alternate in one ``FLIGHTREC=1``
process, so load on a shared machine hits both alike; median per-round difference, over a few
processes. Where fresh processes scatter by several µs, this figure holds within a fraction.
Also with the collective one helper deeper (``HELPER=1``: its caller's caller is a new
activation at every call, which the first stack cache cannot key on).

``--ddp``: steps per second of a DDP model on 4 gloo ranks (``ddp_steps.py``; ``--ddp-model``
small or wide): untraced, FLIGHTREC=1 (flightrec's Python DDP hook, the default) and
FLIGHTREC=1 FLIGHTREC_DDP_HOOK=0 (DDP keeps its C++ hook), interleaved; median, range and
per-round ratios. ``--ddp-only`` runs just that. ``ddp_hook_cost.py`` prices the hook per
bucket, paired in one process.

Then the dump: a full 2,000-entry ring with 16-frame stacks from several call sites, dumped
several times; median wall time and file size.

With ``--instructions`` (needs valgrind), instead: instructions per call counted by callgrind
for torch's call alone and with each hot path, a figure other processes cannot disturb. The
first call from the measured loop's call site walks and interns its stack (about 1.4M
instructions, once per call site and caller frame, as in any training loop: 140 per call over
10,000 calls), so each mode runs twice, with ``--calls`` and twice as many calls, and the
per-call figure is the difference over the extra calls: what every call costs, without what
happens once.

``--source`` puts this checkout first on the path instead of the installed package.

Run: ``python benchmarks/bench_recorder.py [--rounds N] [--ddp] [--instructions]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPTH = 18
SOURCE = False
"""--source: children import this checkout instead of the installed package."""
HERE = Path(__file__).resolve().parent
PURE_PYTHON = (
    "import runpy, sys; import flightrec.recorder.hooks.codegen as c; c.USE_FAST = False; "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)
"""Runs a script with the pure-Python hot path: set before torch.distributed is imported, when
the start-up hook generates the wrappers."""
_FR = {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1"}
MODES = {
    "a": ("untraced (TORCH_FR_BUFFER_SIZE=0)", {"TORCH_FR_BUFFER_SIZE": "0"}),
    "b": ("PyTorch's recorder on (its default)", {}),
    "u": ("FLIGHTREC=1 alone (PyTorch's recorder on)", {"FLIGHTREC": "1"}),
    "c": ("flightrec, 16-frame stacks", {**_FR, "FLIGHTREC_STACK_DEPTH": "16"}),
    "d": ("flightrec, FLIGHTREC_STACK_DEPTH=0", {**_FR, "FLIGHTREC_STACK_DEPTH": "0"}),
    "e": ("flightrec, 16-frame stacks, no black box", {**_FR, "FLIGHTREC_BLACKBOX": "0"}),
    "p": ("flightrec, 16-frame stacks, pure Python", {**_FR, "FLIGHTREC_STACK_DEPTH": "16"}),
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
    from flightrec.recorder import runtime
    from flightrec.recorder.hooks import codegen
    from flightrec.recorder.hooks.specs import spec_for

    rt = runtime.current()
    assert rt is not None
    saved, codegen.USE_FAST = codegen.USE_FAST, False
    try:
        return codegen.generate(
            spec_for("all_reduce", rt.hooks.originals["all_reduce"]), fn, rt.recorder
        )
    finally:
        codegen.USE_FAST = saved


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


def _run_child(args: list[str], env_extra: dict[str, str], tmp: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))}
    env.update(env_extra)
    env["FLIGHTREC_DIR"] = tmp
    if SOURCE:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
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

    def step(t):  # type: ignore[no-untyped-def]
        fn(t)  # a new caller frame at every call, as in the user's harness

    def loop() -> None:
        for _ in range(calls):
            step(t)

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
            if SOURCE:
                env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
            total = {}
            for n in (calls, 2 * calls):
                out = subprocess.run(
                    ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                     "--toggle-collect=_ctypes_callproc", f"--callgrind-out-file={tmp}/cg.{mode}",
                     sys.executable, __file__, "--child", f"instr-{mode}", "--calls", str(n)],
                    env=env, capture_output=True, text=True,
                )  # fmt: skip
                found = re.findall(r"I\s+refs:\s+([\d,]+)", out.stderr)
                if not found:
                    raise RuntimeError(f"callgrind run {mode} failed: {out.stderr[-2000:]}")
                total[n] = int(found[-1].replace(",", ""))
            counts[mode] = (total[2 * calls] - total[calls]) / calls
            print(f"  {label:<52} {counts[mode]:9,.0f} instructions/call", flush=True)
    base = counts["torch"]
    for mode in ("c", "c0", "python"):
        print(f"  {INSTRUCTION_MODES[mode][0]} adds {counts[mode] - base:7,.0f} "
              f"({(counts[mode] - base) / base:.0%} of torch's call)")  # fmt: skip


def _script(script: str, env_extra: dict[str, str], tmp: str, pure: bool = False) -> float:
    """The number a fresh process running ``script`` prints (retried: torch 2.13's gloo
    teardown occasionally aborts at exit, after the figure was printed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))}
    env.update(env_extra, FLIGHTREC_DIR=tmp, PORT=str(_free_port()))
    if SOURCE:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
    cmd = [sys.executable, "-c", PURE_PYTHON] if pure else [sys.executable]
    for _ in range(3):
        out = subprocess.run(
            [*cmd, str(HERE / script), env["PORT"]], env=env, capture_output=True, text=True
        )
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        try:
            return float(lines[-1])
        except (IndexError, ValueError):
            env["PORT"] = str(_free_port())
    raise RuntimeError(f"{script} failed ({out.returncode}): {out.stderr[-2000:]}")


def _hot_path() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "from flightrec.recorder.hooks import codegen; print(codegen.USE_FAST)"],
        capture_output=True, text=True,
        env={**os.environ, **({"PYTHONPATH": str(ROOT)} if SOURCE else {})},
        # As the measured scripts run: from benchmarks/, so that ``-c`` does not import the
        # checkout in the working folder (unbuilt in a fresh clone) instead of the package.
        cwd=HERE,
    )  # fmt: skip
    built = out.stdout.strip() == "True"
    return "C extension built" if built else "C extension NOT built (c-e are pure Python too)"


def harness(rounds: int, tmp: str) -> dict[str, float]:
    """Per-call µs of the user's harness in every mode, printed; returns the medians."""
    results: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode, (_, env) in MODES.items():
            results[mode].append(_script("user_loop.py", env, tmp, pure=mode == "p"))
    med = {m: statistics.median(v) for m, v in results.items()}
    best = {m: min(v) for m, v in results.items()}
    print(f"user harness (benchmarks/user_loop.py): all_reduce(1 element), 1-rank gloo, "
          f"16 frames deep; median of {rounds} interleaved fresh processes per mode; "
          f"{'this checkout' if SOURCE else 'installed package'}, {_hot_path()}")  # fmt: skip
    # Load from other processes only ever adds time: the fastest process of each mode is the
    # figure least distorted on a busy machine, shown beside the median.
    print(f"  {'mode':<44} {'us/call':>8} {'added':>7}   {'fastest':>7} {'added':>7}   processes")
    for mode, (label, _) in MODES.items():
        spread = ", ".join(f"{x:.1f}" for x in results[mode])
        added = "" if mode == "a" else f"{med[mode] - med['a']:+7.2f}"
        added_best = "" if mode == "a" else f"{best[mode] - best['a']:+7.2f}"
        print(f"  ({mode}) {label:<40} {med[mode]:8.2f} {added:>7}   {best[mode]:7.2f} "
              f"{added_best:>7}   [{spread}]")  # fmt: skip
    torch_cost, fr_cost = med["b"] - med["a"], med["c"] - med["a"]
    print(f"  flightrec with stacks adds {fr_cost:.2f} us/call (target <= 1.00), PyTorch's "
          f"recorder {torch_cost:.2f} us/call: "
          f"{'less' if fr_cost < torch_cost else 'NOT less'} than PyTorch's recorder")  # fmt: skip
    print(f"  as users turn it on (u - b): FLIGHTREC=1 adds {med['u'] - med['b']:.2f} us/call to "
          f"a default torch, {med['u'] - med['a']:.2f} over the untraced call")  # fmt: skip
    print(f"  C hot path against pure Python (p - c): {med['p'] - med['c']:+.2f} us/call")
    # Fresh processes scatter by more than the hooks cost where the loop's wake-ups are slow:
    # how far each difference of medians could move with other draws of the same processes.
    for mode, what in (("c", "flightrec with stacks"), ("b", "PyTorch's recorder")):
        lo, hi = median_difference_interval(results[mode], results["a"])
        print(f"  {what} adds {med[mode] - med['a']:+.2f} us/call, 95% bootstrap interval "
              f"{lo:+.2f} to {hi:+.2f} ({rounds} processes per mode)")  # fmt: skip
    return med


def median_difference_interval(
    x: list[float], y: list[float], draws: int = 2000
) -> tuple[float, float]:
    """95% bootstrap interval of median(x) - median(y), resampling each list's processes."""
    rng = random.Random(0)
    diffs = sorted(
        statistics.median(rng.choices(x, k=len(x))) - statistics.median(rng.choices(y, k=len(y)))
        for _ in range(draws)
    )
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


def paired(rounds: int, tmp: str) -> None:
    """The hooks' cost per call measured within one process (``paired_loop.py``), with and
    without stacks, and on the pure-Python path."""
    print("flightrec's hooks alone, paired in one process (paired_loop.py, FLIGHTREC=1, "
          f"PyTorch's recorder at its default): median per-round difference, {rounds} processes")  # fmt: skip
    for label, env, pure in (
        ("16-frame stacks", {"FLIGHTREC": "1"}, False),
        ("no stacks (FLIGHTREC_STACK_DEPTH=0)", {"FLIGHTREC": "1", "FLIGHTREC_STACK_DEPTH": "0"}, False),
        ("16-frame stacks, one helper deeper", {"FLIGHTREC": "1", "HELPER": "1"}, False),
        ("16-frame stacks, pure-Python path", {"FLIGHTREC": "1"}, True),
    ):  # fmt: skip
        got = [_script("paired_loop.py", env, tmp, pure=pure) for _ in range(rounds)]
        spread = ", ".join(f"{x:+.2f}" for x in got)
        print(f"  {label:<40} {statistics.median(got):+6.2f} us/call   [{spread}]", flush=True)


def ddp(rounds: int, tmp: str, model: str = "small") -> None:
    """Steps/s of a 4-rank gloo DDP model (``ddp_steps.py``, ``DDP_MODEL=model``): untraced,
    ``FLIGHTREC=1`` (flightrec's Python DDP hook, the default) and ``FLIGHTREC=1
    FLIGHTREC_DDP_HOOK=0`` (DDP keeps its C++ hook; PyTorch's recorder sees its all-reduces),
    interleaved, printed with each mode's spread and the per-round ratios (rounds run back to
    back, so a change of machine load shifts all three alike)."""
    modes = {
        "off": {},
        "on (DDP hook)": {"FLIGHTREC": "1"},
        "on, DDP_HOOK=0": {"FLIGHTREC": "1", "FLIGHTREC_DDP_HOOK": "0"},
    }
    rates: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, env in modes.items():
            rates[name].append(_script("ddp_steps.py", {**env, "DDP_MODEL": model}, tmp))
    print(f"DDP, 4 gloo ranks on this machine, {model} model, {rounds} interleaved runs each "
          "(slowest rank's steps/s)")  # fmt: skip
    for name, v in rates.items():
        print(f"  FLIGHTREC {name:<20}: median {statistics.median(v):7.1f} steps/s, range "
              f"{min(v):.1f}-{max(v):.1f}  [{', '.join(f'{x:.1f}' for x in v)}]")  # fmt: skip
    for name in list(modes)[1:]:
        ratios = [on / off - 1 for on, off in zip(rates[name], rates["off"], strict=True)]
        print(f"  {name} / off, per round: median {statistics.median(ratios):+.1%}  "
              f"[{', '.join(f'{r:+.1%}' for r in ratios)}]")  # fmt: skip


def main() -> None:
    global SOURCE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="processes per mode")
    parser.add_argument("--ddp", action="store_true", help="also DDP steps/s on 4 gloo ranks")
    parser.add_argument("--ddp-rounds", type=int, default=5)
    parser.add_argument("--ddp-only", action="store_true", help="only the DDP steps/s")
    parser.add_argument("--ddp-model", choices=["small", "wide"], default="small")
    parser.add_argument("--source", action="store_true", help="import this checkout")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per call with valgrind (deterministic on a busy machine)",
    )
    parser.add_argument("--calls", type=int, default=10000, help="calls under callgrind")
    children = ["dump", *(f"instr-{m}" for m in INSTRUCTION_MODES)]
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=2000)
    opts = parser.parse_args()
    SOURCE = opts.source
    if opts.child and opts.child.startswith("instr-"):
        return child_instructions(opts.child.removeprefix("instr-"), opts.calls)
    if opts.child == "dump":
        return child_dump(opts.entries)
    if opts.instructions:
        print(f"instructions per all_reduce(1 element), 1-rank gloo, {DEPTH} frames deep, "
              f"under callgrind: the difference between {opts.calls} and {2 * opts.calls} calls, "
              f"per call")  # fmt: skip
        return instructions(opts.calls)
    if opts.ddp_only:
        with tempfile.TemporaryDirectory() as tmp:
            return ddp(opts.ddp_rounds, tmp, opts.ddp_model)
    with tempfile.TemporaryDirectory() as tmp:
        harness(opts.rounds, tmp)
        paired(max(3, opts.rounds // 3), tmp)
        if opts.ddp:
            ddp(opts.ddp_rounds, tmp, opts.ddp_model)
        dump = _run_child(
            ["--child", "dump", "--entries", str(opts.entries)],
            {"TORCH_FR_BUFFER_SIZE": "0", "FLIGHTREC": "1", "FLIGHTREC_BUFFER": str(opts.entries)},
            tmp,
        )
    print(f"dump of a full {opts.entries}-entry ring with stacks: "
          f"{dump['ms']:.1f} ms (target <= 100), {dump['bytes'] / 1000:.0f} KB (target <= 300)")  # fmt: skip


if __name__ == "__main__":
    main()
