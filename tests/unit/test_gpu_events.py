"""Synchronous GPU calls: one CUDA event each, reused once seen complete
(``completion.Tracker.track_stream`` and ``completion.Cuda``).

A fake torch stands in for CUDA (no GPU here); the real path runs in
tests/integration/test_recorder_hooks.py::test_nccl_completion_is_tracked_without_blocking
where CUDA is present.
"""

from __future__ import annotations

from typing import Any

import pytest

from flightrec.format.slot import COMPLETED
from flightrec.recorder.recording import completion
from flightrec.recorder.recording.completion import Cuda, Tracker


class Event:
    made = 0

    def __init__(self) -> None:
        Event.made += 1
        self.stream: Any = None
        self.done = False

    def query(self) -> bool:
        return self.done


class FakeTorch:
    """What ``Cuda`` reads of torch: the device, the raw stream, streams and events."""

    def __init__(self) -> None:
        self.raw = 7
        self.streams_made = 0
        self.broken = False
        torch = self

        class C:
            @staticmethod
            def _cuda_getDevice() -> int:
                return 0

            @staticmethod
            def _cuda_getCurrentRawStream(device: int) -> int:
                return torch.raw

            class _CudaEventBase:
                @staticmethod
                def record(event: Event, stream: Any) -> None:
                    if torch.broken:
                        raise RuntimeError("CUDA error: an illegal memory access was encountered")
                    event.stream, event.done = stream, False

        class cuda:  # torch's name
            Event = globals()["Event"]

            @staticmethod
            def current_stream(device: int) -> tuple[str, int]:
                torch.streams_made += 1
                return ("stream", torch.raw)

        self._C = C
        self.cuda = cuda


class Ring:
    def __init__(self) -> None:
        self.finished: dict[int, int] = {}

    def finish(self, rid: int, state: int, now: int) -> None:
        self.finished[rid] = state


class Recorder:
    def __init__(self) -> None:
        self.ring = Ring()

    def on_error(self, rid: int, exc: BaseException) -> None:
        raise AssertionError("an event never fails an entry")

    def internal_error(self, where: str, exc: BaseException) -> None:
        raise AssertionError(f"no internal error expected ({where}: {exc})")


def new_tracker(rec: Recorder, cuda: Any) -> Tracker:
    return Tracker(rec.ring.finish, rec.on_error, rec.internal_error, cuda)


def tracker(monkeypatch: pytest.MonkeyPatch) -> tuple[Tracker, Recorder, FakeTorch]:
    fake = FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    rec = Recorder()
    return new_tracker(rec, Cuda()), rec, fake


def test_each_call_completes_with_its_own_event_so_a_later_stall_holds_only_later_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t, rec, _ = tracker(monkeypatch)
    for rid in (1, 2, 3):
        t.track_stream(rid)
    events = [obj for _, obj, _ in t._polled]
    assert len({id(e) for e in events}) == 3
    events[0].done = events[1].done = True  # 3 waits behind a kernel that never ends
    t.poll()
    assert rec.ring.finished == {1: COMPLETED, 2: COMPLETED}
    assert t.pending() == 1


def test_events_seen_complete_are_recorded_again_and_streams_are_built_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t, rec, fake = tracker(monkeypatch)
    Event.made = 0
    for rid in range(1, 101):
        t.track_stream(rid)
        for _, e, _ in t._polled:
            e.done = True
        t.poll()
    assert len(rec.ring.finished) == 100
    assert Event.made == 1 and fake.streams_made == 1
    fake.raw = 9  # another stream: its own object, recorded on it
    t.track_stream(101)
    assert fake.streams_made == 2 and t._polled[0][1].stream == ("stream", 9)


def test_an_event_that_cannot_be_recorded_makes_the_call_untrackable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t, _, fake = tracker(monkeypatch)
    fake.broken = True
    with pytest.raises(RuntimeError, match="illegal memory access"):
        t.track_stream(4)
    assert t.pending() == 0  # the recorder marks 4 unknown: nothing left to poll


def test_without_cuda_the_call_is_untrackable_at_once() -> None:
    class NoCuda:
        def event_on_current(self) -> Any:
            raise RuntimeError("Found no NVIDIA driver on your system")

    t = new_tracker(Recorder(), NoCuda())
    with pytest.raises(RuntimeError, match="no NVIDIA driver"):
        t.track_stream(5)
    assert t.pending() == 0


def test_the_pool_and_the_stream_cache_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(completion, "POOL_MAX", 2)
    monkeypatch.setattr(completion, "STREAMS_MAX", 3)
    t, _, fake = tracker(monkeypatch)
    cuda = t._cuda
    assert cuda is not None
    for _ in range(5):
        cuda.release(Event())
    assert len(cuda.free) == 2
    for raw in range(10):
        fake.raw = raw
        cuda.event_on_current()
    assert len(cuda._streams) <= 3
