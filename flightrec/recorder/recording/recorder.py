"""The recorder's live state: ring, intern tables, group counters, and the slow paths.

The per-call hot path is generated per traced function (``hooks/codegen.py``): it interns
what repeats (group, op, tensors, stack, thread) through dict lookups on the caches of a
``HotState`` (``hotpath/state.py``), writes one binary slot, calls torch, and marks the slot
finished. The state holds this object's caches and, as plain callables, the slow paths
below: a cache miss, async or GPU completion and failure come back here through them only. Only the
outermost call of a thread is recorded (``active`` is the per-thread guard), so
``all_gather_object`` shows up once, not as its inner all_gathers, and sequence numbers agree
across ranks whatever object collectives do inside. ``call_batch`` records
``batch_isend_irecv`` (one entry per operation of the batch).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flightrec.format.builder import COALESCED, IS_P2P, SEND
from flightrec.format.slot import COMPLETED, FAILED, SLOT_SIZE, Slot, decode
from flightrec.recorder.config import Config
from flightrec.recorder.hotpath import layout
from flightrec.recorder.hotpath.counters import new_active
from flightrec.recorder.hotpath.groups import GroupInfo, GroupRegistry
from flightrec.recorder.hotpath.python import PyPath
from flightrec.recorder.hotpath.ring import Ring
from flightrec.recorder.hotpath.state import HotState, c_path
from flightrec.recorder.recording import completion
from flightrec.recorder.recording.blackbox import BlackBox
from flightrec.recorder.recording.snapshot import GroupCounts, Snapshot
from flightrec.recorder.recording.stacks import StackTable
from flightrec.recorder.recording.tables import StringTable, TensorTable

if TYPE_CHECKING:
    from flightrec.recorder.native.merge import Merged

log = logging.getLogger("flightrec")
UNTRACKED = 0
"""``State.STATE_UNKNOWN``: the state of an entry whose completion tracking failed."""
_now = time.monotonic_ns
_ident = threading.get_ident


def _first_tensor(value: Any) -> Any:
    while value is not None and not hasattr(value, "device"):
        if not value:
            return None
        value = value[0]
    return value


def _reduce_name(op: Any) -> str:
    """The name of a RedOpType or ReduceOp object: "SUM", "MAX", "PREMUL_SUM(2)"."""
    inner = getattr(op, "op", None)  # a ReduceOp object wraps a RedOpType
    name = getattr(op, "name", None) or getattr(inner, "name", None)
    if not name:
        return str(op).rsplit(".", 1)[-1]
    if name == "PREMUL_SUM" and inner is not None:
        try:
            factor = op.factor
        except Exception:
            factor = None
        # A tensor factor's value lives on the device: reading it would synchronize the GPU.
        return f"PREMUL_SUM({factor:g})" if isinstance(factor, int | float) else "PREMUL_SUM"
    return str(name)


def _default_group_of(c10d: Any) -> Callable[[], Any]:
    """How to read the default group: torch's private ``_world`` (a plain attribute read)
    where this torch has it, else the public ``GroupMember.WORLD``."""
    world: Any = getattr(c10d, "_world", None)
    try:
        world.default_pg  # noqa: B018 (a property on some releases: probe it)
    except AttributeError:
        return lambda: c10d.GroupMember.WORLD
    except Exception:
        pass  # present, not answering before init_process_group
    return lambda: world.default_pg


_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
RESERVE_MARGIN = 1 << 20
"""Room wanted beyond the ring itself: its header, its tables and a few dumps."""


def _check_room(directory: Path, needed: int) -> None:
    """Refuse (ENOSPC) a folder whose filesystem lacks ``needed`` free bytes.

    Creating the black box writes its header through the memory map before ``_reserve`` can
    run; on a full disk that write is a SIGBUS, so an already full disk is caught here.

    Raises:
        OSError: ENOSPC, with the free space found.
    """
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except (OSError, AttributeError):
        return  # cannot tell: try, as before
    free = st.f_bavail * st.f_frsize
    if free < needed:
        raise OSError(errno.ENOSPC, f"{free} bytes free, the black box needs {needed}")


def _reserve(fd: int) -> None:
    """Allocate every block of the black box now.

    The file is created sparse and written through a memory map: a page first touched when the
    disk has filled up cannot be allocated, and the kernel answers with SIGBUS, which kills the
    training process. Reserved now, a full disk is one OSError at start instead.

    Raises:
        OSError: no room for the file (ENOSPC, EFBIG, EDQUOT).
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # not on this platform: the file stays sparse
        return
    try:
        fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise


def _open_blackbox(config: Config) -> tuple[BlackBox | None, OSError | None]:
    """The on-disk ring (None when off or impossible: one warning), and the OSError if any."""
    if not config.blackbox:
        return None, None
    try:
        _check_room(Path(config.directory), config.buffer * SLOT_SIZE + RESERVE_MARGIN)
        bb = BlackBox(
            config.directory, config.buffer, SLOT_SIZE, config.stack_depth, config.timeout_s
        )
        try:
            _reserve(bb.fd)
        except OSError:
            bb.close(healthy=True)  # deletes its files
            raise
    except OSError as exc:  # a read-only or full disk must not stop the job
        log.warning(
            "flightrec: cannot write to FLIGHTREC_DIR %s (%s): no black box, and dumps are "
            "lost while this lasts (no further warning)",
            config.directory,
            exc,
        )
        return None, exc
    except Exception as exc:
        log.warning("flightrec: black box off (ring kept in memory only): %s", exc)
        return None, None
    return bb, None


class Recorder:
    """Everything one process records: the ring, the intern tables, the group counters.

    Args:
        config: the settings (FLIGHTREC_*).
        on_first_use: started once, at the first recorded call (the watchdog, the poller).
        on_error: told (never raising) of a recorded call that failed, with its record id.
    """

    def __init__(
        self,
        config: Config,
        *,
        on_first_use: Callable[[], None] = lambda: None,
        on_error: Callable[[int, BaseException], None] = lambda rid, exc: None,
    ) -> None:
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.config = config
        self.blackbox, self.dir_error = _open_blackbox(config)
        """``dir_error``: why FLIGHTREC_DIR could not be written at start (already warned)."""
        self.ring = Ring(config.buffer, self.blackbox.slots if self.blackbox else None)
        bb = self.blackbox  # its journal takes every new table entry
        self.strings = StringTable(bb.on_string if bb else None)
        self.tensors = TensorTable(bb.on_tensors if bb else None)
        self.stacks = StackTable(config.stack_depth, bb.on_stack if bb else None)
        self.groups = GroupRegistry(bb.on_group if bb else None)
        self.active: Any = new_active()
        """Thread ident -> record id of the call it is inside (reentrancy guard + holds_recorder);
        a dict, or the C path's ``Active``, which behaves as one."""
        self.depth = config.stack_depth
        self.thread_cache: dict[int, int] = {}
        """Thread ident -> string index of its name (refreshed at each dump)."""
        self._default_group = _default_group_of(c10d)
        self._non_member = c10d.GroupMember.NON_GROUP_MEMBER
        self.tracker = completion.Tracker(self.ring.finish, self._failed, self.internal_error)
        self._fast_path: Any = None
        """The C hot path (``fast_path``), shared by every Site; None until a Site needs it."""
        self._on_first_use = on_first_use
        self._used = False
        self._on_error = on_error
        self._internal_warned = False
        self.hot = HotState(
            ring=self.ring,
            active=self.active,
            depth=self.depth,
            by_pg=self.groups.by_pg,
            threads=self.thread_cache,
            tcaches=self.stacks.threads,
            reds=self.strings.index,
            group=self.group_slow,
            spec=self.spec_slow,
            sig=self.sig,
            device=self.device,
            red=self.red_slow,
            thread=self.thread_index,
            stack=self.stacks.capture,
            raw=self.stacks.raw,
            settle=self.settle,
            fail=self.fail,
        )
        """What the hot path reads and calls (``hotpath.state``), and nothing more."""
        self.path = PyPath(self.hot, torch.Tensor)
        """Recording one call, in Python (``hotpath.python``): the generated wrappers and
        ``batch_isend_irecv`` record through it; the C Sites fall back to it."""

    @property
    def enabled(self) -> bool:
        """Whether calls are recorded (set by ``flightrec.enable``/``disable``, and off in a
        forked child)."""
        return self.hot.enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self.hot.enabled = bool(on)
        if self._fast_path is not None:
            self._fast_path.enabled = int(self.hot.enabled)

    def fast_path(self) -> Any:
        """The recorder's one C ``FastPath`` over ``hot`` (shared by its Sites, so that their
        stack caches are one, purged with the StackTable's at every watchdog tick).

        Raises:
            RuntimeError: the C extension is not built.
        """
        if self._fast_path is None:
            fast = c_path(self.hot)
            if self._used:  # else the first recorded call installs it, once torch is imported
                layout.install(fast)
            self._fast_path = fast
            self.stacks.purgers.append(fast.purge)
        return self._fast_path

    def internal_error(self, where: str, exc: BaseException) -> None:
        """A bug in flightrec itself: the job goes on (its call already ran or runs plain);
        the first one is logged as one warning, later ones are silent."""
        if self._internal_warned:
            return
        self._internal_warned = True
        log.warning(
            "flightrec: internal error in %s (%s: %s); the job goes on, the record may be "
            "incomplete (no further warning)",
            where,
            type(exc).__name__,
            exc,
        )

    # -- interning helpers (a dict hit on the hot path, a locked insert on a miss) ----------
    def thread_index(self, ident: int) -> int:
        idx = self.thread_cache.get(ident)
        if idx is None:
            name = threading.current_thread().name
            idx = self.strings.of(("thread", name), lambda: name)
            self.thread_cache[ident] = idx
        return idx

    def forget_thread_names(self) -> None:
        """Thread idents are reused; a dump refreshes the ident -> name cache."""
        self.thread_cache.clear()
        if self._fast_path is not None:
            self._fast_path.forget_threads()

    def snapshot(self, merge: Callable[[list[Slot]], Merged | None]) -> Snapshot:
        """What a dump needs, taken together (the one moment that must be consistent).

        Args:
            merge: merges the ring's entries with PyTorch's own ring (``native.merge``); run
                after ours is read, it registers the groups only torch saw, so the group list
                is copied after it.
        """
        self.tracker.poll()  # settle finished async work first (is_completed never blocks)
        frames = sys._current_frames()
        active = dict(self.active)
        entries = decode(self.ring.snapshot())
        merged = merge(entries)
        strings = list(self.strings.values)
        specs = list(self.tensors.values)
        groups = [GroupCounts(g, g.seq, g.recorded, g.p2p_counters()) for g in self.groups.groups]
        wall, mono = time.time_ns(), time.monotonic_ns()
        self.forget_thread_names()
        return Snapshot(
            frames, active, entries, merged, strings, specs, groups, wall, mono,
            self.ring.capacity, self.stacks.symbolize,
        )  # fmt: skip

    @property
    def used(self) -> bool:
        """Whether a call was recorded (the watchdog and the poller started)."""
        return self._used

    def _start(self) -> None:
        self._used = True
        try:
            self._on_first_use()
        except Exception as exc:  # never into the job
            log.warning("flightrec: could not start the watchdog: %s", exc)
        if self._fast_path is not None:
            layout.install(self._fast_path)

    # -- slow paths of the hot path (see hotpath/python.py) ------------------------------
    def group_slow(self, pg: Any) -> GroupInfo | None:
        """Group info for ``pg`` on a cache miss; None when the call must not be recorded.

        ``None`` (the default group) is cached under the key None until the default group
        changes (``forget_default``); a rank outside the group is never recorded.
        """
        key = pg
        if pg is None:
            pg = self._default_group()
            if pg is None:  # not initialized: let torch raise its own error
                return None
        elif pg is self._non_member:
            return None
        if not self._used:
            self._start()
        try:
            hash(pg)
        except TypeError:  # not a group at all: torch raises its own error
            return None
        try:
            info = self.groups.get(pg)
        except Exception as exc:
            self.internal_error("group lookup", exc)
            return None
        if key is None:
            self.groups.by_pg[None] = info
        return info

    def object_call_returned(self, group: Any) -> None:
        """An object collective on ``group`` returned. torch ran collectives inside it that
        no hook recorded, and where the ProcessGroup counts them (gloo on torch 2.15) its
        numbering parts from flightrec's now: look now, at the same point on every rank,
        rather than at the next watchdog tick, which would come at a different call on each
        rank and number the ranks differently. Never raises."""
        info = self.groups.by_pg.get(group)
        if info is not None:
            info.follow_native()

    def forget_groups(self) -> None:
        """Every group is destroyed: let go of the ProcessGroup objects (their records stay
        for dumps)."""
        self.groups.by_pg.clear()  # in place: the generated wrappers share this dict
        self.groups.forget_native()

    def after_fork_in_child(self) -> None:
        """In a forked child: record nothing; the parent's async work is not the child's."""
        self.enabled = False
        self.tracker.after_fork_in_child()

    def forget_default(self) -> None:
        """The default group was created or destroyed: drop the None -> group shortcut."""
        self.groups.by_pg.pop(None, None)

    def spec_slow(self, info: GroupInfo, tensor: Any) -> tuple[int, int]:
        """(signature index, device index) of a single tensor, on a per-group cache miss."""
        key = (tensor.shape, tensor.dtype)
        dev = str(tensor.device)
        value = (self.tensors.of(tensor), self.strings.of(dev, lambda: dev))
        info.specs[key] = value
        return value

    def sig(self, value: Any) -> int:
        """Signature index of any tensor argument: a tensor, lists, nested lists or None."""
        return self.tensors.of(value)

    def device(self, *values: Any) -> int:
        """Device string index of the first tensor found in ``values``; 0 when none."""
        for value in values:
            t = _first_tensor(value)
            if t is not None:
                return self._device_name(str(t.device))
        return 0

    def _device_name(self, name: str) -> int:
        return self.strings.of(name, lambda: name)

    def red_slow(self, op: Any) -> int:
        """String index of a reduce op on a cache miss.

        Only the RedOpType enum members are cached by object: ReduceOp objects (PREMUL_SUM
        with a factor) are often built per call, and caching each would grow the table
        without bound; they are interned by name.
        """
        name = _reduce_name(op)
        if type(op).__name__ == "RedOpType":
            return self.strings.of(op, lambda: name)
        return self.strings.of(name, lambda: name)

    def op_index(self, name: str) -> int:
        """String index of an operation name (interned once per wrapper at install)."""
        return self.strings.of(name, lambda: name)

    def settle(self, rid: int, result: Any, is_async: Any, info: GroupInfo) -> None:
        """Completion of a call that returned, for async or GPU calls (CPU sync is inline).

        Never raises: the call already ran, and its result must reach the caller unchanged.
        """
        try:
            if is_async:
                if result is not None:
                    self.tracker.track(rid, result, info.gpu)
            elif info.gpu:
                # A synchronous NCCL call is only enqueued on its stream when it returns.
                self.tracker.track_stream(rid)
            else:
                self.ring.finish(rid, COMPLETED, _now())
        except Exception as exc:
            self.internal_error("completion tracking", exc)
            self._untracked((rid,))

    def _failed(self, rid: int, exc: BaseException) -> None:
        """Completion tracking saw tracked work fail."""
        self._on_error(rid, exc)

    def _untracked(self, rids: tuple[int, ...] | list[int]) -> None:
        """Entries whose completion can no longer be followed: neither pending (the watchdog
        would report a hang that is not there) nor completed (nobody knows)."""
        try:
            for rid in rids:
                self.ring.finish(rid, UNTRACKED, 0)
        except Exception:
            pass  # already warned once; nothing more to do for them

    def fail(self, rid: int, exc: BaseException) -> None:
        """A recorded call raised: mark the entry FAILED and dump (the caller re-raises).

        Never raises: the caller re-raises torch's exception, which must not be replaced.
        """
        self.active.pop(_ident(), None)
        try:
            self.ring.finish(rid, FAILED, _now())
            if isinstance(exc, Exception):
                self._on_error(rid, exc)
        except Exception as err:
            self.internal_error("failure recording", err)

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
        try:
            rids, info = self._enqueue_batch(ops, canon)
        except Exception as exc:  # ours, or arguments torch rejects: torch runs, and says so
            self.internal_error("batch_isend_irecv recording", exc)
            rids, info = [], None
        if not rids:
            return orig(*args, **kwargs)
        self.active[ident] = rids[0]
        try:
            works = orig(*args, **kwargs)
        except BaseException as exc:
            self.active.pop(ident, None)
            try:
                now = _now()
                for rid in rids:
                    self.ring.finish(rid, FAILED, now)
                if isinstance(exc, Exception):
                    self._on_error(rids[0], exc)
            except Exception as err:
                self.internal_error("failure recording", err)
            raise
        self.active.pop(ident, None)
        try:
            if works and info is not None:
                if len(works) == len(rids):
                    for rid, work in zip(rids, works, strict=True):
                        self.tracker.track(rid, work, info.gpu)
                else:  # one coalesced work for the whole batch (NCCL)
                    self.tracker.track_many(rids, works[0], info.gpu)
        except Exception as exc:
            self.internal_error("completion tracking", exc)
            self._untracked(rids)
        return works

    def _enqueue_batch(
        self, ops: Any, canon: Callable[[Any], None]
    ) -> tuple[list[int], GroupInfo | None]:
        """Write one ENQUEUED entry per operation; ([], None) when the batch is not recorded."""
        ident = _ident()
        for op in ops:
            canon(op)
        rids: list[int] = []
        info: GroupInfo | None = None
        name_send = self.strings.of("isend", lambda: "isend")
        name_recv = self.strings.of("irecv", lambda: "irecv")
        stack = self.path.stack(sys._getframe(3), ident)
        for op in ops:
            info = self.group_slow(op.group)
            if info is None:
                return [], None
            send = getattr(op.op, "__name__", "") == "isend"
            peer = self.path.peer(info, op.peer, getattr(op, "group_peer", None))
            flags = IS_P2P | COALESCED | 1 | (SEND if send else 0)
            tensor = op.tensor
            rid = self.path.write(
                info, ident, name_send if send else name_recv, flags,
                tensor if send else 0, 0 if send else tensor, 0, peer, stack,
            )  # fmt: skip
            rids.append(rid)
        return rids, info
