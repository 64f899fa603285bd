"""Writing a black box: the ring's slots in a memory-mapped file, the tables in a journal.

The recorder's hot path does not know the ring is on disk: ``slots`` is an ``mmap`` object
that ``struct.pack_into`` writes into exactly as it writes into a ``bytearray``. Only the rare
slow paths (a new string, tensor signature, stack or group) append a line to the journal, and
the watchdog refreshes a heartbeat in the header. Nothing here raises into the job: a failure
to create the files leaves the recorder on an in-memory ring (one warning), and a failed
journal write is counted and reported once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import socket
import threading
import time
from pathlib import Path
from types import CodeType
from typing import Any

from flightrec.format.blackbox import (
    BEAT,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    OFF_BEAT,
    OFF_STATUS,
    OFF_UNSEEN,
    STATUS,
    TABLES_SUFFIX,
    UNSEEN_COUNT,
    UNSEEN_ROW,
    UNSEEN_ROWS,
    VERSION,
    Status,
    UnseenRow,
    fixed,
    ring_name,
)
from flightrec.format.write import FILE_MODE
from flightrec.frames import origin_of
from flightrec.recorder.recording.stacks import line_of, source_line

log = logging.getLogger("flightrec")


def _create(
    path: Path, directory: Path, mode: int = os.O_RDWR, nameless: bool = True
) -> tuple[int, bool]:
    """Open a new file for ``path``: (fd, True) nameless in ``directory`` (O_TMPFILE) where the
    filesystem supports it, else (fd, False) created at ``path``. Created 0666 less the umask,
    as any tool's files are: a job's group can read its black boxes on a shared filesystem."""
    tmpfile = getattr(os, "O_TMPFILE", 0) if nameless else 0
    if tmpfile:
        try:
            return os.open(directory, tmpfile | mode, FILE_MODE), True
        except OSError:
            pass  # not on this filesystem (EOPNOTSUPP, EISDIR on old kernels): named at once
    return os.open(path, mode | os.O_CREAT | os.O_TRUNC, FILE_MODE), False


class BlackBox:
    """One process's black-box files.

    Args:
        directory: FLIGHTREC_DIR (created if missing).
        capacity: ring capacity in slots.
        slot_size: bytes per slot (the recorder's ``SLOT_SIZE``).
        stack_depth: FLIGHTREC_STACK_DEPTH, stored for the reader.
        timeout_s: FLIGHTREC_TIMEOUT, stored for the reader.
        nameless: keep the files nameless (O_TMPFILE, where the filesystem has it) until
            ``identify``: a process that never joins a process group leaves nothing behind.

    Raises:
        OSError: the files cannot be created or mapped.
    """

    def __init__(
        self,
        directory: str,
        capacity: int,
        slot_size: int,
        stack_depth: int,
        timeout_s: float,
        nameless: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self._made_dir = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.path = self.directory / ring_name(-1, self.host, self.pid)
        size = HEADER_SIZE + capacity * slot_size
        # Nameless until the process joins a process group (``identify``): a process that
        # never does (torchrun's agent, a data-loading helper) leaves no file, even if killed.
        self.fd, self.anonymous = _create(self.path, self.directory, nameless=nameless)
        try:
            os.ftruncate(self.fd, size)  # sparse zeros: every slot starts empty (record id 0)
            self.head = mmap.mmap(self.fd, HEADER_SIZE)
            self.slots = mmap.mmap(self.fd, capacity * slot_size, offset=HEADER_SIZE)
            tables_fd, anonymous = _create(
                self._tables_path(self.path), self.directory, os.O_WRONLY | os.O_APPEND, nameless
            )
        except BaseException:
            os.close(self.fd)
            if not self.anonymous:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            raise
        self._tables_fd = tables_fd
        if anonymous != self.anonymous:  # both nameless or both named, never a mix
            self._link(tables_fd, self._tables_path(self.path))
            if self.anonymous:
                self._link(self.fd, self.path)
                self.anonymous = False
        self._lock = threading.Lock()  # journal lines of different tables never interleave
        self._frames: dict[tuple[str, str, int], int] = {}
        self._symbols: dict[tuple[int, int], int] = {}
        self._codes: list[CodeType] = []  # keeps ids in _symbols from being reused
        # Frames whose source line is not journaled yet: read by the watchdog's tick, never on
        # the calling thread (a source file read is I/O the hot path must not wait for).
        self._unsourced: list[tuple[int, str, int]] = []
        self._failed = False
        self.closed = False
        from flightrec import __version__

        self._fields: dict[str, Any] = {
            "magic": MAGIC, "version": VERSION, "header_size": HEADER_SIZE,
            "slot_size": slot_size, "capacity": capacity, "pid": self.pid, "rank": -1,
            "world_size": 0, "status": int(Status.RUNNING), "stack_depth": stack_depth,
            "timeout_s": float(timeout_s), "start_wall_ns": time.time_ns(),
            "start_mono_ns": time.monotonic_ns(), "beat_wall_ns": 0, "beat_mono_ns": 0,
            "hostname": fixed(self.host, 64), "job_id": b"", "backend": b"",
            "torch_version": b"", "flightrec_version": fixed(__version__, 16),
        }  # fmt: skip
        self._write_header()

    @staticmethod
    def _link(fd: int, path: Path) -> None:
        """Give a nameless (O_TMPFILE) file its name (linkat with AT_SYMLINK_FOLLOW, which
        ``os.link`` only uses when given a directory fd)."""
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(
                f"/proc/self/fd/{fd}", path.name, src_dir_fd=dfd, dst_dir_fd=dfd,
                follow_symlinks=True,
            )  # fmt: skip
        finally:
            os.close(dfd)

    @staticmethod
    def _tables_path(ring: Path) -> Path:
        return ring.with_name(ring.name[: -len(".ring")] + TABLES_SUFFIX)

    def _write_header(self) -> None:
        HEADER.pack_into(self.head, 0, *self._fields.values())

    # -- identity and liveness ---------------------------------------------------------------
    def identify(
        self, rank: int, world_size: int, job_id: str, backend: str, torch_version: str
    ) -> None:
        """Record who this process is (once its default group exists); name the files by rank."""
        if not self.owned():
            return
        f = self._fields
        f["rank"], f["world_size"] = rank, world_size
        f["job_id"], f["backend"] = fixed(job_id, 128), fixed(backend, 32)
        f["torch_version"] = fixed(torch_version, 32)
        f["beat_wall_ns"], f["beat_mono_ns"] = time.time_ns(), time.monotonic_ns()
        self._write_header()
        target = self.directory / ring_name(rank, self.host, self.pid)
        if self.closed:
            return
        try:
            if self.anonymous:
                self._link(self._tables_fd, self._tables_path(target))
                self._link(self.fd, target)
                self.anonymous = False
                self.path = target
            elif rank >= 0 and target != self.path:
                os.replace(self._tables_path(self.path), self._tables_path(target))
                os.replace(self.path, target)
                self.path = target
        except OSError as exc:
            log.warning("flightrec: could not name the black box %s: %s", target, exc)

    def owned(self) -> bool:
        """False in a forked child: the mapping is shared with the parent, whose file it is.

        A child never renames, marks or deletes the parent's black box (a ``fork()``ed child
        that exits through ``sys.exit`` runs the parent's atexit handlers).
        """
        return os.getpid() == self.pid

    def heartbeat(self) -> None:
        """Note that the process is alive now (the reader bounds the time of death with it)."""
        if not self.owned():
            return
        BEAT.pack_into(self.head, OFF_BEAT, time.time_ns(), time.monotonic_ns())

    def unseen(self, rows: list[UnseenRow]) -> None:
        """Write what torch's recorder counted per group (``UNSEEN_ROW``): (group index,
        flags, last issued, unfinished (0: none), its op, monotonic ns since it stands). The
        watchdog's thread only, when they change; at most ``UNSEEN_ROWS``."""
        if not self.owned():
            return
        # torch says -1 where it has no number (a P2P-only group, a group its recorder has not
        # numbered yet): such a row tells nothing, and would not fit the row's unsigned fields.
        rows = [r for r in rows if _fits_unseen(r)][:UNSEEN_ROWS]
        _, generation = UNSEEN_COUNT.unpack_from(self.head, OFF_UNSEEN)
        at = OFF_UNSEEN + UNSEEN_COUNT.size
        for i, r in enumerate(rows):
            UNSEEN_ROW.pack_into(
                self.head, at + i * UNSEEN_ROW.size, r.group, r.flags, r.issued, r.pending,
                fixed(r.op, 24), r.since_ns,
            )  # fmt: skip
        UNSEEN_COUNT.pack_into(self.head, OFF_UNSEEN, len(rows), (generation + 1) & 0xFFFFFFFF)

    def close(self, healthy: bool) -> None:
        """At exit: delete the files of a healthy process, or mark them as evidence.

        The maps stay open: other threads may still write a slot while the interpreter exits,
        and writing into an unlinked mapping is harmless.
        """
        if self.closed or not self.owned():
            return
        self.closed = True
        if not healthy:  # the file stays as evidence: journal the lines no tick got to yet
            self.write_sources()
        status = Status.CLEAN if healthy else Status.EXITED
        self._fields["status"] = int(status)
        STATUS.pack_into(self.head, OFF_STATUS, int(status))
        self.heartbeat()
        if healthy and not self.anonymous:
            for p in (self._tables_path(self.path), self.path):
                # If deleting fails, the header says CLEAN and the loader sets the file aside.
                with contextlib.suppress(OSError):
                    p.unlink()
            if self._made_dir:  # a healthy run leaves the folder as it found it
                with contextlib.suppress(OSError):
                    self.directory.rmdir()  # only if empty: dumps stay
        # Under the journal's lock, and marked closed: a thread still interning (a dump in
        # flight at exit) must not write to the number once the next open() reuses it.
        with self._lock:
            tables_fd, self._tables_fd = self._tables_fd, -1
        with contextlib.suppress(OSError):
            os.close(tables_fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)  # the maps keep the file; a nameless one goes with them

    # -- the tables journal (called under the tables' own locks, on first sight only) ------
    def _append(self, records: list[list[Any]]) -> None:
        if self._tables_fd < 0:  # closed at exit: nothing more is journaled
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        try:
            os.write(self._tables_fd, data)
        except (OSError, ValueError) as exc:
            if not self._failed:
                self._failed = True
                log.warning("flightrec: black-box tables not written (%s): %s", self.path, exc)

    def on_string(self, index: int, value: Any) -> None:
        """A new string table entry."""
        with self._lock:
            self._append([["s", index, str(value)]])

    def on_tensors(self, index: int, value: Any) -> None:
        """A new tensor signature: ``((shape, dtype), ...)``."""
        with self._lock:
            self._append([["t", index, [[list(shape), dtype] for shape, dtype in value]]])

    def on_stack(self, index: int, raw: Any) -> None:
        """A new stack: ``((code, f_lasti), ...)``, symbolized here, once per new frame."""
        with self._lock:
            records: list[list[Any]] = []
            ids: list[int] = []
            for code, lasti in raw:
                key = (id(code), lasti)
                fid = self._symbols.get(key)
                if fid is None:
                    sym = (code.co_filename, code.co_qualname, line_of(code, lasti))
                    fid = self._frames.get(sym)
                    if fid is None:
                        fid = self._frames[sym] = len(self._frames) + 1
                        records.append(["f", fid, *sym])
                        self._unsourced.append((fid, sym[0], sym[2]))
                    self._symbols[key] = fid
                    self._codes.append(code)
                ids.append(fid)
            records.append(["k", index, ids])
            self._append(records)

    def write_sources(self) -> None:
        """Journal the source line and the origin (``flightrec.frames.origin_of``) of every
        frame seen since the last call (watchdog thread): ``["c", frame id, text, origin]``.

        A rank that dies hard leaves the code it ran, not whatever the file says when and
        where the black box is analyzed, and whose code each frame was as only this process
        can tell. Never raises.
        """
        if not self._unsourced:
            return
        with self._lock:
            pending, self._unsourced = self._unsourced, []
        records: list[list[Any]] = []
        for fid, file, line in pending:
            records.append(["c", fid, source_line(file, line), int(origin_of(file))])
        if records:
            with self._lock:
                self._append(records)

    def on_exception(self, x: Any) -> None:
        """An exception that ended a thread (a ``RaisedException``), with its source lines.

        Journaled at once, from the thread it ended: the exit that follows may never finish.
        Record ``x``: type, message, thread, is_main, wall ns, via, frames as [file, function,
        line, source]; a reader that predates it counts one unreadable line.
        """
        frames = [[f, n, line, source_line(f, line)] for f, n, line in x.frames]
        record = ["x", 0, x.type, x.message, x.thread, bool(x.is_main), x.wall_time_ns, x.via]
        with self._lock:
            self._append([[*record, frames]])

    def on_group(self, info: Any) -> None:
        """A new process group (a ``GroupInfo``)."""
        with self._lock:
            self._append([["g", info.index, info.name, info.desc, list(info.ranks), info.backend]])


_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _fits_unseen(row: UnseenRow) -> bool:
    """Whether ``row`` fits ``UNSEEN_ROW`` (group and flags 32-bit, sequence numbers 64-bit,
    all unsigned; the time signed 64-bit)."""
    return (
        0 <= row.group <= _U32
        and 0 <= row.flags <= _U32
        and 0 <= row.issued <= _U64
        and 0 <= row.pending <= _U64
        and -(1 << 63) <= row.since_ns < (1 << 63)
    )
