"""The recorder's live state and its hot path: one ring entry per user-level call.

``Recorder.call`` runs on every traced torch.distributed call. It reads the arguments by
position, interns what repeats (group, op, tensors, stack, thread) through dict lookups, writes
one binary slot, calls torch, and marks the slot finished. Only the outermost call of a thread
is recorded (``all_gather_object`` shows up once, not as its inner all_gathers), so the
sequence numbers agree across ranks whatever the object collectives do inside.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from flightrec.builder import COALESCED, IS_P2P, SEND
from flightrec.recorder import completion
from flightrec.recorder.config import Config
from flightrec.recorder.groups import GroupInfo, GroupRegistry
from flightrec.recorder.ring import COMPLETED, ENQUEUED, FAILED, Ring
from flightrec.recorder.specs import OpSpec
from flightrec.recorder.stacks import StackTable
from flightrec.recorder.tables import StringTable, TensorTable

log = logging.getLogger("flightrec")
_now = time.monotonic_ns
_ident = threading.get_ident


def _first_tensor(value: Any) -> Any:
    while value is not None and not hasattr(value, "device"):
        if not value:
            return None
        value = value[0]
    return value


def _reduce_name(op: Any) -> str:
    name = getattr(op, "name", None)
    return str(name) if name else str(op).rsplit(".", 1)[-1]


class Recorder:
    """Everything one process records: the ring, the intern tables, the group counters."""

    def __init__(self, config: Config) -> None:
        import torch.distributed.distributed_c10d as c10d

        self.config = config
        self.ring = Ring(config.buffer)
        self.strings = StringTable()
        self.tensors = TensorTable()
        self.stacks = StackTable()
        self.groups = GroupRegistry()
        self.active: dict[int, int] = {}
        """Thread ident -> record id of the call it is inside (reentrancy guard + holds_recorder)."""
        self.enabled = True
        self.depth = config.stack_depth
        self._threads: dict[int, int] = {}
        self._world = c10d._world
        self._non_member = c10d.GroupMember.NON_GROUP_MEMBER
        self.tracker = completion.Tracker(self)
        self.on_first_use: Callable[[], None] = lambda: None
        """Started once, at the first recorded call: the watchdog and the dump-request poller."""
        self._used = False
        self.on_error: Callable[[int, BaseException], None] = lambda rid, exc: None
        """Called (never raising) when a recorded call fails: the dumper hooks in here."""

    # -- interning helpers (a dict hit on the hot path, a locked insert on a miss) ----------
    def thread_index(self, ident: int) -> int:
        idx = self._threads.get(ident)
        if idx is None:
            name = threading.current_thread().name
            idx = self.strings.of(("thread", name), lambda: name)
            self._threads[ident] = idx
        return idx

    def forget_thread_names(self) -> None:
        """Thread idents are reused; a dump refreshes the ident -> name cache."""
        self._threads = {}

    def _group(self, pg: Any) -> GroupInfo:
        info = self.groups.by_pg.get(pg)
        return info if info is not None else self.groups.get(pg)

    def _device(self, tensors: Any) -> int:
        t = _first_tensor(tensors)
        if t is None:
            return 0
        dev = t.device
        return self.strings.of(dev, lambda: str(dev))

    def _start(self) -> None:
        self._used = True
        try:
            self.on_first_use()
        except Exception as exc:  # never into the job
            log.warning("flightrec: could not start the watchdog: %s", exc)

    # -- the hot path -----------------------------------------------------------------------
    def call(
        self, spec: OpSpec, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Record one traced call and run it; the result or exception is torch's, unchanged."""
        ident = _ident()
        if not self.enabled or ident in self.active:
            return orig(*args, **kwargs)
        pg = spec.group.get(args, kwargs)
        if pg is None:
            pg = self._world.default_pg
            if pg is None:  # not initialized: let torch raise its own error
                return orig(*args, **kwargs)
        elif pg is self._non_member:
            return orig(*args, **kwargs)
        if not self._used:
            self._start()
        enqueue = _now()
        info = self._group(pg)
        inputs = spec.inputs.get(args, kwargs)
        outputs = spec.outputs.get(args, kwargs)
        peer = spec.root.get(args, kwargs)
        if peer is None:
            group_peer = spec.group_root.get(args, kwargs)
            peer = (
                info.ranks[group_peer]
                if group_peer is not None and group_peer < len(info.ranks)
                else -1
            )
        flags = spec.flags
        if flags & IS_P2P:
            seq = 0
            p2p_seq = info.next_p2p(peer, bool(flags & SEND))
        else:
            seq = info.next_seq()
            p2p_seq = 0
        red = spec.reduce_op.get(args, kwargs)
        strings = self.strings
        is_async = spec.always_async or bool(spec.async_op.get(args, kwargs))
        if is_async:
            flags |= 1  # ASYNC_OP
        rid = self.ring.append(
            enqueue,
            ENQUEUED,
            seq,
            p2p_seq,
            info.index,
            strings.of(spec.name, lambda: spec.name),
            0 if red is None else strings.of(red, lambda: _reduce_name(red)),
            peer,
            self.thread_index(ident),
            self.stacks.capture(sys._getframe(2), self.depth) if self.depth else 0,
            self.tensors.of(inputs),
            self.tensors.of(outputs),
            self._device(inputs if inputs is not None else outputs),
            flags,
        )
        info.recorded += 1
        self.active[ident] = rid
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            self.active.pop(ident, None)
            self.ring.finish(rid, FAILED, _now())
            if isinstance(exc, Exception):
                self.on_error(rid, exc)
            raise
        self.active.pop(ident, None)
        if is_async:
            if result is not None:
                self.tracker.track(rid, result, info.backend)
        elif info.backend == "nccl" or "cuda" in info.backend:
            # A synchronous NCCL call is only enqueued on its stream when it returns.
            self.tracker.track_stream(rid)
        else:
            self.ring.finish(rid, COMPLETED, _now())
        return result

    def call_batch(
        self,
        orig: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        canon: Callable[[Any], None],
    ) -> Any:
        """``batch_isend_irecv``: one COALESCED P2P entry per operation of the batch."""
        ident = _ident()
        ops = args[0] if args else kwargs.get("p2p_op_list")
        if not self.enabled or ident in self.active or not ops:
            return orig(*args, **kwargs)
        for op in ops:
            canon(op)
        if not self._used:
            self._start()
        enqueue = _now()
        rids: list[int] = []
        name_send = self.strings.of("isend", lambda: "isend")
        name_recv = self.strings.of("irecv", lambda: "irecv")
        stack = self.stacks.capture(sys._getframe(2), self.depth) if self.depth else 0
        thread = self.thread_index(ident)
        for op in ops:
            pg = op.group if op.group is not None else self._world.default_pg
            if pg is None or pg is self._non_member:
                return orig(*args, **kwargs)
            info = self._group(pg)
            send = getattr(op.op, "__name__", "") == "isend"
            peer = op.peer if op.peer is not None else -1
            if (
                peer == -1
                and getattr(op, "group_peer", None) is not None
                and op.group_peer < len(info.ranks)
            ):
                peer = info.ranks[op.group_peer]
            flags = IS_P2P | COALESCED | 1 | (SEND if send else 0)
            rid = self.ring.append(
                enqueue, ENQUEUED, 0, info.next_p2p(peer, send), info.index,
                name_send if send else name_recv, 0, peer, thread, stack,
                self.tensors.of(op.tensor) if send else 0,
                0 if send else self.tensors.of(op.tensor),
                self._device(op.tensor), flags,
            )  # fmt: skip
            info.recorded += 1
            rids.append(rid)
        self.active[ident] = rids[0]
        try:
            works = orig(*args, **kwargs)
        except BaseException as exc:
            self.active.pop(ident, None)
            now = _now()
            for rid in rids:
                self.ring.finish(rid, FAILED, now)
            if isinstance(exc, Exception):
                self.on_error(rids[0], exc)
            raise
        self.active.pop(ident, None)
        if works:
            backend = info.backend
            if len(works) == len(rids):
                for rid, work in zip(rids, works, strict=True):
                    self.tracker.track(rid, work, backend)
            else:  # one coalesced work for the whole batch (NCCL)
                self.tracker.track_many(rids, works[0], backend)
        return works
