"""The ring slot: one entry as a fixed-size little-endian record, in memory and on disk.

Each entry is one ``SLOT`` record. The layout is the same in the recorder's ring buffer, in the
black box's memory-mapped file (``flightrec.format.blackbox``) and in the C hot path
(``flightrec/recorder/hotpath/_fast.c``, whose offsets a test checks against ``SLOT``). The record id is
stored first and again last: a reader of a file left by a process killed in the middle of a
write drops a slot whose two copies disagree. Index columns (op, thread, stack, ...) refer to the
recorder's intern tables, which only ever grow.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from typing import NamedTuple

# Little-endian, no implicit padding: the layout is a file format, not a C struct.
SLOT = struct.Struct("<QqqB3xQQIIIiIIIIIIQ")
SLOT_SIZE = SLOT.size
# Offsets used for in-place updates; they must follow the format above.
OFF_COMPLETE = 16  # complete_ns (q) then state (B)
OFF_STATE = 24
RID = struct.Struct("<Q")
DONE = struct.Struct("<qB")

# Slot states, equal to the protobuf ``State`` values so no mapping is needed at dump time.
EMPTY = 0
ENQUEUED = 1
STARTED = 2
COMPLETED = 3
FAILED = 4
PENDING = re.compile(b"[\x01\x02]")


class Slot(NamedTuple):
    """One decoded ring entry; index columns point into the recorder's intern tables."""

    record_id: int
    enqueue_ns: int
    complete_ns: int
    state: int
    seq: int
    p2p_seq: int
    group: int
    op: int
    reduce_op: int
    peer: int
    thread: int
    stack: int
    inputs: int
    outputs: int
    device: int
    flags: int


def decode(snapshot: bytes) -> list[Slot]:
    """The entries of a ring snapshot, oldest first (empty slots left out)."""
    slots = [Slot._make(v[:-1]) for v in SLOT.iter_unpack(snapshot) if v[0] and v[0] == v[-1]]
    slots.sort(key=lambda s: s.record_id)
    return slots


def iter_pending(snapshot: bytes) -> Iterator[Slot]:
    """Entries of a snapshot that are not finished."""
    for values in SLOT.iter_unpack(snapshot):
        if values[0] and values[3] in (ENQUEUED, STARTED):
            yield Slot._make(values[:-1])
