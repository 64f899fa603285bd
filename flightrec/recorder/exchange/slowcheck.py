"""The in-job slow check: every ``FLIGHTREC_SLOW_CHECK`` seconds, each rank publishes a digest of
its newest arrivals (``flightrec.format.digest``), and rank 0 gathers them and hands them to
the judge that ``flightrec.enable`` handed in (``flightrec.live.slow``), which prints a line
into the job's log when a rank is persistently late.

Off the hot path: the digest is made from a copy of the ring (one ``bytes()`` of the buffer,
then decoded here), on a thread of flightrec's own, with a store connection of its own
(``store.own_connection``); a store that stops answering ends the check (with one warning
after ``MAX_FAILURES`` checks in a row), never the job.

Checks happen at the same wall-clock instants on every rank (multiples of the interval), so
the digests overlap in the collectives they hold; rank 0 gathers a moment later (a quarter of
the interval, at most ``GATHER_DELAY_S``).

Store load per check: one ``set`` of at most ``digest.MAX_BYTES`` (about 0.8 KB per group
used, 64 collectives) per rank, to ``flightrec/<namespace>/slow/<rank>``, overwritten each
time (the store holds one digest per rank, never more); rank 0 adds one ``check`` and one
``multi_get`` per 1,024 ranks. At 16,384 ranks with one group in use: 16,384 sets and 32 gather
requests, about 13 MB written and 13 MB read, once per interval (at the default 60 s: about
275 requests and 440 KB a second at the store). Rank 0 gathers the whole 13 MB itself: past
some tens of thousands of ranks the interval should grow with the job (docs/slow-ranks.md).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from flightrec.format.activity import WINDOW, ring_activity, signature
from flightrec.format.digest import MAX_GROUPS, MAX_PER_GROUP, Digest, GroupDigest, encode
from flightrec.format.slot import COMPLETED, SLOT
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import own_connection

log = logging.getLogger("flightrec")
GATHER_DELAY_S = 1.0
"""How long after a check's instant rank 0 gathers (the other ranks publish at the instant);
at most a quarter of the interval."""
STOP_WAIT_S = 2.0
MAX_FAILURES = 3
"""Checks failing in a row (the store gone) before the check gives up, with one line."""
GATHER_CHUNK = 1024

Judge = Callable[[Mapping[int, bytes]], None]
"""Takes the digests gathered at one check, by rank; must not raise."""


def make_digest(
    snapshot: bytes,
    groups: list[tuple[str, int]],
    rank: int,
    world_size: int,
    host: str,
    device: str,
    base_ns: int,
    taken_ns: int,
) -> Digest:
    """The digest of a ring snapshot.

    Args:
        snapshot: a copy of the ring's buffer.
        groups: (key, member count) per group index of the recorder's registry.
        base_ns: added to the ring's monotonic times to put them on the wall clock.
        taken_ns: when (wall clock).

    Returns:
        Per group with two or more members, the newest ``MAX_PER_GROUP`` completed
        collectives; the ``MAX_GROUPS`` groups with the most recent completions; and the
        rank's own time and P2P peers (``format.activity.ring_activity``).
    """
    per: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    slots = []
    for v in SLOT.iter_unpack(snapshot):
        # (rid, enqueue, complete, state, seq, p2p_seq, group, op, reduce_op, peer, ..., flags, rid)
        if v[0] and v[0] == v[-1]:
            slots.append(v)
            if v[3] == COMPLETED and v[4] and v[1] and v[2]:
                per[v[6]].append((v[4], v[1] + base_ns, v[2] + base_ns))
    made: list[tuple[int, GroupDigest]] = []
    for index, rows in per.items():
        if index >= len(groups) or groups[index][1] < 2:
            continue
        rows.sort()
        rows = rows[-MAX_PER_GROUP:]
        key, members = groups[index]
        g = GroupDigest(
            key, members, tuple(r[0] for r in rows), tuple(r[1] for r in rows),
            tuple(r[2] for r in rows),
        )  # fmt: skip
        made.append((rows[-1][2], g))
    made.sort(key=lambda x: -x[0])
    chosen = tuple(g for _, g in made[:MAX_GROUPS])
    slots.sort(key=lambda v: v[0])
    newest = slots[-WINDOW:]  # (what ring_activity measures)
    activity = ring_activity(
        [v[1] for v in newest],
        [v[2] if v[3] == COMPLETED else 0 for v in newest],
        [v[15] for v in newest],
        [signature(v[7], v[6], v[15], v[9]) for v in newest],
        [v[9] for v in newest],
    )
    return Digest(rank, world_size, taken_ns, host, device, chosen, activity)


class SlowCheck:
    """This process's part in the slow check, on a thread of its own."""

    def __init__(
        self,
        source: Any,
        recorder: Any,
        rank: int,
        world_size: int,
        namespace: str,
        interval_s: float,
        judge: Callable[[], Judge] | None,
        device: Callable[[], str] | None = None,
    ) -> None:
        """Start the thread.

        Args:
            source: a store connection to clone one of our own from (never used here).
            recorder: the process's recorder (its ring and group registry are read).
            judge: on the reporting rank, what makes the judge (called at the first check, on
                this thread: it loads the analysis); None elsewhere.
            device: tells this rank's device (asked at the first check, on this thread).
        """
        self._source = source
        self._recorder = recorder
        self.rank = rank
        self.world_size = world_size
        self.namespace = namespace
        self.interval_s = interval_s
        self._make_judge = judge
        self._judge: Judge | None = None
        self._host = socket.gethostname()
        self._device_of = device
        self._device: str | None = None
        self._store: Any = None
        self._stop = threading.Event()
        self.checks = 0
        """Checks done (digests published)."""
        self.cost_s = 0.0
        """Thread CPU time of the checks so far (making and publishing; gathering and judging
        on rank 0)."""
        self._thread = threading.Thread(target=self._run, name="flightrec-slowcheck", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop checking; wait up to ``wait_s`` for a store call under way to end."""
        self._stop.set()
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        first = 0.0
        failures = 0
        # Connected now, while the store is surely there: a first connection opened at a
        # check as the job ends (its store's host gone) would keep this thread inside torch's
        # client when the interpreter exits. A failure here is retried at the first check.
        with contextlib.suppress(Exception):
            self._connection()
        while not self._stop.is_set():
            now = time.time()
            at = (int(max(now, first) / self.interval_s) + 1) * self.interval_s
            if self._stop.wait(at - now):
                return
            started = time.thread_time()
            try:
                self.publish()
                if self._make_judge is not None and self._judge is None:
                    # Loaded at the first check (the analysis: a fraction of a second of
                    # imports, seconds on a busy machine), not at start-up, which a short job
                    # never gets past; the next check judges one interval later, so that no
                    # window holds the collectives this rank was late at while loading.
                    self._load_judge()
                    first = time.time() + self.interval_s
                elif self._judge is not None:
                    if self._stop.wait(min(GATHER_DELAY_S, self.interval_s / 4)):
                        return
                    self.gather()
                failures = 0
            except Exception as exc:
                # The store went away (the job is ending: rank 0's process hosts it) or does
                # not answer: quietly at first, then one line, and no more checks.
                failures += 1
                if failures >= MAX_FAILURES and not self._stop.is_set():
                    # A connection the store's host closed or refuses is the job ending (or
                    # that host dying, which the hang path reports): not worth a line.
                    level = logging.DEBUG if _connection_lost(exc) else logging.WARNING
                    log.log(level, "flightrec: the slow check stopped: %s", exc)
                if failures >= MAX_FAILURES:
                    return
            self.checks += 1
            self.cost_s += time.thread_time() - started

    def _load_judge(self) -> None:
        make = self._make_judge
        try:
            self._judge = make() if make is not None else None
        except Exception as exc:
            log.warning("flightrec: no slow check: %s", exc)
            self._make_judge = None

    def _connection(self) -> Any:
        if self._store is None:
            self._store = own_connection(self._source)
        return self._store

    def digest(self) -> bytes:
        """This rank's digest now."""
        rec = self._recorder
        groups = [(g.name, len(g.ranks)) for g in list(rec.groups.groups)]
        if self._device is None:
            self._device = self._device_of() if self._device_of is not None else ""
        base = time.time_ns() - time.monotonic_ns()
        d = make_digest(
            rec.ring.snapshot(), groups, self.rank, self.world_size, self._host,
            self._device, base, time.time_ns(),
        )  # fmt: skip
        return encode(d)

    def publish(self) -> None:
        """Publish this rank's digest (one store request)."""
        self._connection().set(Keys(self.namespace).slow(self.rank), self.digest())

    def gather(self) -> None:
        """Read every rank's digest and hand them to the judge."""
        store = self._connection()
        ranks = list(range(self.world_size))
        raw: dict[int, bytes] = {}
        for i in range(0, len(ranks), GATHER_CHUNK):
            chunk = ranks[i : i + GATHER_CHUNK]
            keys = [Keys(self.namespace).slow(r) for r in chunk]
            if not store.check(keys):  # some rank has not published yet: get would block
                chunk = [r for r, k in zip(chunk, keys, strict=True) if store.check([k])]
                keys = [Keys(self.namespace).slow(r) for r in chunk]
            if chunk:
                raw.update(zip(chunk, (bytes(v) for v in store.multi_get(keys)), strict=True))
        if self._judge is not None:
            self._judge(raw)


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the store's connection is gone: refused, reset or a broken pipe,
    as Python's sockets or torch's client (``DistNetworkError``) raise it."""
    if isinstance(exc, (ConnectionError, EOFError)):
        return True
    return type(exc).__name__ == "DistNetworkError"
