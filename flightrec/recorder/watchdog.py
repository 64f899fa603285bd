"""The hang detector: a daemon thread that settles polled work and spots overdue entries.

It wakes every ``PERIOD_S``, lets the completion tracker poll GPU work, and scans the ring's
state column (one C-speed slice) for entries still incomplete after ``FLIGHTREC_TIMEOUT``.
For the first such entry it dumps (WATCHDOG_TIMEOUT) and asks every rank to dump through the
store. It never blocks on a process group; posting to the store happens on another thread so a
slow store cannot delay the next scan.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from flightrec.format.slot import ENQUEUED, STARTED

if TYPE_CHECKING:
    from flightrec.format.slot import Slot
    from flightrec.recorder.recording.recorder import Recorder

log = logging.getLogger("flightrec")
PERIOD_S = 0.1


class Watchdog:
    """Calls ``on_hang(slot)`` once for each entry that outlives the timeout."""

    def __init__(
        self,
        recorder: Recorder,
        on_hang: Callable[[Slot], None],
        period_s: float = PERIOD_S,
        on_tick: Callable[[int], None] = lambda now_ns: None,
    ) -> None:
        """``on_tick(now_ns)`` runs first at every scan: proof that Python threads still run
        (it re-arms the raw-stacks deadline)."""
        self._recorder = recorder
        self._on_hang = on_hang
        self._on_tick = on_tick
        self._period = period_s
        self._timeout_ns = int(recorder.config.timeout_s * 1e9)
        self._reported: set[int] = set()
        self._last_fire = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flightrec-watchdog", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop scanning; with ``wait_s``, wait that long for the thread to end."""
        self._stop.set()
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.check(time.monotonic_ns())
            except Exception as exc:  # a bug here must not kill the job; say so once
                log.warning("flightrec: watchdog check failed: %s", exc)

    def check(self, now_ns: int) -> None:
        """One scan (the thread calls this; tests call it with a fake clock)."""
        rec = self._recorder
        self._on_tick(now_ns)
        if rec.blackbox is not None:
            rec.blackbox.heartbeat()
        rec.tracker.poll()
        rec.stacks.purge(sys._current_frames())
        if self._last_fire and now_ns - self._last_fire < self._timeout_ns:
            return  # one hang dump per timeout period: a stuck job must not dump in a loop
        oldest: Slot | None = None
        for index in rec.ring.pending_slots():
            slot = rec.ring.read(index)
            if slot.state not in (ENQUEUED, STARTED) or slot.record_id in self._reported:
                continue
            if now_ns - slot.enqueue_ns > self._timeout_ns and (
                oldest is None or slot.record_id < oldest.record_id
            ):
                oldest = slot
        if oldest is not None:
            self._reported.add(oldest.record_id)
            self._last_fire = now_ns
            self._on_hang(oldest)
