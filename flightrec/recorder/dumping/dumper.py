"""Dumps: copy the recorder's state under a short lock, build the protobuf and write it outside.

A dump never waits on a hung collective (nothing here calls into a process group), never
raises into the job (any failure is one warning on the ``flightrec`` logger), and never
overwrites an earlier dump (every file name carries the process's dump index).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.schema import RECORDER_SOURCE, dump_filename
from flightrec.format.slot import Slot
from flightrec.format.write import write_dump
from flightrec.frames import origin_of, without_own_frames
from flightrec.recorder.dumping.exceptions import MAX_EXCEPTIONS, RaisedException
from flightrec.recorder.native import merge as native_merge
from flightrec.recorder.recording.stacks import frames_of, source_line

if TYPE_CHECKING:
    from flightrec.recorder.recording.recorder import Recorder

log = logging.getLogger("flightrec")
CLOSE_WAIT_S = 5.0
"""How long exit waits for a dump that is being written (a big ring takes a second or two)."""
THREAD_STACK_DEPTH = 128
"""Frames kept per thread at dump time: deep enough to reach the training loop from anywhere."""


def _version() -> str:
    from flightrec import __version__

    return __version__


class Identity(NamedTuple):
    """Who a process is in its job, fixed when its first process group is created.

    Kept for the life of the process: after ``destroy_process_group()`` torch can no longer
    say (and ``RANK``/``WORLD_SIZE`` are absent under ``torch.multiprocessing.spawn``), yet exit
    and SIGTERM dumps written then belong to the same rank of the same job.
    """

    rank: int
    world_size: int
    job_id: str
    backend: str


def identify(job_id: str = "") -> Identity | None:
    """This process's identity from its live default group; None while it has none.

    Args:
        job_id: FLIGHTREC_JOB_ID (or torchrun's run id); the store address when empty.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    rank, world, backend, store = _dist_info()
    return Identity(rank, world, job_id or store, backend)


def _dist_info() -> tuple[int, int, str, str]:
    """(rank, world size, default backend, store address) without any communication."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    backend = ""
    store = ""
    try:
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
            from flightrec.recorder.exchange.store import store_address

            store = store_address()
    except Exception:
        pass
    return rank, world, backend, store


def device_identity(backend: str) -> tuple[str, str, str]:
    """(device, name, uuid) of this rank's accelerator; ("cpu", "", "") without one.

    Only asks CUDA when the process already initialized it: a dump must not create a context.
    """
    try:
        import torch

        cuda_up = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        if "nccl" in backend or cuda_up:
            index = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            uuid = str(getattr(props, "uuid", "") or "")
            if uuid and not uuid.startswith("GPU-"):
                uuid = f"GPU-{uuid}"
            return f"cuda:{index}", str(props.name), uuid
    except Exception:
        pass
    return "cpu", "", ""


class Dumper:
    """Writes this process's dumps; safe to call from any thread, including signal watchers."""

    def __init__(
        self,
        recorder: Recorder,
        job_id: str = "",
        on_dump: Callable[[pb.Dump, Path | None], None] | None = None,
    ) -> None:
        """``on_dump(dump, path)`` is told of each dump built and where it went (None: not
        written); it must not raise."""
        self.recorder = recorder
        self.job_id = job_id
        self._index = itertools.count()
        self._lock = threading.Lock()  # one dump at a time; never held by the hot path
        self._warned = False
        self.exit_dumped = False
        """An exit dump was written: the black box is superseded and can go."""
        self._pid = os.getpid()
        self._closed = False
        self._exceptions: list[RaisedException] = []
        """Exceptions that ended a thread of this process, oldest first (in every later dump)."""
        self.identity: Identity | None = None
        """Set once, when the process's first group exists (``Lifecycle.start``)."""
        self._on_dump = on_dump

    def add_exception(self, x: RaisedException) -> bool:
        """Keep ``x`` for every later dump; False once ``MAX_EXCEPTIONS`` are kept."""
        if len(self._exceptions) >= MAX_EXCEPTIONS:
            return False
        self._exceptions.append(x)
        return True

    def remember_identity(self) -> Identity | None:
        """Fix the process's identity the first time a default group exists; keep it after."""
        if self.identity is None:
            try:
                self.identity = identify(self.job_id)
            except Exception as exc:  # never into the job; dumps then fall back to the env
                log.warning("flightrec: could not tell this process's rank: %s", exc)
        return self.identity

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """At interpreter exit: let a dump in progress finish, then refuse new ones.

        Daemon threads (the signal watcher, the request poller) are stopped wherever they are
        when the interpreter ends; without this, a dump they were writing would be left as a
        temporary file instead of arriving whole.
        """
        if os.getpid() != self._pid:
            return  # a forked child: the lock may be held by a thread that is not here
        if self._lock.acquire(timeout=timeout_s):
            self._closed = True
            self._lock.release()

    def dump(self, reason: int, detail: str = "", requested_by: int = -1) -> Path | None:
        """Write one dump now.

        Returns:
            The file written, or None when writing failed (after one warning) or when called
            in a forked child (the ring, its groups and its rank are the parent's).
        """
        if os.getpid() != self._pid:
            return None
        try:
            with self._lock:
                if self._closed:
                    return None
                return self._dump(reason, detail, requested_by)
        except Exception as exc:
            # The black box already warned that the folder cannot be written: one cause,
            # one warning.
            said = isinstance(exc, OSError) and self.recorder.dir_error is not None
            if not self._warned and not said:
                self._warned = True
                log.warning(
                    "flightrec: could not write a dump to %s: %s",
                    self.recorder.config.directory,
                    exc,
                )
            return None

    def _dump(self, reason: int, detail: str, requested_by: int) -> Path:
        rec = self.recorder
        snap = rec.snapshot(lambda entries: native_merge.harvest_and_merge(rec, entries))
        entries, merged = snap.entries, snap.merged

        b = DumpBuilder(source=source_line, origin=lambda file, _line: origin_of(file))
        me = self.remember_identity()
        if me is None:  # no group yet: what the environment says
            rank, world, backend, store = _dist_info()
            me = Identity(rank, world, self.job_id or store, backend)
        rank, backend = me.rank, me.backend
        device, device_name, device_uuid = device_identity(backend)
        h = b.header
        h.rank, h.world_size = rank, me.world_size
        h.hostname = socket.gethostname()
        h.pid = os.getpid()
        h.local_rank = int(os.environ.get("LOCAL_RANK", "-1") or -1)
        h.device, h.device_name, h.device_uuid = device, device_name, device_uuid
        h.job_id = me.job_id
        h.backend = backend
        h.torch_version = torch_version()
        h.flightrec_version = _version()
        h.reason = reason  # type: ignore[assignment]
        h.reason_detail = detail
        h.process_end = pb.END_EXITED if reason == pb.PROCESS_EXIT else pb.END_RUNNING
        h.wall_time_ns, h.mono_time_ns = snap.wall_ns, snap.mono_ns
        h.buffer_capacity = snap.capacity
        h.entries_recorded = max((e.record_id for e in entries), default=0)
        h.stack_depth = rec.config.stack_depth
        h.timeout_s = rec.config.timeout_s
        h.dump_index = next(self._index)
        h.requested_by = requested_by
        h.source = RECORDER_SOURCE

        present: dict[int, int] = {}
        for slot in entries:
            present[slot.group] = present.get(slot.group, 0) + 1
        for c in snap.groups:
            g, seq, p2p = c.info, c.seq, c.p2p
            dropped = max(0, c.recorded - present.get(g.index, 0))
            if merged is not None and g.index in merged.last_seq:  # torch's numbering
                seq, dropped = merged.last_seq[g.index], merged.dropped.get(g.index, 0)
            # No members: a group torch no longer resolves (destroyed before this dump).
            b.group(
                g.name, g.ranks, desc=g.desc, backend=g.backend, last_seq=seq,
                dropped=dropped, p2p=p2p, members_known=bool(g.ranks),
            )  # fmt: skip

        s_map = [b.string(s) for s in snap.strings]
        t_map: dict[int, int] = {0: 0}
        k_map: dict[int, int] = {0: 0}
        rows: list[Slot | EntryValues] = list(entries) if merged is None else merged.rows
        for e in rows:
            if not isinstance(e, Slot):  # a native entry, or part of an object collective
                b.entry(e)
                continue
            if e.stack not in k_map:
                k_map[e.stack] = b.stack(snap.symbolize(e.stack))
            for t in (e.inputs, e.outputs):
                if t not in t_map:
                    t_map[t] = b.tensors(snap.specs[t])
            b.entry_raw(
                record_id=e.record_id, group=e.group, seq=e.seq, p2p_seq=e.p2p_seq,
                op=s_map[e.op], reduce_op=s_map[e.reduce_op], peer=e.peer, state=e.state,
                enqueue_ns=e.enqueue_ns, start_ns=0, complete_ns=e.complete_ns,
                thread=s_map[e.thread], stack=k_map[e.stack], inputs=t_map[e.inputs],
                outputs=t_map[e.outputs], flags=e.flags, device=s_map[e.device],
            )  # fmt: skip

        names = {t.ident: t.name for t in threading.enumerate()}
        main = threading.main_thread().ident
        for ident, frame in snap.frames.items():
            name = names.get(ident, f"thread-{ident}")
            # a little deeper than kept: the frames of flightrec's own handler go first
            stack = frames_of(frame, THREAD_STACK_DEPTH + 8)
            own_thread = name.startswith("flightrec-")
            stack = without_own_frames(stack, [f for f, _, _ in stack], own_thread)
            b.thread(
                ident, name, stack[:THREAD_STACK_DEPTH],
                is_main=ident == main, holds_recorder=ident in snap.active,
            )  # fmt: skip
        del snap  # the threads' frames: not kept past the dump
        for x in list(self._exceptions):
            b.exception(
                x.type, x.message, x.frames, thread=x.thread, is_main=x.is_main,
                wall_time_ns=x.wall_time_ns, via=x.via,
            )  # fmt: skip
        dump = b.build()
        reason_name = pb.DumpReason.Name(reason)  # type: ignore[arg-type]
        name = dump_filename(rank, h.dump_index, reason_name, os.getpid())
        try:
            path = write_dump(dump, rec.config.directory, name)
        except Exception:
            self._built(dump, None)  # the summary in the job's log needs no file
            raise
        self._built(dump, path)
        if reason == pb.PROCESS_EXIT:
            self.exit_dumped = True
        log.info("flightrec: wrote %s", path)
        return path

    def _built(self, dump: pb.Dump, path: Path | None) -> None:
        hook = self._on_dump
        if hook is not None:
            try:
                hook(dump, path)
            except Exception as exc:
                log.warning("flightrec: dump hook failed: %s", exc)


def torch_version() -> str:
    """The installed torch's version ("" when it cannot be told)."""
    try:
        import torch

        return str(torch.__version__)
    except Exception:
        return ""


def in_thread(
    dumper: Dumper, reason: int, detail: str = "", requested_by: int = -1
) -> threading.Thread:
    """Dump on a fresh daemon thread (from signal handlers and torch callbacks)."""
    t = threading.Thread(
        target=dumper.dump, args=(reason, detail, requested_by), name="flightrec-dump", daemon=True
    )
    t.start()
    return t


def describe_entry(recorder: Recorder, slot: Any) -> str:
    """One line naming a ring entry, for ``reason_detail``."""
    strings = recorder.strings.values
    groups = recorder.groups.groups
    g = groups[slot.group] if slot.group < len(groups) else None
    where = f"group {g.name}" if g else "group ?"
    seq = f"seq {slot.seq}" if slot.seq else f"p2p #{slot.p2p_seq} peer {slot.peer}"
    return f"{strings[slot.op]} on {where} {seq} (record {slot.record_id})"
