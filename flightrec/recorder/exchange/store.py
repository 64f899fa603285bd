"""Dump requests through the job's rendezvous store.

A rank that sees a hang (or ``flightrec trigger`` from outside) posts request ``n``: it takes
the first free description key ``requests/<n>`` (``keys.Keys``) with one ``compare_set`` whose
value is ``"<rank> <REASON>"``, then leaves ``n`` in the counter ``requests``. Descriptions are
taken in order from 1; the counter is only where the next poster starts looking
(``first_free`` checks it: the store is shared, and a counter someone moved must not leave
the ranks listening where no request will come).

Every rank runs a thread that waits, on a connection of its own, for the description of the
next request: one server-side ``wait`` on one key that every rank waits on. Posting a request
is then six store calls whatever the job's size, and the server wakes the waiting ranks in
one pass over them (one write of one byte each). Woken, a rank reads the counter and the
description in one ``multi_get``, and registers its wait for the next request in the same
write: the server reads both with one system call and answers the read with one, and that is
all a request costs it per rank on this thread (and nothing while nothing happens). (Until
this design, the poster rang a doorbell key per rank in one ``multi_set``, which torch's libuv
server parses again from its start for every 4 KB that arrives: 45 s of server time at
131,072 ranks, during which the store answered no one. ``benchmarks/bench_store.py`` measures
both.)

The waiting thread speaks the store's protocol itself (``wire``): its wait ends at once when
the process stops it (``Poller.stop`` closes the connection), and a store that goes away is
one failed call, not a C++ stack trace in the job's log. A store that is no TCPStore (a
``FileStore``, a ``HashStore``), or one that does not answer as torch's TCPStore does, is
polled instead through torch's client, once every ``POLL_S``.
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
from flightrec.recorder.exchange import relay
from flightrec.recorder.exchange.keys import Keys, restart_count
from flightrec.recorder.exchange.wire import WireStore

log = logging.getLogger("flightrec")
RETRY_S = 0.5
"""Pause after a failed store call, times the number of failures in a row."""
MAX_FAILURES = 8
"""Store calls failing in a row before the thread gives up: the store is gone, the job ending."""
POLL_S = 1.0
"""How often a store that cannot be waited on (no TCPStore) is asked for the next request."""
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 30.0
"""How long a call on a connection of ours waits for its answer once connected. When a hang
is declared every rank answers at once: at 131,072 ranks the store's one thread takes
seconds to read them all (``docs/inlog.md``), and a call queued behind them is answered
late, not never (with 5 s, some ranks gave up publishing on a loaded host)."""
MIN_REQUEST_INTERVAL_NS = 1_000_000_000
"""At most one dump per second for requests, however many arrive (a flood fills no disk)."""
HANG_COVERS_NS = 5_000_000_000
"""A hang this process declared this recently: other ranks' requests for a hang need no
second dump here."""
MAX_LOOKAHEAD = 64
"""Request numbers examined per poll for the first one not posted by this process."""
MAX_POST_TRIES = 64
"""Description keys tried by one poster (each taken one means another request was posted)."""
RANK_DIED = "RANK_DIED"
"""The reason of the request a rank posts as it dies of an exception (``Exchange``)."""
ROUND_REASONS = ("WATCHDOG_TIMEOUT", "SIGNAL_TERM", RANK_DIED)
"""Requests that stand for an event every rank dumps for once (a hang, a stop, a death) and
that start a verdict exchange. A trigger (``CLI_TRIGGER``) only asks for dumps: it never
stands for a hang, so it never keeps the watchdog from declaring one."""
MAX_DESCRIPTIONS = 8
"""Request descriptions read per poll."""
REASONS = frozenset(pb.DumpReason.keys()) - {"REASON_UNSPECIFIED"} | {RANK_DIED}
"""The only reasons a request may name (anything else is read as no reason)."""
MAX_REQUEST_BYTES = 64
"""A request description is "<rank> <REASON>"; anything longer is not one of ours."""
MAX_RANK = 1 << 24
MAX_COUNT_BYTES = 19
MAX_REQUEST = 1 << 62
"""Request numbers stay below this (a counter read from the store is untrusted)."""


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


def connect(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A new client connection to a running job's TCPStore, through torch's client."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def own_connection(store: Any, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A connection of our own to ``store``, so a blocked request never stalls torch's client;
    opening it waits ``timeout_s`` at most (a clone of torch's client would retry for the
    store's own timeout, the process group's: 30 minutes by default, when the store's host is
    gone, with a thread of ours or the exit path waiting on it). Requests on it keep the
    store's own timeout."""
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


def wire_connection(store: Any, timeout_s: float = CONNECT_TIMEOUT_S) -> WireStore | None:
    """A connection speaking the protocol ourselves to ``store``'s server; None for a store
    that is no TCPStore, or whose server does not answer as torch's does (one debug line)."""
    host, port = getattr(store, "host", ""), getattr(store, "port", 0)
    if not host or not port:
        return None
    try:
        return answered_connection(host, int(port), timeout_s)
    except OSError as exc:
        log.debug("flightrec: polling the store for dump requests: %s", exc or "no answer")
        return None


def answered_connection(host: str, port: int, timeout_s: float, tries: int = 2) -> WireStore:
    """A ``WireStore`` whose calls wait ``CALL_TIMEOUT_S`` for their answers, tried again
    when the handshake gets no answer in ``timeout_s``.

    torch's libuv server looks up the name of every address that connects to it
    (``getnameinfo``) on its one thread; where the resolver does not answer at once (on this
    project's build machine, one query in about fifty waits out the resolver's 5 s timeout)
    the whole server stops for that long, and a handshake with a shorter timeout fails,
    while the next connection is answered.

    Raises:
        OSError: as ``WireStore``, after ``tries`` connections.
    """
    for attempt in range(tries):
        try:
            return WireStore(host, port, timeout_s, max(timeout_s, CALL_TIMEOUT_S))
        except TimeoutError:
            if attempt == tries - 1:
                raise
    raise ValueError("tries must be at least 1")


def _count(raw: bytes) -> int:
    """A counter's value read from the store (untrusted): 0 when it is no number."""
    return int(raw) if raw.isdigit() and len(raw) <= MAX_COUNT_BYTES else 0


def known_world_size(store: Any, keys: Keys) -> int:
    """The world size rank 0 registered; 0 when none did (or the value is not a number)."""
    if not store.check([keys.world]):
        return 0
    raw = bytes(store.get(keys.world))
    return int(raw) if raw.isdigit() and len(raw) < 9 else 0


def hint(store: Any, keys: Keys) -> int:
    """The request counter: the number of the last request posted, as its poster left it (a
    hint only: the store is shared with everything that can reach it, ``first_free`` checks)."""
    return _count(bytes(store.get(keys.requests))) if store.check([keys.requests]) else 0


def first_free(store: Any, keys: Keys, guess: int) -> int:
    """The first request number not described yet, from a guess (the counter).

    Descriptions are taken in order from 1, so the described numbers are 1 .. n - 1: checked
    at the guess and the next number (two ``check`` calls when the guess is right); a guess
    too high or too low is corrected by a binary search (a counter someone moved costs a few
    dozen calls once, not a channel no rank listens on).
    """

    def posted(n: int) -> bool:
        return n < 1 or bool(store.check([keys.request(n)]))

    guess = max(0, min(guess, MAX_REQUEST))
    if posted(guess):
        lo, hi, step = guess, guess + 1, 1  # lo: described, hi: to look at
        while posted(hi):
            if hi >= MAX_REQUEST:
                raise RuntimeError("no free dump request number")
            lo, step = hi, step * 2
            hi = min(lo + step, MAX_REQUEST)
    else:
        lo, hi = 0, guess
    while hi - lo > 1:  # lo described, hi free
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if posted(mid) else (lo, mid)
    return hi


def post_request(store: Any, keys: Keys, rank: int, reason: str) -> int:
    """Ask every rank to dump: describe the first free request number. Returns it.

    Raises:
        RuntimeError: ``MAX_POST_TRIES`` request numbers in a row were taken meanwhile.
    """
    store.compare_set(keys.requests, "", "0")  # (the counter exists before anyone reads it)
    n = first_free(store, keys, hint(store, keys))
    for _ in range(MAX_POST_TRIES):
        if _take(store, keys, rank, reason, n):
            return n
        n = first_free(store, keys, n)
    raise RuntimeError(f"{MAX_POST_TRIES} dump requests posted meanwhile: not posting another")


def _take(store: Any, keys: Keys, rank: int, reason: str, n: int) -> bool:
    """Describe request ``n`` unless another poster did; then leave ``n`` in the counter."""
    text = f"{rank} {reason}"
    if bytes(store.compare_set(keys.request(n), "", text)) != text.encode():
        return False
    # Set again, the same value: torch's legacy server (USE_LIBUV=0) wakes the waiting ranks
    # on a set, not on a compare_set (its libuv server, the default, wakes them on both).
    store.set(keys.request(n), text)
    store.set(keys.requests, str(n))
    return True


def request_reads(keys: Keys, n: int) -> tuple[list[str], list[str]]:
    """What a rank's request thread reads once request ``n`` is posted (the counter and the
    description, one ``multi_get``), and the wait it registers in the same write (request
    ``n + 1``'s description)."""
    return [keys.requests, keys.request(n)], [keys.request(n + 1)]


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


def read_request(store: Any, keys: Keys, n: int) -> tuple[int, str]:
    """(requesting rank, reason name) of request ``n``; (-1, "") when not described."""
    key = keys.request(n)
    return parse_request(bytes(store.get(key))) if store.check([key]) else (-1, "")


class Poller:
    """Waits for dump requests and calls ``on_request(n, requester, reason)`` for new ones, on
    a thread of its own (it returns whether a dump was written: what a trigger's
    acknowledgement says)."""

    def __init__(
        self,
        store: Any,
        namespace: str,
        on_request: Callable[[int, int, str], bool],
        *,
        rank: int = -1,
        world_size: int = 0,
        on_covered: Callable[[int, str], None] | None = None,
        relay_scope: str | None = "",
    ) -> None:
        """Connect (one connection of our own) and start the thread.

        Args:
            store: the default group's store (prefixes unwrapped).
            rank: this process's global rank.
            world_size: the job's ranks (rank 0 registers it for ``flightrec trigger``).
            on_covered: called with (n, reason) for another rank's hang request that this
                process's own recent hang dump stands for (``on_covered``).
            relay_scope: None: wait on the store whatever the host; else hear of requests
                through the host's relay (``relay``), the processes of one job whose scope
                is the same sharing one (the scope tells apart the simulated hosts of a
                benchmark; "" in a job).
        """
        self._source = store
        self.keys = Keys(namespace)
        self._on_request = on_request
        self.rank = rank
        self.world_size = world_size
        self._wire = wire_connection(store)
        self._store: Any = self._wire if self._wire is not None else own_connection(store)
        """The waiting thread's connection (ours, or torch's client when polling)."""
        self.own: set[int] = set()
        """Request numbers this process posted or already answered (no dump for them)."""
        self.posted: set[int] = set()
        """Request numbers this process posted (``start_round``): it offers to report their
        verdict whatever its rank (``verdict.CLAIMANTS``)."""
        if rank == 0 and world_size > 0:
            self._store.set(self.keys.world, str(world_size))
        self._store.compare_set(self.keys.requests, "", "0")  # (read below and when woken)
        self._seen = first_free(self._store, self.keys, hint(self._store, self.keys)) - 1
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
        self.on_covered = on_covered
        """Called with (n, reason) for another rank's hang request that this process's own
        recent hang dump stands for (no second dump): the verdict's round still needs this
        rank's answer, or it would blame it for none."""
        self.failing = False
        """The last store call of the waiting thread failed (the store's host went away):
        others skip the store calls that would only wait out its connect timeout."""
        self._post_store: Any = None
        self._post_lock = threading.Lock()
        self._stop = threading.Event()
        self.relay: relay.Relay | None = None
        """This process relays for its host (it waits on the store for them)."""
        self.link: relay.Link | None = None
        """This process follows its host's relay (None: it waits on the store itself)."""
        if self._wire is not None and relay_scope is not None:
            self._join_relay(relay_scope)
        self._thread = threading.Thread(target=self._run, name="flightrec-requests", daemon=True)
        self._thread.start()

    def _join_relay(self, scope: str) -> None:
        assert self._wire is not None
        name = relay.address(
            self.keys.root, self._wire.host, str(self._wire.port), restart_count(), scope
        )
        try:
            joined = relay.join(name, self.new_connection)
        except Exception as exc:  # no relay: this process waits on the store as before
            log.debug("flightrec: no host relay: %s", exc)
            return
        if isinstance(joined, relay.Relay):
            self.relay = joined
        else:
            self.link = joined

    @property
    def forwarder(self) -> relay.Relay | relay.Link | None:
        """Where this process's answers that get no answer go to reach the store with the
        host's others (None: on a connection of its own)."""
        return self.link or self.relay

    def _leave_relay(self) -> None:
        """The relay is gone or silent: wait on the store from now on."""
        link, self.link = self.link, None
        if link is not None:
            link.close()
            log.debug("flightrec: the host's relay is gone: waiting on the store")

    @property
    def waits(self) -> bool:
        """Whether the thread waits on the store (else it polls it every ``POLL_S``)."""
        return self._wire is not None

    def connection_source(self) -> Any:
        """The store to clone torch clients from (the exchange's, the slow check's)."""
        return self._source

    @property
    def seen(self) -> int:
        """Requests handled so far (the counter value last acted on)."""
        return self._seen

    def connection(self) -> Any:
        """A second connection, for threads other than the waiting one (ours where the store
        speaks the protocol: a call on it can never abort the process at exit). Callers hold
        ``post_lock``."""
        if self._post_store is None:
            self._post_store = self.new_connection()
        return self._post_store

    def new_connection(self, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
        """A further connection of its own for another part (the exchange, its reporter):
        ours where the store speaks the protocol, else torch's client; opening it waits
        ``timeout_s`` at most."""
        wire = wire_connection(self._source, timeout_s) if self._wire is not None else None
        return wire if wire is not None else own_connection(self._source, timeout_s)

    @property
    def post_lock(self) -> threading.Lock:
        """Held while using ``connection()``."""
        return self._post_lock

    def start_round(self, rank: int, reason: str, seen: int) -> tuple[bool, int]:
        """Post a request unless one newer than ``seen`` exists, atomically.

        Ranks that time out in the same collective at the same moment race here; the store's
        ``compare_set`` on request ``seen + 1``'s description lets one of them post, and the
        others learn its number (and take it as answered: they dumped for the hang already).

        Returns:
            (whether this process posted, the request number that stands for this event).
        """
        with self._post_lock:
            store = self.connection()
            n = seen + 1
            self.own.add(n)  # before posting: this process's own thread wakes for it too
            if not _take(store, self.keys, rank, reason, n):
                # Posted meanwhile: the newest request stands for this event.
                n = max(n, first_free(store, self.keys, n) - 1)
                self.own.add(n)
                self.latest = (n, "", time.monotonic_ns())
                return False, n
            self.own.add(n)
            self.posted.add(n)
            self.latest = (n, reason, time.monotonic_ns())
            return True, n

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop waiting; with ``wait_s``, wait that long for the thread to end (closing our
        connection ends its wait at once)."""
        self._stop.set()
        if self.relay is not None:
            self.relay.close()
        if self.link is not None:
            self.link.close()
        if self._wire is not None:
            self._wire.close()
        post = self._post_store
        if isinstance(post, WireStore):
            post.close()
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                nxt = self._seen + 1
                if self.link is not None:
                    announced = self._from_relay(nxt)
                    if announced is None:
                        continue
                    nxt, count, text = announced
                else:
                    if not self._next_posted(nxt):
                        continue  # (polling: not yet)
                    if self._stop.is_set():
                        return
                    count, text = self._read_request(nxt)
                    if self.relay is not None:  # the host's other ranks, before this one dumps
                        self.relay.announce(nxt, bytes(count), bytes(text))
                current = nxt
                if _count(bytes(count)) > nxt:  # (requests posted together; or a moved counter)
                    current = first_free(self._store, self.keys, nxt) - 1
                if self._handle(current, {nxt: parse_request(bytes(text))}):
                    # Answered (as one dump) once the interval is over.
                    self._stop.wait(MIN_REQUEST_INTERVAL_NS / 1e9)
                failures = 0
                self.failing = False
            except Exception:
                if self._stop.is_set():
                    return
                self.failing = True
                # The store lives in rank 0's process (or the agent's); when it goes away
                # the job is ending. Give up quietly after a few tries.
                failures += 1
                if failures >= MAX_FAILURES or self._stop.wait(RETRY_S * failures):
                    return
                self._reconnect()

    def _read_request(self, n: int) -> list[bytes]:
        """The counter and request ``n``'s description; waiting, the wait for request
        ``n + 1`` goes in the same write (the server reads both with one system call)."""
        keys, then_wait = request_reads(self.keys, n)
        if self._wire is not None:
            return self._wire.multi_get(keys, then_wait=then_wait)
        return list(self._store.multi_get(keys))

    def _next_posted(self, n: int) -> bool:
        """Wait until request ``n`` is posted (True), or, polling, look once (and pause).
        (A wait registered ahead for it, by ``_read_request``, only has its answer read.)"""
        key = self.keys.request(n)
        if self._wire is not None:
            return self._wire.wait([key])
        if self._store.check([key]):
            return True
        self._stop.wait(POLL_S)
        return False

    def _from_relay(self, n: int) -> tuple[int, bytes, bytes] | None:
        """The next request the host's relay announces, from ``n`` on: (its number, the
        counter, the description as the relay read them); None when there is none to act on
        (an older one, the thread stopping, or the relay gone: then it is left, and the next
        wait is on the store)."""
        link = self.link
        announced = link.next_request(self._stop) if link is not None else None
        if announced is None:
            if not self._stop.is_set():
                self._leave_relay()
            return None
        return announced if announced[0] >= n else None

    def _reconnect(self) -> None:
        if self._wire is None:
            return
        self._wire.close()
        try:
            wire = answered_connection(self._wire.host, self._wire.port, CONNECT_TIMEOUT_S, 1)
        except OSError:
            return  # the next call fails as fast, and counts
        if self._stop.is_set():
            wire.close()
        else:
            self._wire = self._store = wire

    def _hang_is_recent(self, now: int) -> bool:
        return bool(self.hang_ns) and now - self.hang_ns < HANG_COVERS_NS

    def _handle(self, current: int, known: dict[int, tuple[int, str]]) -> bool:
        """Act on requests up to ``current``; True when they must wait for the interval."""
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
                if n not in known:
                    try:
                        known[n] = read_request(self._store, self.keys, n)
                    except Exception:
                        known[n] = (-1, "")
                batch.append((n, *known[n]))
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
                self._store.append(self.keys.acknowledged(n, what), f"{self.rank},")
        except Exception as exc:  # the trigger then reports this rank as not answering
            log.debug("flightrec: could not acknowledge a dump request: %s", exc)
