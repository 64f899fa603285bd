"""Prometheus metrics for alerting, read from what the recorder keeps anyway.

With ``FLIGHTREC_METRICS_PORT=P`` each traced process serves ``/metrics`` on ``P + LOCAL_RANK``
(``prometheus_client``'s server, on the ``flightrec-metrics`` thread). Nothing is counted on
the hot path for it: a scrape reads the groups' sequence counters, scans the ring's state
bytes for pending entries (the C-speed scan the watchdog makes every period), and reads the
counters the runtime keeps of its dumps, uploads and warnings. Collectives only PyTorch's
recorder sees (functional collectives, FSDP2, DDP's C++ hook where flightrec's is off) count
too, once the watchdog's once-a-second look at torch's counters (``native.watch``) finds one
unfinished for 2 s: their age is counted from when torch's counters stopped moving.

The early warning is ``flightrec_oldest_pending_seconds``: an operation pending for longer
than half of ``flightrec_timeout_seconds`` is a hang in the making, before any watchdog fires.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flightrec.recorder.dumping.upload import Uploader
    from flightrec.recorder.native.watch import PendingNative
    from flightrec.recorder.recording.recorder import Recorder

log = logging.getLogger("flightrec")

BLACKBOX_STATES = ("off", "unavailable", "unnamed", "recording", "closed")
"""The black box's states, one of them true at a time:

- ``off``: FLIGHTREC_BLACKBOX turned it off.
- ``unavailable``: it could not be created (FLIGHTREC_DIR not writable: warned at start).
- ``unnamed``: the ring is in a file with no name yet (before the process joined a group).
- ``recording``: the ring is in its named file beside the dumps.
- ``closed``: the process is ending and the black box was closed.
"""


@dataclass
class Counts:
    """What the runtime counts for the metrics (plain integers, bumped off the hot path)."""

    dumps_written: int = 0
    dumps_failed: int = 0
    warnings: int = 0
    """Warnings flightrec logged: its own errors (a failed dump, upload, hook, ...)."""


class WarningCounter(logging.Filter):
    """Counts the ``flightrec`` logger's warnings and errors into ``Counts.warnings``.

    A filter on the logger, not a handler: a handler would be the logger's first, and Python
    would then stop printing its warnings to stderr (its last-resort handler is used only
    where no handler is found), which is how flightrec's warnings reach the job's log.
    """

    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.counts.warnings += 1
        return True


def blackbox_state(recorder: Recorder) -> str:
    """One of ``BLACKBOX_STATES``."""
    bb = recorder.blackbox
    if bb is None:
        return "off" if not recorder.config.blackbox else "unavailable"
    if bb.closed:
        return "closed"
    return "unnamed" if bb.anonymous else "recording"


class FlightrecCollector:
    """A ``prometheus_client`` collector: every value is read when Prometheus scrapes.

    Args:
        recorder: the process's recorder (groups, ring, black box).
        counts: the runtime's counters.
        uploader: the object-storage uploader, when FLIGHTREC_DIR is a URL.
        identity: ``() -> (rank, world_size, job_id)`` as known now (rank -1 before the first
            process group).
        clock: monotonic nanoseconds (the ring's clock); tests pass a fake one.
        native: the collectives PyTorch's recorder shows unfinished, one per group at most
            (``NativeWatch.pending``, read as a snapshot); None: not watched.
    """

    def __init__(
        self,
        recorder: Recorder,
        counts: Counts,
        uploader: Uploader | None,
        identity: Callable[[], tuple[int, int, str]],
        clock: Callable[[], int] = time.monotonic_ns,
        native: Callable[[], Iterable[PendingNative]] | None = None,
    ) -> None:
        self.recorder = recorder
        self.counts = counts
        self.uploader = uploader
        self.identity = identity
        self.clock = clock
        self.native = native

    def pending(self) -> tuple[dict[int, int], int, int]:
        """(the ring's pending entries per group index, when the oldest pending operation
        began (0 when none), operations only PyTorch's recorder shows pending).

        The last: per group, the collective torch's recorder shows unfinished where the ring
        holds nothing pending (a collective flightrec's hooks never saw).
        """
        ring = self.recorder.ring
        per_group: dict[int, int] = {}
        oldest = 0
        for i in ring.pending_slots():
            slot = ring.read(i)
            per_group[slot.group] = per_group.get(slot.group, 0) + 1
            if slot.enqueue_ns and (oldest == 0 or slot.enqueue_ns < oldest):
                oldest = slot.enqueue_ns
        unseen = 0
        if self.native is not None:
            index = {g.name: g.index for g in list(self.recorder.groups.groups)}
            for p in self.native():
                if per_group.get(index.get(p.group, -1)):
                    continue  # the ring holds it, or an older one of the group
                unseen += 1
                if p.since_ns and (oldest == 0 or p.since_ns < oldest):
                    oldest = p.since_ns
        return per_group, oldest, unseen

    def collect(self) -> Iterator[Any]:
        """The metric families (called by ``prometheus_client`` on each scrape)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
            StateSetMetricFamily,
        )

        rank, world, job = self.identity()
        info = InfoMetricFamily("flightrec", "Who this process is in its job.")
        info.add_metric(
            [],
            {
                "rank": str(rank),
                "world_size": str(world),
                "job_id": job,
                "local_rank": os.environ.get("LOCAL_RANK", ""),
                "host": socket.gethostname(),
            },
        )
        yield info

        per_group, oldest, unseen = self.pending()
        issued = CounterMetricFamily(
            "flightrec_collectives_issued",
            "Operations (collectives and point-to-point) this rank issued on each process group.",
            labels=["process_group", "pg_desc"],
        )
        completed = CounterMetricFamily(
            "flightrec_collectives_completed",
            "Operations of each process group this rank saw complete (or fail).",
            labels=["process_group", "pg_desc"],
        )
        for g in list(self.recorder.groups.groups):
            n = g.recorded
            labels = [g.name, g.desc]
            issued.add_metric(labels, n)
            completed.add_metric(labels, max(0, n - per_group.get(g.index, 0)))
        yield issued
        yield completed
        yield GaugeMetricFamily(
            "flightrec_pending_operations",
            "Operations issued and not yet complete, over all process groups.",
            value=sum(per_group.values()) + unseen,
        )
        age = max(0.0, (self.clock() - oldest) / 1e9) if oldest else 0.0
        yield GaugeMetricFamily(
            "flightrec_oldest_pending_seconds",
            "Age of the oldest operation still pending (0 when none): alert well before "
            "flightrec_timeout_seconds.",
            value=age,
        )
        yield GaugeMetricFamily(
            "flightrec_timeout_seconds",
            "FLIGHTREC_TIMEOUT: how long an operation may pend before the watchdog declares a hang.",
            value=self.recorder.config.timeout_s,
        )
        yield CounterMetricFamily(
            "flightrec_dumps_written", "Dump files written.", value=self.counts.dumps_written
        )
        yield CounterMetricFamily(
            "flightrec_dump_failures",
            "Dumps that could not be written.",
            value=self.counts.dumps_failed,
        )
        yield CounterMetricFamily(
            "flightrec_errors",
            "Warnings flightrec logged about itself (a failed dump, upload, hook...).",
            value=self.counts.warnings,
        )
        state = blackbox_state(self.recorder)
        bb = StateSetMetricFamily("flightrec_blackbox", "The black box's state.")
        bb.add_metric([], {s: s == state for s in BLACKBOX_STATES})
        yield bb
        up = self.uploader
        if up is not None:
            uploads = CounterMetricFamily(
                "flightrec_uploads", "Dumps uploaded to FLIGHTREC_DIR's URL.", labels=["result"]
            )
            uploads.add_metric(["uploaded"], up.uploaded)
            uploads.add_metric(["failed"], up.failed)
            yield uploads
            yield GaugeMetricFamily(
                "flightrec_uploads_pending", "Dumps waiting to be uploaded.", value=up.pending
            )


class MetricsServer:
    """The ``/metrics`` endpoint of one process (``start`` it; ``close`` at exit)."""

    def __init__(self, collector: FlightrecCollector, port: int, addr: str) -> None:
        self.collector = collector
        self.port = port
        self.addr = addr
        self._server: Any = None

    def start(self) -> None:
        """Bind and serve on a daemon thread named ``flightrec-metrics``.

        Raises:
            ImportError: prometheus_client is not installed.
            OSError: the port cannot be bound.
        """
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ImportError(
                "FLIGHTREC_METRICS_PORT needs prometheus_client "
                "(pip install 'torch-flightrec[metrics]')"
            ) from None

        # A registry of its own: the process's default one (the job's own metrics, if any)
        # is left alone, and nothing of ours is served twice.
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        server, thread = start_http_server(self.port, self.addr, registry=registry)
        thread.name = "flightrec-metrics"  # flightrec's own frames are left out of dumps
        self._server = server

    def close(self) -> None:
        """Stop serving (bounded: the server checks for shutdown twice a second)."""
        server, self._server = self._server, None
        if server is not None:
            t = threading.Thread(target=server.shutdown, daemon=True)
            t.start()
            t.join(1.0)
            server.server_close()


def metrics_port(base: int) -> int:
    """``base + LOCAL_RANK``: one port per process of a node (LOCAL_RANK unset counts as 0)."""
    try:
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    except ValueError:
        local = 0
    return base + max(0, local)
