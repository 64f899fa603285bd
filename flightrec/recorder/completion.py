"""Completion of work the caller did not wait for, tracked without blocking anyone.

gloo (and other CPU backends): the Work's future calls back when the operation ends, on
torch's own thread. NCCL: a future callback would fire at enqueue time, not at GPU completion,
so the watchdog thread polls ``Work.is_completed()`` (backed by CUDA events) instead.

A synchronous NCCL call returns no Work: its completion is a CUDA event recorded on the current
stream after it returned. One event per call cost more than the call itself (11 µs to make and
record one from Python on an H200, against 16 µs for a 1-rank all_reduce), so calls share
events: the calls on one stream since its last event wait in a batch, and the batch gets one
event when a call comes ``MARK_EVERY_NS`` after the last event, or at the watchdog's next poll
(from its thread, on that stream), whichever is first. Work on a stream runs in order, so the
event's completion is every batched call's. A batched call reads as complete at most one
millisecond plus one poll late; a call stuck on the GPU stays pending, as it must.
Nothing here synchronizes a GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from flightrec.format.slot import COMPLETED, FAILED

if TYPE_CHECKING:
    from flightrec.recorder.recorder import Recorder

log = logging.getLogger("flightrec")

MARK_EVERY_NS = 1_000_000
"""A stream's synchronous GPU calls get a CUDA event at most this often from the calling thread
(about 1 % of a busy loop's time at 11 µs an event); the watchdog marks the rest."""
FORGET_STREAM_NS = 60_000_000_000
"""A stream with nothing pending and no call for this long is forgotten (streams made per step
would otherwise pile up)."""


class Untrackable(Exception):
    """The completion of these entries can no longer be followed (a CUDA event failed)."""

    def __init__(self, rids: tuple[int, ...], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.rids = rids


class Cuda:
    """The CUDA calls the batching makes, resolved once (tests pass a fake)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.device: Any = torch._C._cuda_getDevice
        self.raw_stream: Any = torch._C._cuda_getCurrentRawStream

    def event_on_current(self) -> Any:
        """A CUDA event recorded on the calling thread's current stream."""
        event = self._torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return event

    def event_on(self, device: int, stream: int) -> Any:
        """A CUDA event recorded on stream ``stream`` (a raw pointer; 0: the default stream)."""
        cuda = self._torch.cuda
        s = cuda.default_stream(device) if stream == 0 else cuda.ExternalStream(stream, device)
        event = cuda.Event()
        event.record(s)
        return event


class _Batch:
    """The synchronous calls on one stream since its last event."""

    __slots__ = ("last_ns", "marked_ns", "rids")

    def __init__(self) -> None:
        self.rids: list[int] = []
        self.marked_ns = 0
        self.last_ns = 0


def is_gpu(backend: str) -> bool:
    """Whether a backend name means GPU work whose end only CUDA events can tell."""
    return "nccl" in backend or "cuda" in backend or "xccl" in backend


class Tracker:
    """Marks ring entries COMPLETED or FAILED when their work ends."""

    def __init__(self, recorder: Recorder, cuda: Cuda | None = None) -> None:
        self._recorder = recorder
        self._polled: list[tuple[tuple[int, ...], Any, bool]] = []
        """(record ids, Work or CUDA event, is_event) waiting for the watchdog's next poll."""
        self._lock = threading.Lock()
        self._cuda = cuda
        self._batches: dict[tuple[int, int], _Batch] = {}
        """(device, raw stream) -> synchronous GPU calls waiting for an event."""

    def _done(self, rids: tuple[int, ...], ok: bool, exc: BaseException | None = None) -> None:
        now = time.monotonic_ns()
        for rid in rids:
            self._recorder.ring.finish(rid, COMPLETED if ok else FAILED, now)
        if not ok:
            self._recorder.on_error(rids[0], exc or RuntimeError("work failed"))

    def track(self, rid: int, work: Any, gpu: bool) -> None:
        """Follow one async Work to completion (``gpu``: the group runs on a GPU backend)."""
        self.track_many((rid,), work, gpu)

    def track_many(self, rids: tuple[int, ...] | list[int], work: Any, gpu: bool) -> None:
        """Follow one Work that completes several entries (a coalesced batch)."""
        key = tuple(rids)
        if not gpu:
            try:
                fut = work.get_future()
            except Exception:  # backends without futures: poll instead
                fut = None
            if fut is not None:
                fut.add_done_callback(lambda f: self._settle(key, f))
                return
        with self._lock:
            self._polled.append((key, work, False))

    def _settle(self, rids: tuple[int, ...], fut: Any) -> None:
        # Runs on torch's callback thread: no blocking, no exceptions out (one raising there
        # would mark the Future failed, or end the process).
        try:
            try:
                fut.value()
            except Exception as exc:
                self._done(rids, False, exc)
                return
            self._done(rids, True)
        except Exception as err:
            self._recorder.internal_error("completion callback", err)

    def after_fork_in_child(self) -> None:
        """The lock may have been held by a thread that does not exist in a forked child."""
        self._lock = threading.Lock()
        self._polled = []
        self._batches = {}

    def track_stream(self, rid: int) -> None:
        """A synchronous GPU call returned: completion is when the current stream passes here.

        Raises:
            Untrackable: a CUDA event could not be made or recorded; the recorder then marks
                its entries unknown (left ENQUEUED, the watchdog would report a false hang).
        """
        cuda = self._cuda
        try:
            if cuda is None:
                cuda = self._cuda = Cuda()
            device = cuda.device()
            key = (device, cuda.raw_stream(device))
        except Exception as exc:
            raise Untrackable((rid,), exc) from exc
        now = time.monotonic_ns()
        with self._lock:
            batch = self._batches.get(key)
            if batch is None:
                batch = self._batches[key] = _Batch()
            batch.rids.append(rid)
            batch.last_ns = now
            if now - batch.marked_ns < MARK_EVERY_NS:
                return
            rids = tuple(batch.rids)
            batch.rids.clear()
            batch.marked_ns = now
        try:
            event = cuda.event_on_current()
        except Exception as exc:
            raise Untrackable(rids, exc) from exc
        with self._lock:
            self._polled.append((rids, event, True))

    def _mark_leftovers(self) -> None:
        """An event for every batch still waiting (watchdog thread, on each batch's stream)."""
        if not self._batches:
            return
        now = time.monotonic_ns()
        with self._lock:
            due = []
            for key, batch in list(self._batches.items()):
                if batch.rids:
                    due.append((key, tuple(batch.rids)))
                    batch.rids.clear()
                    batch.marked_ns = now
                elif now - batch.last_ns > FORGET_STREAM_NS:
                    del self._batches[key]
        cuda = self._cuda
        for (device, stream), rids in due:
            try:
                assert cuda is not None  # a batch exists only once it was resolved
                event = cuda.event_on(device, stream)
            except Exception as exc:
                self._recorder.internal_error("completion tracking", exc)
                self._recorder._untracked(rids)
                continue
            with self._lock:
                self._polled.append((rids, event, True))

    def poll(self) -> None:
        """Settle whatever finished since the last poll (watchdog thread)."""
        self._mark_leftovers()
        with self._lock:
            polled = self._polled
            self._polled = []
        keep: list[tuple[tuple[int, ...], Any, bool]] = []
        for rids, obj, is_event in polled:
            try:
                done = obj.query() if is_event else obj.is_completed()
            except Exception as exc:
                self._done(rids, False, exc)
                continue
            if not done:
                keep.append((rids, obj, is_event))
                continue
            self._done(rids, is_event or _succeeded(obj))
        if keep:
            with self._lock:
                self._polled[:0] = keep

    def pending(self) -> int:
        """Works and events still waiting to be polled, and batches waiting for an event."""
        return len(self._polled) + sum(1 for b in self._batches.values() if b.rids)


def _succeeded(work: Any) -> bool:
    """Whether a completed Work succeeded, read from its future.

    ``Work.is_success()`` and ``Work.exception()`` would say so directly, but torch deprecated
    both: each prints "Work::... API is being deprecated" into the job's log the first time it
    is called, a line an untraced run never shows. A finished work's future holds its result or
    its error, and reading it never blocks. A Work without a future (a backend that has none)
    counts as succeeded: completion is what we know.
    """
    try:
        future = work.get_future()
    except Exception:
        return True
    try:
        if future.done():
            future.value()
    except Exception:
        return False
    return True
