"""Completion of work the caller did not wait for, tracked without blocking anyone.

gloo (and other CPU backends): the Work's future calls back when the operation ends, on
torch's own thread. NCCL: a future callback would fire at enqueue time, not at GPU completion,
so the watchdog thread polls ``Work.is_completed()`` (backed by CUDA events) instead.

A synchronous NCCL call returns no Work: its completion is a CUDA event recorded on the current
stream after it returned, one per call (events shared between calls were tried: a batch's event
recorded after later work, such as a long kernel, made the calls before it read as stuck). A new
``torch.cuda.Event`` per call cost 11 µs on an H200, against 16 µs for a 1-rank all_reduce,
mostly making and destroying the CUDA event and building a ``Stream`` object: events are reused
once the watchdog saw them complete, and the current stream's object is cached by its raw
handle, so a call records one event on a ready stream.
Nothing here synchronizes a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flightrec.format.slot import COMPLETED, FAILED

log = logging.getLogger("flightrec")

POOL_MAX = 1024
"""CUDA events kept for reuse at most (each is a few hundred bytes of driver state)."""
STREAMS_MAX = 64
"""Stream objects cached at most; past it the cache starts over (streams made per step)."""


class Cuda:
    """The CUDA calls made for a synchronous GPU call, resolved once (tests pass a fake)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._device: Any = torch._C._cuda_getDevice
        self._raw_stream: Any = torch._C._cuda_getCurrentRawStream
        self._record: Any = torch._C._CudaEventBase.record
        self._streams: dict[tuple[int, int], Any] = {}
        self.free: list[Any] = []
        """Events seen complete, ready to record again (appended by the watchdog's thread)."""

    def event_on_current(self) -> Any:
        """A CUDA event recorded on the calling thread's current stream."""
        device = self._device()
        key = (device, self._raw_stream(device))
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= STREAMS_MAX:
                self._streams = {}
            stream = self._streams[key] = self._torch.cuda.current_stream(device)
        try:
            event = self.free.pop()
        except IndexError:
            event = self._torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._record(event, stream)
        return event

    def release(self, event: Any) -> None:
        """An event seen complete: keep it for another call."""
        if len(self.free) < POOL_MAX:
            self.free.append(event)


class _Adopting(threading.local):
    rids: list[int] | None = None
    """Record ids of the calling thread's async CPU work that its caller settles itself."""


class Tracker:
    """Marks ring entries COMPLETED or FAILED when their work ends.

    Args:
        finish: ``Ring.finish(rid, state, complete_ns)``, which writes an entry's end.
        failed: told ``(first record id, exception)`` when work failed (the dumper's hook).
        internal_error: told ``(where, exception)`` of a bug of ours on torch's thread.
        cuda: the CUDA calls for synchronous GPU calls (tests pass a fake); resolved at the
            first such call.
    """

    def __init__(
        self,
        finish: Callable[[int, int, int], object],
        failed: Callable[[int, BaseException], None],
        internal_error: Callable[[str, BaseException], None],
        cuda: Cuda | None = None,
    ) -> None:
        self._finish = finish
        self._failed = failed
        self._internal_error = internal_error
        self._polled: list[tuple[tuple[int, ...], Any, bool]] = []
        """(record ids, Work or CUDA event, is_event) waiting for the watchdog's next poll."""
        self._lock = threading.Lock()
        self._cuda = cuda
        self._adopting = _Adopting()

    def _done(self, rids: tuple[int, ...], ok: bool, exc: BaseException | None = None) -> None:
        now = time.monotonic_ns()
        for rid in rids:
            self._finish(rid, COMPLETED if ok else FAILED, now)
        if not ok:
            self._failed(rids[0], exc or RuntimeError("work failed"))

    def track(self, rid: int, work: Any, gpu: bool) -> None:
        """Follow one async Work to completion (``gpu``: the group runs on a GPU backend)."""
        self.track_many((rid,), work, gpu)

    def track_many(self, rids: tuple[int, ...] | list[int], work: Any, gpu: bool) -> None:
        """Follow one Work that completes several entries (a coalesced batch)."""
        key = tuple(rids)
        adopted = self._adopting.rids
        if not gpu and adopted is not None:
            adopted.extend(key)  # its caller settles it (``adopting``)
            return
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

    @contextlib.contextmanager
    def adopting(self) -> Iterator[list[int]]:
        """Within it, async CPU work the calling thread records gets no future callback of
        the tracker's: its record ids go into the list yielded, and the caller settles them
        from a callback of its own on the work's future (``settler``). DDP's communication
        hook already has one: one callback per bucket instead of two, each a take of the GIL
        on the backend's thread."""
        taken: list[int] = []
        self._adopting.rids = taken
        try:
            yield taken
        finally:
            self._adopting.rids = None

    def settler(self, rids: list[int] | tuple[int, ...]) -> Callable[[Any], None]:
        """What settles adopted entries from their work's future (never raises)."""
        key = tuple(rids)
        return lambda fut: self._settle(key, fut)

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
            self._internal_error("completion callback", err)

    def after_fork_in_child(self) -> None:
        """The lock may have been held by a thread that does not exist in a forked child."""
        self._lock = threading.Lock()
        self._polled = []

    def track_stream(self, rid: int) -> None:
        """A synchronous GPU call returned: completion is when the current stream passes here.

        Raises:
            Exception: the CUDA event could not be made or recorded; the recorder then marks
                the entry unknown (left ENQUEUED, the watchdog would report a false hang).
        """
        cuda = self._cuda
        if cuda is None:
            cuda = self._cuda = Cuda()
        event = cuda.event_on_current()
        with self._lock:
            self._polled.append(((rid,), event, True))

    def poll(self) -> None:
        """Settle whatever finished since the last poll (watchdog thread)."""
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
            if is_event and self._cuda is not None:
                self._cuda.release(obj)
        if keep:
            with self._lock:
                self._polled[:0] = keep

    def pending(self) -> int:
        """Works and events still waiting to be polled."""
        return len(self._polled)


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
