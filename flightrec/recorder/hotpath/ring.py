"""The ring: fixed-capacity ``flightrec.format.slot`` records in one preallocated buffer.

No Python object is created per entry beyond the argument tuple, and a dump copies the whole
ring with one ``bytes()`` call (``flightrec.recorder.recording.blackbox`` backs the buffer with a
memory-mapped file so that a rank killed with SIGKILL still leaves its ring behind).

``append`` and ``finish`` are the one Python definition of writing a slot: the Python hot path
(``python.py``) writes every entry through them, completion tracking and failures
finish entries through ``finish``, and the tests of this file exercise the same functions.
The optional C hot path (``_fast.c``) writes the same layout into the same buffer,
and tests/integration/test_recorder_fast.py compares its entries with the Python path's.

Writers do not lock: record ids come from a counter (``counters.py``, atomic under the
GIL) and each ``pack_into`` is a single C call, so a reader copying the buffer sees every slot
either before or after a write, never half of one; the C path writes in one step under the
GIL too.
"""

from __future__ import annotations

from typing import Any

from flightrec.format.slot import (
    COMPLETED,
    DONE,
    ENQUEUED,
    FAILED,
    OFF_COMPLETE,
    OFF_STATE,
    PENDING,
    RID,
    SLOT,
    SLOT_SIZE,
    STARTED,
    Slot,
    decode,
    iter_pending,
)
from flightrec.recorder.hotpath.counters import new_counter

# Bound once: the Python hot path writes every entry through ``append`` and ``finish``.
_pack = SLOT.pack_into
_rid_at = RID.unpack_from
_done = DONE.pack_into

__all__ = [
    "COMPLETED",
    "ENQUEUED",
    "FAILED",
    "SLOT_SIZE",
    "STARTED",
    "Ring",
    "Slot",
    "decode",
    "iter_pending",
]


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
        self.ids = new_counter()
        """Record ids; ``next()`` on it is atomic under the GIL, ``ids.value`` the last one."""

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
        """Write one entry into the next slot; returns its record id (1, 2, ...).

        The record id is taken here, last: a caller that fails before (``PyPath.write``
        interns everything first) leaves no gap in the ids."""
        rid = next(self.ids)
        _pack(
            self.buffer,
            ((rid - 1) % self.capacity) * SLOT_SIZE,
            rid, enqueue_ns, 0, state, seq, p2p_seq, group, op, reduce_op, peer,
            thread, stack, inputs, outputs, device, flags, rid,
        )  # fmt: skip
        return rid

    def finish(self, rid: int, state: int, complete_ns: int) -> bool:
        """Set an entry's final state; False when the ring already overwrote it."""
        off = ((rid - 1) % self.capacity) * SLOT_SIZE
        if _rid_at(self.buffer, off)[0] != rid:
            return False
        _done(self.buffer, off + OFF_COMPLETE, complete_ns, state)
        return True

    def snapshot(self) -> bytes:
        """A copy of the whole buffer (one memcpy; safe against concurrent writers)."""
        return bytes(self.buffer)

    def pending_slots(self) -> list[int]:
        """Slot indices whose entry is still enqueued or started (a cheap C-speed scan)."""
        states = self.buffer[OFF_STATE::SLOT_SIZE]
        return [m.start() for m in PENDING.finditer(states)]

    def failed_any(self) -> bool:
        """Whether any entry still in the ring failed."""
        return bytes([FAILED]) in self.buffer[OFF_STATE::SLOT_SIZE]

    def read(self, slot: int) -> Slot:
        """Decode one slot in place."""
        return Slot._make(SLOT.unpack_from(self.buffer, slot * SLOT_SIZE)[:-1])
