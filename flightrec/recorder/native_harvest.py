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
  native P2P entries flightrec did not issue are not added (torch issues none from C++).

Nothing here may raise into the job: ``harvest`` returns None on any failure (one warning).
``NativeWatch`` lets the watchdog see hangs in collectives only the native recorder saw, from
torch's per-group counters (``pg_status``), polled once a second.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import pickle
import sys
import threading
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import OBJECT_API, EntryValues, FrameTuple, TensorTuple
from flightrec.format.native_names import SEND_RECV, dtype_name, parse_profiling_name
from flightrec.format.slot import Slot

log = logging.getLogger("flightrec")

MAX_NATIVE_FRAMES = 64
"""Frames kept of a native stack: torch's own frames lead it, the program's follow."""
MATCH_SLACK_NS = 5_000
"""Tolerance of the wall-to-monotonic conversion (two clock reads, microseconds apart)."""
_TORCH_DIR = ""


def _torch_dir() -> str:
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
    torch_dir = _torch_dir()
    out: list[FrameTuple] = []
    lead = 0
    for f in frames[:MAX_NATIVE_FRAMES]:
        if not isinstance(f, dict):
            continue
        file, name, line = f.get("filename"), f.get("name"), f.get("line")
        if not isinstance(file, str) or not isinstance(name, str) or not isinstance(line, int):
            continue
        if len(out) == lead and file.startswith(torch_dir):
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


# -- merging ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Merged:
    """The dump's entries after merging, oldest first, with per-group corrections."""

    rows: list[Slot | EntryValues]
    """flightrec entries (``Slot``, seq replaced by the ProcessGroup's) and native-only
    entries (``EntryValues``, group set to the dump's group index)."""
    last_seq: dict[int, int] = field(default_factory=dict)
    """Group index -> the ProcessGroup's last sequence number seen, where harvested."""
    dropped: dict[int, int] = field(default_factory=dict)
    """Group index -> collectives of the group not in the dump, where harvested."""


def _windows(slots: Sequence[Slot], thread_of: Callable[[Slot], str]) -> list[int]:
    """Per slot: the enqueue time of the same thread's next flightrec entry (or a far end)."""
    end = [1 << 62] * len(slots)
    last: dict[str, int] = {}
    for i, s in enumerate(slots):
        t = thread_of(s)
        prev = last.get(t)
        if prev is not None:
            end[prev] = s.enqueue_ns
        last[t] = i
    return end


def match(
    slots: Sequence[Slot],
    ops: Sequence[NativeOp],
    group_of: Callable[[Slot], str],
    thread_of: Callable[[Slot], str],
) -> dict[int, list[int]]:
    """Which native entries each flightrec entry caused: slot position -> op positions.

    Per (thread, group), native entries are taken in order; a flightrec entry takes the first
    one created inside its window (after its enqueue, before its completion and before its
    thread's next flightrec entry), or all of them for an object collective. Native entries
    of threads that ended before the dump cannot be told apart by thread: a flightrec entry
    that finds none of its own thread's looks among those, with the same window.
    """
    queues: dict[tuple[str, str, bool], list[int]] = defaultdict(list)
    for j, op in enumerate(ops):
        queues[(op.thread if op.python_thread else "", op.group, op.is_p2p)].append(j)
    for queue in queues.values():
        queue.sort(key=lambda j: (ops[j].created_ns, ops[j].record_id))
    heads: dict[tuple[str, str, bool], int] = defaultdict(int)
    ends = _windows(slots, thread_of)
    out: dict[int, list[int]] = {}
    for i in sorted(range(len(slots)), key=lambda i: slots[i].record_id):
        s = slots[i]
        lo = s.enqueue_ns - MATCH_SLACK_NS
        hi = ends[i]
        if s.complete_ns:
            hi = min(hi, s.complete_ns + MATCH_SLACK_NS)
        p2p = bool(s.flags & pb.IS_P2P)
        for key in ((thread_of(s), group_of(s), p2p), ("", group_of(s), p2p)):
            q = queues.get(key)
            if not q:
                continue
            h = heads[key]
            while h < len(q) and ops[q[h]].created_ns < lo:
                h += 1  # native-only entries before this one (funcol, C++): not ours
            taken: list[int] = []
            j = h
            while j < len(q) and ops[q[j]].created_ns < hi:
                taken.append(q[j])
                j += 1
                if not s.flags & OBJECT_API:
                    break
            # Own thread: what was passed over is known not to be ours. Ended threads' queue:
            # move on only past what was taken (the rest may be another thread's).
            if key[0] or taken:
                heads[key] = j
            if taken:
                out[i] = taken
                break
    return out


def merge(
    slots: Sequence[Slot],
    harvested: Harvest,
    group_names: Sequence[str],
    strings: Sequence[str],
    group_index: Callable[[NativeOp], int],
    symbolize: Callable[[int], Sequence[FrameTuple]],
) -> Merged:
    """One entry per collective, numbered by the ProcessGroup (see the module docstring).

    Args:
        slots: flightrec's ring, decoded, oldest first.
        harvested: the native ring.
        group_names: flightrec group index -> torch group name.
        strings: the recorder's string table (thread, op and device names of slots).
        group_index: the dump's group index for a native entry's group (registering it).
        symbolize: a slot's stack index -> its frames.
    """
    ops = harvested.ops

    def group_of(s: Slot) -> str:
        return group_names[s.group] if s.group < len(group_names) else ""

    def text(index: int) -> str:
        return strings[index] if index < len(strings) else ""

    def thread_of(s: Slot) -> str:
        return text(s.thread)

    matched = match(slots, ops, group_of, thread_of)
    used = {j for js in matched.values() for j in js}
    covered = {op.group for op in ops if not op.is_p2p}
    timed: list[tuple[int, int, Slot | EntryValues]] = []
    dropped: dict[int, int] = defaultdict(int)
    for i, s in enumerate(slots):
        js = matched.get(i)
        if s.flags & pb.IS_P2P:
            timed.append((s.enqueue_ns, 0, s))  # flightrec's per-peer numbering stays
        elif js is None:
            if group_of(s) in covered:
                dropped[s.group] += 1  # numbered by flightrec alone: cannot be placed
            else:
                timed.append((s.enqueue_ns, 0, s))
        elif len(js) == 1:
            timed.append((s.enqueue_ns, 0, s._replace(seq=ops[js[0]].seq)))
        else:  # an object collective: the collectives torch ran for it, with its context
            stack = tuple(symbolize(s.stack))
            for k, j in enumerate(js):
                op, last = ops[j], k == len(js) - 1
                row = EntryValues(
                    record_id=s.record_id, group=s.group, op=op.op, seq=op.seq,
                    reduce_op=text(s.reduce_op), peer=s.peer,
                    state=s.state if last else pb.COMPLETED,
                    enqueue_ns=op.created_ns, complete_ns=s.complete_ns if last else 0,
                    thread=thread_of(s), stack=stack, inputs=op.inputs, outputs=op.outputs,
                    flags=s.flags, device=text(s.device),
                )  # fmt: skip
                timed.append((op.created_ns, 0, row))
    for j, op in enumerate(ops):
        if j in used or op.is_p2p:
            continue
        row = EntryValues(
            record_id=0, group=group_index(op), op=op.op, seq=op.seq, state=op.state,
            enqueue_ns=op.created_ns, complete_ns=op.complete_ns, thread=op.thread,
            stack=op.stack, inputs=op.inputs, outputs=op.outputs,
            device="cpu" if op.backend == "gloo" else "",
        )  # fmt: skip
        timed.append((op.created_ns, 1, row))
    timed.sort(key=lambda t: (t[0], t[1]))
    merged = Merged(rows=[row for _, _, row in timed])
    numbered = {group_index(op) for op in ops if not op.is_p2p}  # torch's numbering
    firsts: dict[int, int] = {}
    for r in merged.rows:
        if r.seq and not r.flags & pb.IS_P2P and r.group in numbered:
            firsts.setdefault(r.group, r.seq)
            merged.last_seq[r.group] = max(merged.last_seq.get(r.group, 0), r.seq)
    for g, first in firsts.items():
        merged.dropped[g] = first - 1 if harvested.wrapped else dropped.get(g, 0)
    return merged


# -- the watchdog's view of native-only collectives ----------------------------------------------


class NativeWatch:
    """Spots a collective only the native recorder saw that stays incomplete too long.

    torch keeps, per process group, the last collective enqueued and the last completed
    (``pg_status``); reading them is one small JSON without entries. A group whose enqueued
    counter stays ahead of its completed one, unchanged, for ``timeout_s`` is hung.
    """

    POLL_NS = 1_000_000_000

    def __init__(self, timeout_s: float, enabled: bool = True) -> None:
        self.timeout_ns = int(timeout_s * 1e9)
        self._next_poll = 0
        self._pending: dict[str, tuple[tuple[int, int], int]] = {}
        """pg id -> ((last completed, last enqueued), monotonic time they were first seen)."""
        self._reported: set[tuple[str, int]] = set()
        """(pg id, last enqueued) already looked into."""
        self._off = not enabled

    def poll(self, now_ns: int) -> str | None:
        """At most once a second: a description of a newly hung collective, else None."""
        if self._off or now_ns < self._next_poll:
            return None
        self._next_poll = now_ns + self.POLL_NS
        status = self._status()
        if status is None:
            return None
        found = None
        for pg, st in status.items():
            try:
                enq = int(st.get("last_enqueued_collective", -1))
                done = int(st.get("last_completed_collective", -1))
            except (TypeError, ValueError, AttributeError):
                continue
            if enq <= done:
                self._pending.pop(pg, None)
                continue
            seen = self._pending.get(pg)
            if seen is None or seen[0] != (done, enq):  # moved: its clock starts again
                self._pending[pg] = ((done, enq), now_ns)
                continue
            if now_ns - seen[1] >= self.timeout_ns and (pg, enq) not in self._reported:
                self._reported.add((pg, enq))
                pending = self._confirm(pg, enq)
                if pending is not None and found is None:
                    seq, op, group = pending
                    found = (
                        f"{op} on group {group} seq {seq} (seen by PyTorch's recorder) "
                        f"incomplete for over {self.timeout_ns / 1e9:g}s"
                    )
        return found

    def _confirm(self, pg: str, enqueued: int) -> tuple[int, str, str] | None:
        """(seq, op, group name) of the oldest unfinished native entry of ``pg``, if any.

        The counters alone can lie: gloo's worker threads store "last completed" without
        ordering, so a slow thread can set it back below a collective that did finish. The
        entries (read only when the counters look stuck) say which one is really unfinished.
        """
        data = self._json(include_entries=True)
        for e in (data or {}).get("entries") or []:
            if not isinstance(e, dict) or str(e.get("pg_id")) != pg or e.get("is_p2p"):
                continue
            done = e.get("retired") or e.get("state") == "completed"
            seq = int(e.get("collective_seq_id") or 0)
            if not done and 0 < seq <= enqueued:
                _, op, _, _ = parse_profiling_name(str(e.get("profiling_name") or ""))
                name = (e.get("process_group") or ("?",))[0]
                return seq, op, str(name)
        return None

    def _status(self) -> dict[str, dict[str, Any]] | None:
        data = self._json(include_entries=False)
        status = (data or {}).get("pg_status") or {}
        return status if isinstance(status, dict) else None

    def _json(self, include_entries: bool) -> dict[str, Any] | None:
        try:
            from torch._C import _distributed_c10d as c10d

            fn = getattr(c10d, "_dump_fr_trace_json", None)
            if fn is None:
                self._off = True
                return None
            data = json.loads(fn(includeCollectives=include_entries, onlyActive=True))
            return data if isinstance(data, dict) else None
        except Exception as exc:
            self._off = True
            log.warning("flightrec: hangs in collectives issued outside Python go unseen: %s", exc)
            return None


# -- the recorder's side -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Unresolved:
    """Stands for a group torch no longer resolves by name (destroyed): name only."""

    group_name: str
    group_desc: str


_unresolved: dict[str, _Unresolved] = {}


def _group_index(groups: Any, op: NativeOp) -> int:
    """The registry index of a native entry's group, registering a group seen first here."""
    for info in groups.groups:
        if info.name == op.group:
            return int(info.index)
    pg: Any = None
    try:
        import torch.distributed.distributed_c10d as c10d

        pg = c10d._resolve_process_group(op.group)  # type: ignore[attr-defined, arg-type]
    except Exception:
        pg = None
    if pg is None:
        pg = _unresolved.setdefault(op.group, _Unresolved(op.group, op.desc))
    return int(groups.get(pg).index)


def harvest_and_merge(recorder: Any, slots: Sequence[Slot]) -> Merged | None:
    """The dump's entries merged with the native ring; None when there is none to merge.

    Registers the groups only the native recorder saw in ``recorder.groups``, so the caller
    must copy the group list after this. Never raises.
    """
    if not recorder.config.native:
        return None
    h = harvest(recorder.config.stack_depth)
    if h is None:
        return None
    try:
        groups = recorder.groups
        names = [g.name for g in groups.groups]
        return merge(
            slots,
            h,
            names,
            list(recorder.strings.values),
            lambda op: _group_index(groups, op),
            recorder.stacks.symbolize,
        )
    except Exception as exc:
        recorder.internal_error("merging PyTorch's native Flight Recorder", exc)
        return None
