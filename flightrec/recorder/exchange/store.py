"""Dump requests through the job's rendezvous store.

A rank that sees a hang (or ``flightrec trigger`` from outside) bumps one counter:
``flightrec/<namespace>/dump_request``. Request number ``n`` is described by
``flightrec/<namespace>/dump_request/<n>`` = ``"<rank> <REASON>"``. Then the poster rings every
rank's doorbell, ``flightrec/<namespace>/dump_request/bell/<rank>``, with one ``multi_set``.

Every rank runs a thread with its own store connection (so blocking on the store never touches
the connection torch uses) that sits in a server-side ``wait`` on its own doorbell: no request
at all while nothing happens (polling the counter 4 times a second cost 65,000 requests per
second at 16,384 ranks; see ``benchmarks/bench_store.py``). Woken, it clears the bell, reads the
counter and dumps when the counter moved past what it has seen. The counter stays the truth:
a poster bumps it before ringing, and the thread clears its bell before reading it, so no
request is lost between the two. A doorbell of its own is also how a rank stops its thread at
exit: it rings itself (a thread left inside a store call at interpreter exit can abort the
process). Rank 0 writes the world size to ``flightrec/<namespace>/world`` so that
``flightrec trigger`` knows which bells to ring.

Keys are absolute on the underlying TCPStore (torch's prefix stores are unwrapped), so an
outside client connected to MASTER_ADDR:MASTER_PORT sees the same keys as the workers.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flightrec.format import flightrec_pb2 as pb

log = logging.getLogger("flightrec")
WAIT_S = 86_400.0
"""How long one wait on the doorbell lasts before it is re-armed. Every poster rings the bells,
so this is no polling period: a wait that times out makes torch print a warning line into the
job's log, so it is rare."""
RETRY_S = 0.5
"""Pause after a failed store call, times the number of failures in a row."""
MAX_FAILURES = 8
"""Store calls failing in a row before the thread gives up: the store is gone, the job ending."""
MAX_BELLS = 1 << 20
"""Most doorbells one request rings (a world size read from the store is untrusted)."""
DEFAULT_NAMESPACE = "default"
MIN_REQUEST_INTERVAL_NS = 1_000_000_000
"""At most one dump per second for requests, however many arrive (a flood fills no disk)."""
HANG_COVERS_NS = 5_000_000_000
"""A hang this process declared this recently: other ranks' requests for a hang need no
second dump here."""
MAX_LOOKAHEAD = 64
"""Request numbers examined per poll for the first one not posted by this process."""
RANK_DIED = "RANK_DIED"
"""The reason of the request a rank posts as it dies of an exception (``Exchange``)."""
ROUND_REASONS = ("WATCHDOG_TIMEOUT", "SIGNAL_TERM", RANK_DIED)
"""Requests that stand for an event every rank dumps for once (a hang, a stop, a death) and
that start a verdict exchange. A trigger (``CLI_TRIGGER``) only asks for dumps: it never
stands for a hang, so it never keeps the watchdog from declaring one."""
MAX_DESCRIPTIONS = 8
"""Request descriptions read per poll (each may wait briefly for a poster that is mid-post)."""
REASONS = frozenset(pb.DumpReason.keys()) - {"REASON_UNSPECIFIED"} | {RANK_DIED}
"""The only reasons a request may name (anything else is read as no reason)."""
MAX_REQUEST_BYTES = 64
"""A request description is "<rank> <REASON>"; anything longer is not one of ours."""
MAX_RANK = 1 << 24
LEAVE_POLL_S = 0.01
"""How often the store's host looks whether every rank's thread is out, at the end."""


def request_key(namespace: str) -> str:
    """The counter every rank polls."""
    return f"flightrec/{namespace or DEFAULT_NAMESPACE}/dump_request"


def bell_key(namespace: str, rank: int) -> str:
    """The doorbell rank ``rank`` waits on."""
    return f"{request_key(namespace)}/bell/{rank}"


def out_key(namespace: str) -> str:
    """Counts the ranks whose request thread has left its store wait for good (at their end)."""
    return f"flightrec/{namespace or DEFAULT_NAMESPACE}/out"


def world_key(namespace: str) -> str:
    """Where rank 0 leaves the world size for ``flightrec trigger``."""
    return f"flightrec/{namespace or DEFAULT_NAMESPACE}/world"


def _raw_store(store: Any) -> Any:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def default_store() -> Any:
    """The default process group's store, prefixes unwrapped; None when there is none."""
    import torch.distributed.distributed_c10d as c10d

    try:
        return _raw_store(c10d._get_default_store())
    except Exception:
        return None


def store_address() -> str:
    """ "host:port" of the default group's TCPStore, or "" for other stores."""
    store = default_store()
    host, port = getattr(store, "host", ""), getattr(store, "port", 0)
    return f"{host}:{port}" if host else ""


def connect(host: str, port: int, timeout_s: float = 5.0) -> Any:
    """A new client connection to a running job's TCPStore."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


CONNECT_S = 10.0
"""Longest a connection of flightrec's own takes to open. A clone of torch's client would
retry for the store's own timeout (the process group's: 30 minutes by default) when the
store's host is gone, with a thread of ours, or the exit path, waiting on it."""


def own_connection(store: Any, timeout_s: float = CONNECT_S) -> Any:
    """A connection of our own to ``store``, so a blocked request never stalls torch's client;
    opening it waits ``timeout_s`` at most. Requests on it keep the store's own timeout."""
    host, port = getattr(store, "host", ""), getattr(store, "port", 0)
    if not host or not port:  # not a TCPStore: as torch would open another client
        try:
            return store.clone()
        except Exception:
            return store
    # A store whose host is gone refuses at once, where torch's client retries until its
    # timeout, printing a C++ stack trace into the job's log at each try: a plain TCP
    # connection first (the store's server takes it, and its close, without a word).
    with socket.create_connection((host, port), timeout=timeout_s):
        pass
    conn = connect(host, port, timeout_s)
    with contextlib.suppress(Exception):
        conn.set_timeout(store.timeout)
    return conn


def ring(store: Any, namespace: str, world_size: int, skip: int = -1) -> None:
    """Ring the doorbells of ranks ``0 .. world_size - 1`` (but ``skip``) in one request."""
    keys = [bell_key(namespace, r) for r in range(min(world_size, MAX_BELLS)) if r != skip]
    if keys:
        store.multi_set(keys, ["1"] * len(keys))


def known_world_size(store: Any, namespace: str) -> int:
    """The world size rank 0 registered; 0 when none did (or the value is not a number)."""
    key = world_key(namespace)
    if not store.check([key]):
        return 0
    raw = bytes(store.get(key))
    return int(raw) if raw.isdigit() and len(raw) < 9 else 0


def post_request(
    store: Any, namespace: str, rank: int, reason: str, world_size: int | None = None
) -> int:
    """Ask every rank to dump. Returns the request number.

    Args:
        world_size: the bells to ring; None reads it from the store (``flightrec trigger``).
    """
    key = request_key(namespace)
    n = int(store.add(key, 1))
    store.set(f"{key}/{n}", f"{rank} {reason}")
    ring(store, namespace, known_world_size(store, namespace) if world_size is None else world_size)
    return n


def parse_request(raw: bytes) -> tuple[int, str]:
    """(requesting rank, reason name) from a request description read from the store.

    The store is shared with everything that can reach MASTER_ADDR:MASTER_PORT, so the value
    is untrusted: only a rank in range and a reason from the fixed vocabulary (the dump
    reasons' names) are kept; anything else reads as (-1, ""). Nothing from it is ever used
    in a file name or executed.
    """
    if len(raw) > MAX_REQUEST_BYTES:
        return -1, ""
    rank_text, _, reason = raw.decode("ascii", "replace").partition(" ")
    try:
        rank = int(rank_text)
    except ValueError:
        rank = -1
    if not -1 <= rank < MAX_RANK:
        rank = -1
    return rank, reason if reason in REASONS else ""


def read_request(store: Any, namespace: str, n: int) -> tuple[int, str]:
    """(requesting rank, reason name) of request ``n``; (-1, "") when not (yet) described."""
    key = f"{request_key(namespace)}/{n}"
    for _ in range(3):  # the poster sets the description just after bumping the counter
        if store.check([key]):
            return parse_request(bytes(store.get(key)))
        time.sleep(0.05)
    return -1, ""


class Poller:
    """Waits on this rank's doorbell and calls ``on_request(n, requester, reason)`` for new
    requests, on a thread of its own (it returns whether a dump was written: what a trigger's
    acknowledgement says)."""

    def __init__(
        self,
        store: Any,
        namespace: str,
        on_request: Callable[[int, int, str], bool],
        *,
        rank: int = -1,
        world_size: int = 0,
    ) -> None:
        """Connect (one connection of our own) and start the thread.

        Args:
            rank: this process's global rank: the doorbell it waits on.
            world_size: the doorbells this process rings when it posts a request.
        """
        self._store = own_connection(store)
        self._namespace = namespace
        self._on_request = on_request
        self.rank = rank
        self.world_size = world_size
        self.own: set[int] = set()
        """Request numbers this process posted or already answered (no dump for them)."""
        self._bell = bell_key(namespace, rank)
        if rank == 0 and world_size > 0:
            self._store.set(world_key(namespace), str(world_size))
        self._seen = int(self._store.add(request_key(namespace), 0))
        self.last_request_ns = 0
        """Monotonic time this process last dumped for another process's request."""
        self.last_round_ns = 0
        """Monotonic time this process last dumped for another rank's round (``ROUND_REASONS``):
        a hang pending since before then is one that rank declared, and this dump covers it."""
        self.latest: tuple[int, str, int] = (0, "", 0)
        """The newest request this process took part in: its number, its reason (empty when
        another rank posted it and this one learned only its number) and when (monotonic ns).
        A SIGTERM soon after joins that round instead of starting one of its own."""
        self.hang_ns = 0
        """Monotonic time this process declared a hang (its own dump stands for the requests
        other ranks post for the same hang)."""
        self.on_covered: Callable[[int, str], None] | None = None
        """Called with (n, reason) for another rank's hang request that this process's own
        recent hang dump stands for (no second dump): the verdict's round still needs this
        rank's answer, or it would blame it for none."""
        self.failing = False
        """The last store call of the waiting thread failed (the store's host went away):
        others skip the store calls that would only wait out its connect timeout."""
        self._post_store: Any = None
        self._post_lock = threading.Lock()
        self._stop = threading.Event()
        self._waiting = False
        self._thread = threading.Thread(target=self._run, name="flightrec-requests", daemon=True)
        self._thread.start()

    def connection_source(self) -> Any:
        """The store to clone further connections from (never called on by other threads)."""
        return self._store

    @property
    def seen(self) -> int:
        """Requests handled so far (the counter value last acted on)."""
        return self._seen

    def connection(self) -> Any:
        """A second connection, for threads other than the waiting one (a TCPStore client is
        not meant to be shared between threads, and the waiting one is blocked). Callers hold
        ``post_lock``."""
        if self._post_store is None:
            self._post_store = own_connection(self._store)
        return self._post_store

    @property
    def post_lock(self) -> threading.Lock:
        """Held while using ``connection()``."""
        return self._post_lock

    def post(self, rank: int, reason: str, unless_past: int | None = None) -> bool:
        """Ask every other rank to dump (this one already did).

        Args:
            unless_past: skip posting when the counter already moved past this value: another
                rank detected the same hang first and every rank is dumping for it.

        Returns:
            Whether a request was posted.
        """
        if unless_past is None:
            with self._post_lock:
                n = post_request(self.connection(), self._namespace, rank, reason, 0)
                self.own.add(n)
                self.latest = (n, reason, time.monotonic_ns())
                ring(self.connection(), self._namespace, self.world_size, skip=self.rank)
            return True
        return self.start_round(rank, reason, unless_past)[0]

    def start_round(self, rank: int, reason: str, seen: int) -> tuple[bool, int]:
        """Post a request unless one newer than ``seen`` exists, atomically.

        Ranks that time out in the same collective at the same moment race here; the store's
        ``compare_set`` lets one of them post, and the others learn its number (and take it as
        answered: they dumped for the hang already). Two ranks can both believe they posted
        it when another moved the counter between their two calls (microseconds apart): then
        the same request is described and rung twice, which is harmless.

        Returns:
            (whether this process posted, the request number that stands for this event).
        """
        key = request_key(self._namespace)
        with self._post_lock:
            store = self.connection()
            current = int(store.add(key, 0))
            if current > seen:  # posted meanwhile: that request stands for this event
                self.own.add(current)
                self.latest = (current, "", time.monotonic_ns())
                return False, current
            now = bytes(store.compare_set(key, str(seen), str(seen + 1)))
            n = int(now) if now.isdigit() and len(now) < 20 else seen + 1
            self.own.add(n)
            if n != seen + 1:
                self.latest = (n, "", time.monotonic_ns())
                return False, n
            store.set(f"{key}/{n}", f"{rank} {reason}")
            self.latest = (n, reason, time.monotonic_ns())
            ring(store, self._namespace, self.world_size, skip=self.rank)
            return True, n

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop waiting; with ``wait_s``, wait that long for the thread to end.

        The thread sits in a store call, so this rings our own bell to get it out. Waiting
        matters at the end of a process: a daemon thread still inside a store call when the
        interpreter finalizes is ended from within torch's C++ frames, which aborts the
        process ("terminate called without an active exception") after the job finished.
        """
        self._stop.set()
        if self._waiting:
            # On a helper thread: connecting can take long when the store is unreachable, and
            # exit must not wait for that longer than ``wait_s``.
            threading.Thread(target=self._ring_self, name="flightrec-stop", daemon=True).start()
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def leave(self, wait_s: float = 0.0) -> None:
        """After ``stop``: count this rank's thread out of the store for good. With ``wait_s``
        (in the process whose end takes the store down), first wait up to that long until
        every rank's thread is out.

        A rank whose thread is still inside its wait when the store goes makes torch log a
        C++ warning with a stack trace into that rank's log ("Connection was likely closed")
        at a normal end, and ranks reach their end milliseconds to seconds apart. Nothing is
        waited for when the store is already failing or this thread did not get out.
        """
        if self.failing or self._thread.is_alive():
            return
        key = out_key(self._namespace)
        try:
            with self._post_lock:
                out = int(self.connection().add(key, 1))
            deadline = time.monotonic() + wait_s
            while out < self.world_size and time.monotonic() < deadline:
                time.sleep(LEAVE_POLL_S)  # (the lock is free meanwhile: a SIGTERM may post)
                with self._post_lock:
                    out = int(self.connection().add(key, 0))
        except Exception:
            pass  # the store is gone: nobody is left waiting on it

    def _ring_self(self) -> None:
        try:
            with self._post_lock:
                self.connection().set(self._bell, "stop")
        except Exception:
            pass  # the store is gone: its connection closed, and the wait returned with it

    def _run(self) -> None:
        failures = 0
        key = request_key(self._namespace)
        deferred = False
        while not self._stop.is_set():
            try:
                if not deferred:
                    # Cleared before the counter is read: a request posted after this rings
                    # again, one posted before is in the counter.
                    self._store.delete_key(self._bell)
                current = int(self._store.add(key, 0))
                if not self._stop.is_set():
                    deferred = self._handle(key, current)
                if self._stop.is_set():
                    return
                if deferred:  # answered (as one dump) once the interval is over
                    self._stop.wait(MIN_REQUEST_INTERVAL_NS / 1e9)
                    continue
                self._waiting = True
                if not self._stop.is_set():
                    self._store.wait([self._bell], timedelta(seconds=WAIT_S))
                self._waiting = False
                failures = 0
                self.failing = False
            except Exception:
                self._waiting = False
                self.failing = not self._stop.is_set()
                # The store lives in rank 0's process (or the agent's); when it goes away
                # the job is ending. Give up quietly after a few tries.
                failures += 1
                if failures >= MAX_FAILURES or self._stop.wait(RETRY_S * failures):
                    return

    def _hang_is_recent(self, now: int) -> bool:
        return bool(self.hang_ns) and now - self.hang_ns < HANG_COVERS_NS

    def _handle(self, key: str, current: int) -> bool:
        """Act on the counter's value; True when a request must wait for the interval."""
        if current <= self._seen:
            return False
        now = time.monotonic_ns()
        if self.last_request_ns and now - self.last_request_ns < MIN_REQUEST_INTERVAL_NS:
            return True
        # Requests that arrived together get one dump. The counter is untrusted: look at a
        # bounded number of them, however far it jumped.
        batch: list[tuple[int, int, str]] = []
        for n in range(self._seen + 1, min(current, self._seen + MAX_LOOKAHEAD) + 1):
            if n not in self.own and len(batch) < MAX_DESCRIPTIONS:
                try:
                    requester, reason = read_request(self._store, self._namespace, n)
                except Exception:
                    requester, reason = -1, ""
                batch.append((n, requester, reason))
        # The dump names the first round among them (a hang, a stop, a death) when there is
        # one: that round's verdict needs this rank's answer, whatever trigger came with it.
        rounds = [b for b in batch if b[2] in ROUND_REASONS]
        first = rounds[0] if rounds else batch[0] if batch else None
        triggers = [b[0] for b in batch if b[2] == "CLI_TRIGGER"]
        if first is not None:  # before ``seen`` moves: a reader of both sees this round
            self.latest = (first[0], first[2], now)
        self._seen = current
        if first is None:
            return False
        if first[2] == "WATCHDOG_TIMEOUT" and self._hang_is_recent(now):
            self.own.add(first[0])  # this rank dumped for the hang as it declared it
            if self.on_covered is not None:
                self.on_covered(first[0], first[2])
            if not triggers:
                return False
            first = next(b for b in batch if b[2] == "CLI_TRIGGER")  # a trigger still gets one
        self.last_request_ns = now
        if first[2] in ROUND_REASONS:
            self.last_round_ns = now
        dumped = self._on_request(*first)
        if triggers:
            self._acknowledge(triggers, dumped)
        return False

    def _acknowledge(self, numbers: list[int], dumped: bool) -> None:
        """Tell ``flightrec trigger`` that this rank answered requests ``numbers``: it wrote
        its dump (``dumped``), or tried and could not (its log says why)."""
        what = "dumped" if dumped else "failed"
        try:
            for n in numbers:
                self._store.append(f"{request_key(self._namespace)}/{n}/{what}", f"{self.rank},")
        except Exception as exc:  # the trigger then reports this rank as not answering
            log.debug("flightrec: could not acknowledge a dump request: %s", exc)
