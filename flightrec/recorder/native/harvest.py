"""PyTorch's native Flight Recorder, read in this process at dump time and merged into the dump.

flightrec's hooks see what Python calls through ``torch.distributed``'s functions. Much of a
modern job's communication never passes there: functional collectives (DTensor, tensor
parallelism), ``torch.compile`` graphs, DDP's C++ reducer (builtin comm hooks, the extra
all-reduce of ``find_unused_parameters``), C++ extensions. PyTorch's own recorder sees all of
it, because it records inside the ProcessGroup, and in torch 2.13 it is on by default
(``TORCH_FR_BUFFER_SIZE``, 2,000 entries) for gloo and NCCL alike.

So nothing is added on the hot path: at dump time, ``harvest`` asks torch for this process's
native ring (``_dump_fr_trace``, a pickle of plain containers that this process wrote itself,
so it is trusted) and ``merge`` lines it up with flightrec's ring:

* Both rings are per process and ordered. Each flightrec entry was issued by one thread on one
  group; the native entry (or entries, for object collectives) it caused was recorded by the
  same thread, on the same group, after flightrec's enqueue time and before that thread's
  next flightrec entry (and before the entry completed, when it did). Native times are wall
  clock; they are moved onto the monotonic clock with the offset measured at dump time.
* A matched flightrec entry keeps everything flightrec knows (stack, state, completion time,
  reduce op, root) and takes the ProcessGroup's sequence number (``collective_seq_id``): one
  entry per collective, numbered as torch numbers it, so flightrec dumps and native dumps of
  one job agree. An object collective expands into the collectives torch actually ran.
* A native entry nobody matched was issued where flightrec's hooks do not reach; it is added
  with the native recorder's Python stack (the calling thread's frames, taken by torch) and
  state (gloo: ``retired`` means finished).
* A flightrec collective with no native entry is older than the native ring (or never
  reached the ProcessGroup); its own counter cannot be mixed with torch's, so it is left out
  and counted in its group's ``dropped``. P2P entries keep flightrec's per-peer numbering;
  native P2P entries flightrec did not issue are not added (gloo records none).

This module reads torch's ring; ``merge`` lines it up with flightrec's, and
``watch`` lets the watchdog see hangs only torch's counters show. Nothing here may
raise into the job: ``harvest`` returns None on any failure (one warning).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import pickle
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import FrameTuple, TensorTuple
from flightrec.format.native_names import SEND_RECV, dtype_name, parse_profiling_name

log = logging.getLogger("flightrec")

MAX_NATIVE_FRAMES = 64
"""Frames kept of a native stack: torch's own frames lead it, the program's follow."""
MATCH_SLACK_NS = 5_000
"""Tolerance of the wall-to-monotonic conversion (two clock reads, microseconds apart)."""
_TORCH_DIR = ""


def torch_dir() -> str:
    """The folder torch is installed in, ending in a separator."""
    global _TORCH_DIR
    if not _TORCH_DIR:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return _TORCH_DIR


@dataclass(frozen=True, slots=True)
class NativeOp:
    """One entry of the native ring, in flightrec's terms. Times are monotonic ns."""

    record_id: int
    pg_id: int
    group: str
    """torch's group name (``ProcessGroup.group_name``): the same on every rank."""
    desc: str
    seq: int
    """``collective_seq_id``: the ProcessGroup's own counter; 0 for P2P."""
    is_p2p: bool
    op: str
    backend: str
    local_src: int
    local_dst: int
    created_ns: int
    complete_ns: int
    state: int
    thread: str
    """The issuing thread's Python name where it is still alive, else the OS name."""
    python_thread: bool
    """``thread`` is a live Python thread's name (else it ended, or torch's C++ threads)."""
    inputs: tuple[TensorTuple, ...]
    outputs: tuple[TensorTuple, ...]
    stack: tuple[FrameTuple, ...]


@dataclass(slots=True)
class Harvest:
    """This process's native ring at dump time."""

    ops: list[NativeOp]
    wrapped: bool
    """The native ring overwrote older entries: flightrec entries before ``ops[0]`` are out
    of its window."""


def _dump_function() -> Callable[..., Any] | None:
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return None
        from torch._C import _distributed_c10d as c10d

        return getattr(c10d, "_dump_fr_trace", None)
    except Exception:
        return None


def _wall_to_mono() -> int:
    """Offset to add to a CLOCK_REALTIME time (c10::getTime) to get time.monotonic_ns()."""
    best = None
    for _ in range(3):  # the pair read closest together
        a = time.monotonic_ns()
        w = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2 - w)
    assert best is not None
    return best[1]


def _stack(frames: object, depth: int) -> tuple[FrameTuple, ...]:
    if not depth or not isinstance(frames, list):
        return ()
    root = torch_dir()
    out: list[FrameTuple] = []
    lead = 0
    for f in frames[:MAX_NATIVE_FRAMES]:
        if not isinstance(f, dict):
            continue
        file, name, line = f.get("filename"), f.get("name"), f.get("line")
        if not isinstance(file, str) or not isinstance(name, str) or not isinstance(line, int):
            continue
        if len(out) == lead and file.startswith(root):
            lead += 1
        out.append((file, name, line))
    # Like flightrec's own stacks, ``depth`` frames of the program; torch's lead comes free.
    return tuple(out[: lead + depth])


def _tensors(sizes: object, dtypes: object) -> tuple[TensorTuple, ...]:
    if type(sizes) is not list or type(dtypes) is not list:
        return ()
    out: list[TensorTuple] = []
    for shape, dtype in zip(sizes, dtypes, strict=False):
        if type(shape) is list or type(shape) is tuple:
            name = _DTYPE_NAMES.get(dtype)
            if name is None:
                name = _DTYPE_NAMES.setdefault(dtype, dtype_name(str(dtype)))
            out.append((tuple(shape), name))
    return tuple(out)


_DTYPE_NAMES: dict[object, str] = {}


def _state(entry: dict[str, Any], backend: str, completed: int) -> int:
    state = str(entry.get("state") or "")
    if state == "completed" or completed:
        return pb.COMPLETED
    # gloo records no start or end events: a work is retired when it finished (or failed).
    if backend == "gloo" and entry.get("retired"):
        return pb.COMPLETED
    return pb.STARTED if state == "started" else pb.ENQUEUED


def _op(entry: dict[str, Any], offset: int, names: dict[int, str], depth: int) -> NativeOp:
    backend, op, src, dst = parse_profiling_name(str(entry.get("profiling_name") or ""))
    pg = entry.get("process_group") or ("", "")
    is_p2p = bool(entry.get("is_p2p")) or op in SEND_RECV
    done = entry.get("time_discovered_completed_ns") or 0
    try:
        ident = int(str(entry.get("thread_id") or "0"))
    except ValueError:
        ident = 0
    return NativeOp(
        record_id=int(entry.get("record_id") or 0),
        pg_id=int(entry.get("pg_id") or 0),
        group=str(pg[0]),
        desc=str(pg[1]) if len(pg) > 1 else "",
        seq=0 if is_p2p else int(entry.get("collective_seq_id") or 0),
        is_p2p=is_p2p,
        op=op,
        backend=backend,
        local_src=src,
        local_dst=dst,
        created_ns=int(entry.get("time_created_ns") or 0) + offset,
        complete_ns=done + offset if done else 0,
        state=_state(entry, backend, done),
        thread=names.get(ident) or str(entry.get("thread_name") or ""),
        python_thread=ident in names,
        inputs=_tensors(entry.get("input_sizes"), entry.get("input_dtypes")),
        outputs=_tensors(entry.get("output_sizes"), entry.get("output_dtypes")),
        stack=_stack(entry.get("frames"), depth),
    )


class _InductorNotLoaded(types.ModuleType):
    """Stands in for ``torch._inductor`` while torch symbolizes native stacks.

    torch's symbolizer looks up ``torch._inductor.codecache`` to expand frames of compiled
    code; where inductor was never imported, that lookup imports it (about 5 s, with the GIL
    held). No compiled code means no such frames: the lookup is answered "absent" instead.
    torch releases the GIL while it dumps, so another thread may meet this object: any other
    attribute imports the real module and forwards, as ``torch._inductor`` itself would.
    """

    def __getattr__(self, name: str) -> Any:
        if name == "codecache" and "torch._inductor" not in sys.modules:
            raise AttributeError(name)
        return getattr(importlib.import_module("torch._inductor"), name)


@contextlib.contextmanager
def _no_inductor_import() -> Iterator[None]:
    import torch

    if "torch._inductor" in sys.modules or "_inductor" in vars(torch):
        yield
        return
    stub = _InductorNotLoaded("torch._inductor")
    vars(torch)["_inductor"] = stub
    try:
        yield
    finally:
        if vars(torch).get("_inductor") is stub:  # a real import meanwhile replaced it
            del vars(torch)["_inductor"]


_warned = False


def harvest(stack_depth: int) -> Harvest | None:
    """This process's native ring, or None when torch has none (off, too old) or it failed.

    Args:
        stack_depth: program frames kept per native stack (FLIGHTREC_STACK_DEPTH); 0: none.
    """
    global _warned
    dump = _dump_function()
    if dump is None:
        return None
    try:
        with _no_inductor_import():
            raw = dump(
                includeCollectives=True, includeStackTraces=stack_depth > 0, onlyActive=False
            )
        data = pickle.loads(raw)  # written by this very process: trusted
        entries = data.get("entries") or []
        if not entries:
            return None
        offset = _wall_to_mono()
        names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        # Thousands of small objects, none cyclic: without this, the collector's full passes
        # over a torch process's heap take most of the time (0.45 s -> 0.1 s for 2,000).
        collecting = gc.isenabled()
        gc.disable()
        try:
            ops = [_op(e, offset, names, stack_depth) for e in entries if isinstance(e, dict)]
        finally:
            if collecting:
                gc.enable()
        return Harvest(ops, wrapped=bool(ops) and ops[0].record_id > 0)
    except Exception as exc:  # never into the job: the dump goes on with flightrec's ring
        if not _warned:
            _warned = True
            log.warning("flightrec: could not read PyTorch's native Flight Recorder: %s", exc)
        return None
