"""Lining PyTorch's native ring up with flightrec's at dump time (see ``harvest``)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import OBJECT_API, EntryValues, FrameTuple
from flightrec.format.slot import Slot
from flightrec.recorder.hooks import ddp
from flightrec.recorder.native.harvest import (
    MATCH_SLACK_NS,
    Harvest,
    NativeOp,
    harvest,
    torch_dir,
)


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
    bucket_groups: frozenset[str] = frozenset(),
) -> Merged:
    """One entry per collective, numbered by the ProcessGroup (see the module docstring).

    Args:
        slots: flightrec's ring, decoded, oldest first.
        harvested: the native ring.
        group_names: flightrec group index -> torch group name.
        strings: the recorder's string table (thread, op and device names of slots).
        group_index: the dump's group index for a native entry's group (registering it).
        symbolize: a slot's stack index -> its frames.
        bucket_groups: groups of DDP models on DDP's own C++ hook (``ddp.bucket_groups``):
            their native-only all-reduces issued during a backward pass get ``DDP_BUCKET``.
    """
    ops = harvested.ops
    names = _Names(group_names, strings)
    matched = match(slots, ops, names.group_of, names.thread_of)
    timed, dropped = _ours(slots, ops, matched, names, symbolize)
    used = {j for js in matched.values() for j in js}
    timed += _native_only(ops, used, group_index, bucket_groups)
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


Timed = tuple[int, int, Slot | EntryValues]
"""(time, 0 for flightrec's entries or 1 for native-only ones, the row): sorted, the dump's
order."""


@dataclass(frozen=True, slots=True)
class _Names:
    """A slot's group, thread and other strings, by the recorder's tables."""

    group_names: Sequence[str]
    strings: Sequence[str]

    def group_of(self, s: Slot) -> str:
        return self.group_names[s.group] if s.group < len(self.group_names) else ""

    def text(self, index: int) -> str:
        return self.strings[index] if index < len(self.strings) else ""

    def thread_of(self, s: Slot) -> str:
        return self.text(s.thread)


def _ours(
    slots: Sequence[Slot],
    ops: Sequence[NativeOp],
    matched: dict[int, list[int]],
    names: _Names,
    symbolize: Callable[[int], Sequence[FrameTuple]],
) -> tuple[list[Timed], dict[int, int]]:
    """flightrec's entries, renumbered by the native entries they caused; and per group, the
    entries older than torch's ring (they cannot be numbered)."""
    covered = {op.group for op in ops if not op.is_p2p}
    oldest: dict[str, int] = {}  # per group, when torch's oldest entry of it was created
    for op in ops:
        if not op.is_p2p:
            oldest[op.group] = min(oldest.get(op.group, op.created_ns), op.created_ns)
    timed: list[Timed] = []
    dropped: dict[int, int] = defaultdict(int)
    for i, s in enumerate(slots):
        js = matched.get(i)
        if s.flags & pb.IS_P2P:
            timed.append((s.enqueue_ns, 0, s))  # flightrec's per-peer numbering stays
        elif js is None:
            name = names.group_of(s)
            if name not in covered:
                timed.append((s.enqueue_ns, 0, s))
            elif s.enqueue_ns >= oldest.get(name, 0):
                # Within torch's window yet unmatched: the call never reached the ProcessGroup
                # (it raised on the way in, a wrong-size buffer say). It stands where the group's
                # next number would have gone, which is what its peers' call there holds.
                before = [o.seq for o in ops if o.group == name and o.created_ns <= s.enqueue_ns]
                timed.append((s.enqueue_ns, 0, s._replace(seq=max(before, default=0) + 1)))
            else:
                dropped[s.group] += 1  # older than torch's ring: cannot be numbered
        elif len(js) == 1:
            timed.append((s.enqueue_ns, 0, s._replace(seq=ops[js[0]].seq)))
        else:  # an object collective: the collectives torch ran for it, with its context
            timed += _object_rows(s, [ops[j] for j in js], names, symbolize)
    return timed, dropped


def _object_rows(
    s: Slot,
    inner: Sequence[NativeOp],
    names: _Names,
    symbolize: Callable[[int], Sequence[FrameTuple]],
) -> list[Timed]:
    """An object collective's entry as the collectives torch ran for it (all done but the
    last, which carries the entry's state)."""
    stack = tuple(symbolize(s.stack))
    rows: list[Timed] = []
    for k, op in enumerate(inner):
        last = k == len(inner) - 1
        row = EntryValues(
            record_id=s.record_id, group=s.group, op=op.op, seq=op.seq,
            reduce_op=names.text(s.reduce_op), peer=s.peer,
            state=s.state if last else pb.COMPLETED,
            enqueue_ns=op.created_ns, complete_ns=s.complete_ns if last else 0,
            thread=names.thread_of(s), stack=stack, inputs=op.inputs, outputs=op.outputs,
            flags=s.flags, device=names.text(s.device),
        )  # fmt: skip
        rows.append((op.created_ns, 0, row))
    return rows


def _native_only(
    ops: Sequence[NativeOp],
    used: set[int],
    group_index: Callable[[NativeOp], int],
    bucket_groups: frozenset[str],
) -> list[Timed]:
    """The native collectives no flightrec entry caused (funcol, C++, DDP's buckets)."""
    rows: list[Timed] = []
    for j, op in enumerate(ops):
        if j in used or op.is_p2p:
            continue
        bucket = op.group in bucket_groups and is_ddp_bucket(op)
        row = EntryValues(
            record_id=0, group=group_index(op), op=op.op, seq=op.seq, state=op.state,
            enqueue_ns=op.created_ns, complete_ns=op.complete_ns, thread=op.thread,
            stack=op.stack, inputs=op.inputs, outputs=op.outputs,
            device="cpu" if op.backend == "gloo" else "", flags=pb.DDP_BUCKET if bucket else 0,
        )  # fmt: skip
        rows.append((op.created_ns, 1, row))
    return rows


@dataclass(frozen=True, slots=True)
class _Unresolved:
    """Stands for a group torch no longer resolves by name (destroyed): name only."""

    group_name: str
    group_desc: str


_unresolved: dict[str, _Unresolved] = {}


def is_ddp_bucket(op: NativeOp) -> bool:
    """An all-reduce DDP's reducer issued: from C++ during a backward pass, so its Python stack
    runs through torch's autograd (CPU tensors: the engine runs on the calling thread), or it
    came from a thread Python does not know (an autograd device thread). Asked only of a DDP
    model's group."""
    if op.op != "all_reduce":
        return False
    # torch's own autograd folder, where torch is installed (a user's folder named ``torch``
    # holds no autograd engine).
    autograd = f"{torch_dir()}autograd{os.sep}"
    return not op.python_thread or any(file.startswith(autograd) for file, _, _ in op.stack)


def group_named(groups: Any, name: str, desc: str = "", unresolved: bool = True) -> Any:
    """The registry's ``GroupInfo`` of torch's group ``name``, registering a group seen first
    here (a destroyed one by name only; with ``unresolved`` False, none: None)."""
    for info in groups.groups:
        if info.name == name:
            return info
    pg: Any = None
    try:
        import torch.distributed.distributed_c10d as c10d

        pg = c10d._resolve_process_group(name)  # type: ignore[attr-defined, arg-type]
    except Exception:
        pg = None
    if pg is None:
        if not unresolved:
            return None
        pg = _unresolved.setdefault(name, _Unresolved(name, desc))
    return groups.get(pg)


def _group_index(groups: Any, op: NativeOp) -> int:
    """The registry index of a native entry's group, registering a group seen first here."""
    return int(group_named(groups, op.group, op.desc).index)


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
            ddp.bucket_groups(),
        )
    except Exception as exc:
        recorder.internal_error("merging PyTorch's native Flight Recorder", exc)
        return None
