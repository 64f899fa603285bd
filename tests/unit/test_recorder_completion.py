"""How the completion tracker tells a finished Work's success: from its future, never from
``Work.is_success()`` or ``Work.exception()`` (deprecated: each prints a warning into the
job's log the first time it is called)."""

from __future__ import annotations

from flightrec.recorder.recording.completion import _succeeded


class Future:
    def __init__(self, done: bool, error: Exception | None = None) -> None:
        self._done, self._error = done, error

    def done(self) -> bool:
        return self._done

    def value(self) -> list[int]:
        if self._error is not None:
            raise self._error
        return [1]


class Work:
    """A Work whose deprecated accessors fail the test when called."""

    def __init__(self, future: Future | None) -> None:
        self._future = future

    def get_future(self) -> Future:
        if self._future is None:
            raise RuntimeError("this backend has no future")
        return self._future

    def is_success(self) -> bool:
        raise AssertionError("is_success is deprecated: never called")

    def exception(self) -> None:
        raise AssertionError("exception is deprecated: never called")


def test_a_finished_work_succeeded_unless_its_future_holds_an_error() -> None:
    assert _succeeded(Work(Future(done=True)))
    assert not _succeeded(Work(Future(done=True, error=RuntimeError("Connection closed by peer"))))


def test_a_work_without_a_future_counts_as_succeeded() -> None:
    assert _succeeded(Work(None))
    assert _succeeded(Work(Future(done=False)))  # completed, future not settled yet


def test_adopted_work_is_settled_by_its_caller_not_by_a_callback_of_ours() -> None:
    """DDP's hook adopts its bucket's entry: no future callback of the tracker's (each one is a
    take of the GIL on gloo's thread), the hook's own callback settles it."""
    from flightrec.format.slot import COMPLETED, FAILED
    from flightrec.recorder.recording.completion import Tracker

    finished: list[tuple[int, int]] = []
    failures: list[int] = []

    class Watched(Future):
        callbacks = 0

        def add_done_callback(self, fn: object) -> None:
            Watched.callbacks += 1

    t = Tracker(lambda rid, state, ns: finished.append((rid, state)),
                lambda rid, exc: failures.append(rid), lambda where, exc: None)  # fmt: skip
    with t.adopting() as rids:
        t.track(7, Work(Watched(done=False)), gpu=False)
    assert rids == [7] and Watched.callbacks == 0 and finished == []
    t.settler(rids)(Watched(done=True))
    assert finished == [(7, COMPLETED)]
    t.settler([8])(Watched(done=True, error=RuntimeError("Timed out waiting 4000ms")))
    assert finished[-1] == (8, FAILED) and failures == [8]
    t.track(9, Work(Watched(done=False)), gpu=False)  # outside: the tracker follows it
    assert Watched.callbacks == 1
