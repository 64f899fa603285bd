"""The binary ring: fixed-size slots, overwrite of the oldest, in-place completion."""

from __future__ import annotations

import pytest

from flightrec.format.slot import COMPLETED, ENQUEUED, FAILED, SLOT_SIZE, decode
from flightrec.recorder.hotpath.ring import Ring


def put(ring: Ring, seq: int, state: int = ENQUEUED, enqueue: int = 100) -> int:
    return ring.append(enqueue, state, seq, 0, 0, 1, 0, -1, 2, 3, 4, 5, 6, 7)


def test_slots_are_fixed_size_and_decode_in_order() -> None:
    ring = Ring(4)
    assert len(ring.buffer) == 4 * SLOT_SIZE
    rids = [put(ring, seq) for seq in (1, 2, 3)]
    assert rids == [1, 2, 3]
    slots = decode(ring.snapshot())
    assert [s.record_id for s in slots] == [1, 2, 3]
    s = slots[0]
    assert (s.seq, s.op, s.peer, s.thread, s.stack, s.inputs, s.outputs, s.device, s.flags) == (
        1, 1, -1, 2, 3, 4, 5, 6, 7,
    )  # fmt: skip
    assert s.state == ENQUEUED and s.complete_ns == 0


def test_overwrites_oldest_and_keeps_order() -> None:
    ring = Ring(3)
    for seq in range(1, 8):
        put(ring, seq)
    assert [s.seq for s in decode(ring.snapshot())] == [5, 6, 7]


def test_finish_updates_in_place_unless_overwritten() -> None:
    ring = Ring(2)
    first = put(ring, 1)
    assert ring.finish(first, COMPLETED, 500)
    (slot,) = decode(ring.snapshot())
    assert slot.state == COMPLETED and slot.complete_ns == 500 and slot.enqueue_ns == 100
    put(ring, 2)
    put(ring, 3)  # overwrites record 1
    assert not ring.finish(first, FAILED, 900)
    assert [s.state for s in decode(ring.snapshot())] == [ENQUEUED, ENQUEUED]


def test_pending_slots_scans_state_column() -> None:
    ring = Ring(4)
    a = put(ring, 1)
    put(ring, 2)
    ring.finish(a, COMPLETED, 1)
    assert [ring.read(i).seq for i in ring.pending_slots()] == [2]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Ring(0)
