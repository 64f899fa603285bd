"""Recording one call, in Python: the definition, and the fallback where the C path is not built.

``PyPath.enter`` runs before torch's function and writes the call's ENQUEUED entry; ``leave``
runs after it returned and marks the entry complete (or hands it to completion tracking);
``write`` is the entry itself, which ``batch_isend_irecv`` also uses, once per operation.
Both read and write a ``HotState`` (``state.py``) only, never the recorder; the slot itself is
written by the ring's ``append`` and ``finish`` (``ring.py``), the one Python definition of a
slot write, which the ring's own tests exercise too.
``_fast.c`` implements the same ``enter``/``leave`` in C for single-tensor collectives on
cache hits, and returns -1 where this one must decide (misses fill the caches it reads); the
tests run one suite against both (tests/integration/test_recorder_fast.py).

The contract, for both: ``enter(op, flags, group, tensor_in, tensor_out, red, root,
group_root, async_op, frame)``:

- ``op``: string index of the operation; ``flags``: its constant EntryFlag bits (IS_P2P and
  SEND for point-to-point, whose entries take the per-peer counter instead of the group's);
- ``tensor_in`` / ``tensor_out``: the tensor arguments (a tensor, a list, None), or the int 0
  where the function has no such argument;
- ``red``: the reduce op, or the int 0 where the function has none;
- ``root``: the root or peer as a global rank, or None; ``group_root``: the same as a rank
  within the group (used when ``root`` is None);
- ``async_op``: the argument (True for functions that are always asynchronous);
- ``frame``: the caller's frame, or None without stacks.

It returns the record id (> 0), or 0 when the call is not recorded: tracing is off, the
call is made inside a recorded one (object collectives call others), or the arguments are
not what torch takes (torch then runs and raises its own error).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from flightrec.format.builder import IS_P2P, SEND
from flightrec.format.slot import COMPLETED, ENQUEUED

if TYPE_CHECKING:
    from types import FrameType

    from flightrec.recorder.hotpath.groups import GroupInfo
    from flightrec.recorder.hotpath.state import HotState

_ident = threading.get_ident
_now = time.monotonic_ns


class Chunk:
    """One peer's rows of an all_to_all_single buffer, as the recorder sees a tensor: its
    shape, dtype and device (no view is made)."""

    __slots__ = ("device", "dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any, device: Any) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device


def split(tensor: Any, sizes: Any) -> Any:
    """``tensor`` as one chunk per peer where split sizes are given; else ``tensor`` itself
    (even splits, or arguments torch will reject: recorded as passed)."""
    if not sizes:
        return tensor
    try:
        rest = tuple(tensor.shape[1:])
        dtype, device = tensor.dtype, tensor.device
        return [Chunk((int(n), *rest), dtype, device) for n in sizes]
    except Exception:
        return tensor


class PyPath:
    """The recorder's Python path (one per recorder: ``Recorder.path``), the C ``FastPath``'s
    twin: both are built over the same ``HotState``."""

    def __init__(self, state: HotState, tensor_type: Any) -> None:
        self.state = state
        self.tensor_type: Any = tensor_type
        """``torch.Tensor``: a single tensor goes through the per-group (shape, dtype) cache,
        anything else (lists, None) through the signature table."""
        # The state's fields the hot path reads on every call, bound once (an attribute of
        # this object is one lookup; one of the state's, two).
        self.by_pg = state.by_pg
        self.active = state.active
        self.threads = state.threads
        self.tcaches = state.tcaches
        self.reds = state.reds
        self.append = state.ring.append
        self.finish = state.ring.finish
        self.depth = state.depth

    def enter(
        self,
        op: int,
        flags: int,
        group: Any,
        tensor_in: Any,
        tensor_out: Any,
        red: Any,
        root: Any,
        group_root: Any,
        async_op: Any,
        frame: FrameType | None,
    ) -> int:
        """Write the call's ENQUEUED entry; its record id, or 0 when not recorded."""
        tid = _ident()
        if not self.state.enabled or tid in self.active:
            return 0
        try:
            info = self.by_pg.get(group) or self.state.group(group)
            if info is None:
                return 0
            rid = self.write(
                info, tid, op, flags | (1 if async_op else 0), tensor_in, tensor_out, red,
                self.peer(info, root, group_root), self.stack(frame, tid),
            )  # fmt: skip
        except Exception:
            # Not recorded (a rank outside the group, or arguments torch will reject): torch
            # runs, once, and raises its own error if there is one.
            return 0
        self.active[tid] = rid
        return rid

    def leave(self, rid: int, result: Any, async_op: Any, group: Any) -> None:
        """The call returned: a synchronous CPU call is complete now (unless the ring already
        reused its slot); async and GPU calls go to the state's ``settle``."""
        self.active.pop(_ident(), None)
        info = self.by_pg.get(group)
        if info is None:
            return  # the group left the cache: the entry stays as recorded
        if async_op or info.gpu:
            self.state.settle(rid, result, bool(async_op), info)
            return
        self.finish(rid, COMPLETED, _now())  # unless other threads overwrote it meanwhile

    def write(
        self,
        info: GroupInfo,
        tid: int,
        op: int,
        flags: int,
        tensor_in: Any,
        tensor_out: Any,
        red: Any,
        peer: int,
        stack: int,
    ) -> int:
        """One ENQUEUED entry in the ring (``flags`` complete, async bit included); its id.

        Everything that can fail runs before the sequence number and the record id are
        taken, so a call that is not recorded leaves no gap in either.
        """
        t0 = _now()
        sig_in, dev = self.tensors(info, tensor_in)
        if tensor_out is tensor_in:
            sig_out = sig_in
        else:
            sig_out, dev_out = self.tensors(info, tensor_out)
            dev = dev or dev_out  # the input may be an empty or absent list (gather)
        red_i = red if type(red) is int else (self.reds.get(red) or self.state.red(red))
        thread = self.threads.get(tid)
        if thread is None:
            thread = self.state.thread(tid)
        if flags & IS_P2P:
            seq, p2p = 0, info.next_p2p(peer, bool(flags & SEND))
        else:
            # The ProcessGroup's own number where torch counts calls flightrec never sees.
            seq = next(info.counter) if info.counter.source is None else info.next_seq()
            p2p = 0
        # Through Ring.append, the one definition of a slot. With Ring.finish in ``leave``, the
        # two calls cost this path about 1,100 instructions per call more than packing inline
        # (callgrind, bench_recorder.py's harness: 80.1K against 79.0K per all_reduce, 1.4%);
        # the C path, where it is built, does not take them.
        return self.append(
            t0, ENQUEUED, seq, p2p, info.index, op, red_i, peer, thread, stack, sig_in, sig_out,
            dev, flags,
        )  # fmt: skip

    def tensors(self, info: GroupInfo, value: Any) -> tuple[int, int]:
        """(signature index, device index) of a tensor argument; (0, 0) where there is none."""
        if type(value) is int:
            return 0, 0
        if isinstance(value, self.tensor_type):
            spec = info.specs.get((value.shape, value.dtype))
            return spec if spec is not None else self.state.spec(info, value)
        return self.state.sig(value), self.state.device(value)

    @staticmethod
    def peer(info: GroupInfo, root: Any, group_root: Any) -> int:
        """The root or peer as a global rank; -1 when there is none."""
        if root is not None:
            return int(root)
        if group_root is not None and 0 <= group_root < len(info.ranks):
            return int(info.ranks[group_root])
        return -1

    def stack(self, frame: FrameType | None, tid: int) -> int:
        """The stack index of the call made from ``frame``; 0 without stacks."""
        if frame is None or not self.depth:
            return 0
        cache = self.tcaches.get(tid)
        if cache is not None and cache.top is frame and cache.top_lasti == frame.f_lasti:
            return int(cache.top_index)  # same caller at the same line as last time
        return self.state.stack(frame, tid)
