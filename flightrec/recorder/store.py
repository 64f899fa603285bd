"""Dump requests through the job's rendezvous store.

A rank that sees a hang (or ``flightrec trigger`` from outside) bumps one counter with the
store's atomic ``add``: ``flightrec/<namespace>/dump_request``. Request number ``n`` is
described by ``flightrec/<namespace>/dump_request/<n>`` = ``"<rank> <REASON>"``. Every rank runs
a poller thread with its own store connection (so blocking on the store never touches the
connection torch uses) and dumps when the counter moves past what it has seen.

Keys are absolute on the underlying TCPStore (torch's prefix stores are unwrapped), so an
outside client connected to MASTER_ADDR:MASTER_PORT sees the same keys as the workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flightrec.format import flightrec_pb2 as pb

log = logging.getLogger("flightrec")
POLL_S = 0.25
"""Seconds between polls: every rank dumps well within a second of a request."""
DEFAULT_NAMESPACE = "default"
MIN_REQUEST_INTERVAL_NS = 1_000_000_000
"""At most one dump per second for requests, however many arrive (a flood fills no disk)."""
MAX_LOOKAHEAD = 64
"""Request numbers examined per poll for the first one not posted by this process."""
REASONS = frozenset(pb.DumpReason.keys()) - {"REASON_UNSPECIFIED"}
"""The only reasons a request may name (anything else is read as no reason)."""
MAX_REQUEST_BYTES = 64
"""A request description is "<rank> <REASON>"; anything longer is not one of ours."""
MAX_RANK = 1 << 24


def request_key(namespace: str) -> str:
    """The counter every rank polls."""
    return f"flightrec/{namespace or DEFAULT_NAMESPACE}/dump_request"


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


def own_connection(store: Any) -> Any:
    """A connection of our own to ``store``, so a blocked request never stalls torch's client."""
    try:
        return store.clone()
    except Exception:
        host, port = getattr(store, "host", ""), getattr(store, "port", 0)
        return connect(host, port) if host else store


def post_request(store: Any, namespace: str, rank: int, reason: str) -> int:
    """Ask every rank to dump. Returns the request number."""
    key = request_key(namespace)
    n = int(store.add(key, 1))
    store.set(f"{key}/{n}", f"{rank} {reason}")
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
    """Watches the request counter and calls ``on_request(n, requester, reason)`` for new ones."""

    def __init__(
        self, store: Any, namespace: str, on_request: Callable[[int, int, str], None]
    ) -> None:
        self._store = own_connection(store)
        self._namespace = namespace
        self._on_request = on_request
        self.own: set[int] = set()
        """Request numbers this process posted itself (it already dumped for them)."""
        self._seen = int(self._store.add(request_key(namespace), 0))
        self.last_request_ns = 0
        """Monotonic time this process last dumped for another process's request."""
        self._post_store: Any = None
        self._post_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flightrec-requests", daemon=True)
        self._thread.start()

    @property
    def seen(self) -> int:
        """Requests handled so far (the counter value last acted on)."""
        return self._seen

    def post(self, rank: int, reason: str, unless_past: int | None = None) -> bool:
        """Ask every other rank to dump (this one already did).

        Args:
            unless_past: skip posting when the counter already moved past this value: another
                rank detected the same hang first and every rank is dumping for it.

        Returns:
            Whether a request was posted.
        """
        with self._post_lock:
            # A second connection: a TCPStore client is not meant to be shared between
            # threads, and the poller thread owns the first one.
            if self._post_store is None:
                self._post_store = own_connection(self._store)
            key = request_key(self._namespace)
            if unless_past is not None and int(self._post_store.add(key, 0)) > unless_past:
                return False
            n = post_request(self._post_store, self._namespace, rank, reason)
            self.own.add(n)
            return True

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop polling; with ``wait_s``, wait that long for the thread to end.

        Waiting matters at the end of a process: a daemon thread still inside a store call when
        the interpreter finalizes is ended from within torch's C++ frames, which aborts the
        process ("terminate called without an active exception") after the job finished.
        """
        self._stop.set()
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        failures = 0
        key = request_key(self._namespace)
        while not self._stop.wait(POLL_S):
            try:
                current = int(self._store.add(key, 0))
                failures = 0
            except Exception:
                # The store lives in rank 0's process (or the agent's); when it goes away
                # the job is ending. Give up quietly after a few tries.
                failures += 1
                if failures >= 8:
                    return
                continue
            if current <= self._seen:
                continue
            now = time.monotonic_ns()
            if self.last_request_ns and now - self.last_request_ns < MIN_REQUEST_INTERVAL_NS:
                continue  # not consumed: answered (as one dump) once the interval is over
            # Requests that arrived together (every waiting rank times out at about the
            # same moment) get one dump, naming the first of them. The counter is untrusted:
            # look at a bounded number of them, however far it jumped.
            first: tuple[int, int, str] | None = None
            for n in range(self._seen + 1, min(current, self._seen + MAX_LOOKAHEAD) + 1):
                if n not in self.own:
                    try:
                        requester, reason = read_request(self._store, self._namespace, n)
                    except Exception:
                        requester, reason = -1, ""
                    first = (n, requester, reason)
                    break
            self._seen = current
            if first is not None:
                self.last_request_ns = now
                self._on_request(*first)


def request_dump(host: str, port: int, namespace: str = "", timeout_s: float = 5.0) -> int:
    """Ask every rank of a running job to dump (``flightrec trigger``).

    Args:
        host: address of the job's rendezvous TCPStore (MASTER_ADDR).
        port: its port (MASTER_PORT).
        namespace: the job's FLIGHTREC_JOB_ID, if it set one.
        timeout_s: how long to try to connect.

    Returns:
        The request number; every rank dumps (reason CLI_TRIGGER) within about a second.

    Raises:
        TorchMissingError: torch is not installed here.
        UsageError: no store answers at host:port.
    """
    from flightrec.errors import TorchMissingError, UsageError

    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        raise TorchMissingError() from None
    try:
        store = connect(host, port, timeout_s)
        return post_request(store, namespace, -1, "CLI_TRIGGER")
    except Exception as exc:
        raise UsageError(f"no job store answers at {host}:{port} ({exc})") from None
