"""Synchronous GPU calls share CUDA events per stream (``completion.Tracker.track_stream``).

A fake CUDA stands in for torch's (no GPU here); the real path runs in
tests/integration/test_recorder_hooks.py::test_nccl_completion_is_tracked_without_blocking
where CUDA is present.
"""

from __future__ import annotations

from typing import Any

import pytest

from flightrec.format.slot import COMPLETED
from flightrec.recorder import completion
from flightrec.recorder.completion import Tracker, Untrackable


class Event:
    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.done = False

    def query(self) -> bool:
        return self.done


class FakeCuda:
    def __init__(self) -> None:
        self.stream = 7
        self.events: list[Event] = []
        self.broken = False

    def device(self) -> int:
        return 0

    def raw_stream(self, device: int) -> int:
        return self.stream

    def event_on_current(self) -> Event:
        return self.event_on(0, self.stream)

    def event_on(self, device: int, stream: int) -> Event:
        if self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        event = Event(stream)
        self.events.append(event)
        return event


class Ring:
    def __init__(self) -> None:
        self.finished: dict[int, int] = {}

    def finish(self, rid: int, state: int, now: int) -> None:
        self.finished[rid] = state


class Recorder:
    def __init__(self) -> None:
        self.ring = Ring()
        self.errors: list[str] = []
        self.untracked: list[int] = []

    def internal_error(self, where: str, exc: BaseException) -> None:
        self.errors.append(where)

    def on_error(self, rid: int, exc: BaseException) -> None:
        raise AssertionError("events never fail an entry")

    def _untracked(self, rids: Any) -> None:
        self.untracked.extend(rids)


def tracker() -> tuple[Tracker, Recorder, FakeCuda]:
    rec, cuda = Recorder(), FakeCuda()
    return Tracker(rec, cuda), rec, cuda  # type: ignore[arg-type]


def test_calls_close_together_share_one_event_and_complete_with_it() -> None:
    t, rec, cuda = tracker()
    for rid in range(1, 6):
        t.track_stream(rid)
    # The first call was marked at once; the four after it wait for the next event.
    assert len(cuda.events) == 1
    assert t.pending() == 2
    t.poll()  # the watchdog marks the waiting batch on its stream
    assert len(cuda.events) == 2 and cuda.events[1].stream == 7
    assert rec.ring.finished == {}
    cuda.events[1].done = True
    t.poll()
    assert rec.ring.finished == {2: COMPLETED, 3: COMPLETED, 4: COMPLETED, 5: COMPLETED}
    cuda.events[0].done = True
    t.poll()
    assert rec.ring.finished[1] == COMPLETED and t.pending() == 0


def test_a_call_long_after_the_last_event_gets_one_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completion, "MARK_EVERY_NS", 0)
    t, _, cuda = tracker()
    for rid in range(1, 4):
        t.track_stream(rid)
    assert len(cuda.events) == 3


def test_streams_are_batched_apart_so_one_finishing_says_nothing_of_another() -> None:
    t, rec, cuda = tracker()
    t.track_stream(1)  # stream 7, marked at once
    cuda.stream = 9
    t.track_stream(2)  # stream 9, marked at once
    t.track_stream(3)  # stream 9, waits
    cuda.stream = 7
    t.track_stream(4)  # stream 7, waits
    t.poll()
    by_stream = {e.stream: e for e in cuda.events[2:]}
    assert sorted(by_stream) == [7, 9]
    by_stream[9].done = True  # stream 7 is stuck on the GPU
    t.poll()
    assert rec.ring.finished == {3: COMPLETED}


def test_an_event_that_cannot_be_made_leaves_its_batch_untracked_not_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t, rec, cuda = tracker()
    t.track_stream(1)
    t.track_stream(2)
    t.track_stream(3)
    cuda.broken = True
    t.poll()  # the watchdog's event for 2 and 3 fails
    assert rec.untracked == [2, 3] and rec.errors == ["completion tracking"]
    assert t.pending() == 1  # 1's event, made before
    t.track_stream(4)
    monkeypatch.setattr(completion, "MARK_EVERY_NS", -1)
    with pytest.raises(Untrackable) as raised:  # the caller's event fails: 4 and 5 with it
        t.track_stream(5)
    assert raised.value.rids == (4, 5)


def test_a_stream_idle_for_long_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    t, _, _ = tracker()
    t.track_stream(1)
    monkeypatch.setattr(completion, "FORGET_STREAM_NS", -1)
    t.poll()
    assert t._batches == {}


def test_without_cuda_the_call_is_untrackable_at_once() -> None:
    class NoCuda(FakeCuda):
        def device(self) -> int:
            raise RuntimeError("Found no NVIDIA driver on your system")

    t = Tracker(Recorder(), NoCuda())  # type: ignore[arg-type]
    with pytest.raises(Untrackable) as raised:
        t.track_stream(5)
    assert raised.value.rids == (5,)
