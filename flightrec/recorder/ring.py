"""The ring: fixed-capacity, fixed-size binary slots in one preallocated buffer.

Each entry is one ``SLOT`` record written with ``struct.pack_into``: no Python object is
created per entry beyond the argument tuple, a slot's layout is the same in memory and on disk
(``flightrec.blackbox`` backs the buffer with a memory-mapped file so that a rank killed with
SIGKILL still leaves its ring behind), and a dump copies the whole ring with one ``bytes()`` call.
The record id is stored first and again last: a reader of a file left by a process killed in the
middle of a write drops a slot whose two copies disagree.

Writers do not lock: record ids come from ``itertools.count`` (atomic under the GIL) and each
``pack_into`` is a single C call, so a reader copying the buffer sees every slot either before
or after a write, never half of one. The optional C hot path (``_fast.c``) writes the same
layout into the same buffer, also in one step under the GIL; its offsets mirror ``SLOT``. Columns that hold table indices (op, thread, stack, ...)
refer to the recorder's intern tables, which only ever grow.
"""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

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
_PENDING = re.compile(b"[\x01\x02]")


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


class Ring:
    """A ring of ``capacity`` binary slots; the newest entry overwrites the oldest."""

    def __init__(self, capacity: int, buffer: Any = None) -> None:
        """``buffer``: a writable, zeroed buffer of ``capacity * SLOT_SIZE`` bytes to use
        instead of a fresh ``bytearray`` (the black box's memory-mapped file)."""
        if capacity < 1:
            raise ValueError("ring capacity must be at least 1")
        self.capacity = capacity
        if buffer is not None and len(buffer) != capacity * SLOT_SIZE:
            raise ValueError("ring buffer size does not match its capacity")
        self.buffer: Any = bytearray(capacity * SLOT_SIZE) if buffer is None else buffer
        self.ids = itertools.count(1)
        """Record ids; ``next()`` on it is atomic under the GIL."""

    def append(
        self,
        enqueue_ns: int,
        state: int,
        seq: int,
        p2p_seq: int,
        group: int,
        op: int,
        reduce_op: int,
        peer: int,
        thread: int,
        stack: int,
        inputs: int,
        outputs: int,
        device: int,
        flags: int,
    ) -> int:
        """Write one entry into the next slot; returns its record id (1, 2, ...)."""
        rid = next(self.ids)
        SLOT.pack_into(
            self.buffer,
            ((rid - 1) % self.capacity) * SLOT_SIZE,
            rid, enqueue_ns, 0, state, seq, p2p_seq, group, op, reduce_op, peer,
            thread, stack, inputs, outputs, device, flags, rid,
        )  # fmt: skip
        return rid

    def finish(self, rid: int, state: int, complete_ns: int) -> bool:
        """Set an entry's final state; False when the ring already overwrote it."""
        off = ((rid - 1) % self.capacity) * SLOT_SIZE
        if RID.unpack_from(self.buffer, off)[0] != rid:
            return False
        DONE.pack_into(self.buffer, off + OFF_COMPLETE, complete_ns, state)
        return True

    def snapshot(self) -> bytes:
        """A copy of the whole buffer (one memcpy; safe against concurrent writers)."""
        return bytes(self.buffer)

    def pending_slots(self) -> list[int]:
        """Slot indices whose entry is still enqueued or started (a cheap C-speed scan)."""
        states = self.buffer[OFF_STATE::SLOT_SIZE]
        return [m.start() for m in _PENDING.finditer(states)]

    def failed_any(self) -> bool:
        """Whether any entry still in the ring failed."""
        return bytes([FAILED]) in self.buffer[OFF_STATE::SLOT_SIZE]

    def read(self, slot: int) -> Slot:
        """Decode one slot in place."""
        return Slot._make(SLOT.unpack_from(self.buffer, slot * SLOT_SIZE)[:-1])


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
