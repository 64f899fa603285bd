"""The black-box file format: a header page, then the ring's binary slots, plus a tables journal.

A rank's ring lives in ``<FLIGHTREC_DIR>/flightrec-rank00003-<host>-<pid>.ring`` (before the
rank is known: ``flightrec-<host>-<pid>.ring``), memory-mapped, so every entry the hot path
writes is in the kernel's page cache the moment it is written: a process killed with SIGKILL,
ended by ``os._exit`` or aborted inside gloo/NCCL leaves it behind without running any code.

Layout of the ``.ring`` file:
  * bytes 0..4095: the header (``HEADER``), rewritten in place when the rank becomes known,
    by a heartbeat from the watchdog, and at exit; at ``OFF_UNSEEN``, the collectives the
    ring cannot show that torch's own recorder shows unfinished (``UNSEEN_ROW``, rewritten by
    the watchdog when they change; all zero in files of flightrec 0.x before issue 31);
  * then ``capacity`` slots of ``SLOT_SIZE`` bytes in the recorder's own slot format
    (``flightrec.format.slot.SLOT``), slot ``i`` holding record ids ``i+1, i+1+capacity...``.

The interned tables the slots refer to (strings, tensor signatures, stacks, groups) go to a
sibling ``.ring.tables`` file, one JSON line per new value, appended when the value is first
interned (rare: a few dozen lines per job). A torn last line is ignored by the reader.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

MAGIC = b"FRBLKBOX"
VERSION = 1
HEADER_SIZE = 4096
"""One page, so the slot region can be mapped page-aligned on its own."""
RING_SUFFIX = ".ring"
TABLES_SUFFIX = ".ring.tables"
SOURCE = "flightrec-blackbox"
"""``Header.source`` of a dump read back from a black-box file."""
DIED = "the process died without running any Python exit code"
"""In ``reason_detail`` of a black box whose process is gone without a trace of exiting."""
RUNNING_NOW = "the process is still running"
"""In ``reason_detail`` of a black box read while its process runs (it did not answer a dump
request, say because it is stuck in C++ holding the GIL)."""

# Little-endian, no implicit padding: this is a file format.
HEADER = struct.Struct("<8sIIIIqiiIIdqqqq64s128s32s32s16s")
HEAD_FIELDS = (
    "magic", "version", "header_size", "slot_size", "capacity", "pid", "rank", "world_size",
    "status", "stack_depth", "timeout_s", "start_wall_ns", "start_mono_ns", "beat_wall_ns",
    "beat_mono_ns", "hostname", "job_id", "backend", "torch_version", "flightrec_version",
)  # fmt: skip
# Offsets for in-place updates; they follow the format above.
OFF_STATUS = 40
STATUS = struct.Struct("<I")
OFF_BEAT = 72
BEAT = struct.Struct("<qq")


OFF_UNSEEN = 1024
UNSEEN_COUNT = struct.Struct("<II")
"""Rows in use, and a generation number moved by every rewrite."""
UNSEEN_ROW = struct.Struct("<IIQQ24sq")
"""What torch's own recorder counted for one group, which the ring may not hold (DDP's
reducer, FSDP2 and funcol issue collectives flightrec's hooks never see): the group index
(the journal's), entry flags for a pending collective (``DDP_BUCKET`` on a DDP model's
group), the last collective the ProcessGroup issued, the one it has unfinished (0: none),
that one's op (NUL-padded), and the monotonic time it was first seen unfinished."""
UNSEEN_ROWS = 32


class UnseenRow(NamedTuple):
    """One row of ``UNSEEN_ROW``, as the recorder writes it and the reader reads it back."""

    group: int
    """The group's index in the registry (the journal's)."""
    flags: int
    """Entry flags for the pending collective (``DDP_BUCKET`` on a DDP model's group)."""
    issued: int
    """The last collective the ProcessGroup issued (its own counter)."""
    pending: int
    """The collective torch's recorder shows unfinished; 0: none."""
    op: str
    """That collective's operation ("": none)."""
    since_ns: int
    """Monotonic time it was first seen unfinished (0: none)."""


class Status(enum.IntEnum):
    """How the process that owned a black-box file ended, as far as the file can tell."""

    RUNNING = 1
    """Never closed: the process is still running, or died without running Python's exit."""
    EXITED = 2
    """Exited through Python's normal exit path with unfinished or failed operations."""
    CLEAN = 3
    """Exited healthy; the file is normally deleted instead (kept only if deleting failed)."""


def ring_name(rank: int, host: str, pid: int) -> str:
    """File name of a ring: by rank once known (``rank < 0``: not yet known)."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)[:64]
    if rank < 0:
        return f"flightrec-{host}-{pid}{RING_SUFFIX}"
    return f"flightrec-rank{rank:05d}-{host}-{pid}{RING_SUFFIX}"


def text(raw: bytes) -> str:
    """A fixed-size, NUL-padded header string."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def fixed(value: str, size: int) -> bytes:
    """``value`` encoded and cut to fit a fixed-size header field (on a character boundary)."""
    data = value.encode("utf-8")
    while len(data) > size:
        value = value[:-1]
        data = value.encode("utf-8")
    return data
