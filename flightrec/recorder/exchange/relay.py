"""One connection to the store per host: a host's ranks hear of dump requests, and answer them,
through the first of them to start (the host's relay).

At 131,072 ranks the store's one server thread is what the verdict in the log waits on: each
rank waiting on the request key costs it a wake-up (one write), each rank's read of the
request a read and a write, each rank's answer a read; about 40 us a rank on a loaded host,
5 s in all (``docs/inlog.md``). With a relay, only one process per host waits on the store
and reads the request; it tells the host's other ranks over a local socket, and sends their
answers on, several in one write: the server's cost per host, not per rank.

The relay listens on an abstract Unix socket (Linux; its name is made from the job's
namespace, the store's address and torchrun's restart count, so two jobs or two attempts on a
host never meet). The first process of the host to bind it is the relay (``Relay``); the
others connect (``Link``). Anything on the relay's side that fails hands the ranks back to the
store: a follower whose relay closed, or went silent for ``SILENT_S`` (its process stopped or
holds the GIL), waits on the store itself from then on, and a request posted meanwhile is
seen at once. Only answers that get no answer travel through the relay (a rank that may
report claims on its own connection), and only on the request thread's paths: the answers a
process gives on its way out (SIGTERM, an exception) go straight to the store.

Messages, relay to follower: ``H`` (a heartbeat, every ``HEARTBEAT_S``), ``R`` + (n, the
counter's and the description's lengths) + both, as the relay read them for request ``n``.
Follower to relay: a length, then store requests already encoded (``wire``), sent on as they
are.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from flightrec.errors import first_line

log = logging.getLogger("flightrec")
HEARTBEAT_S = 0.5
"""How often the relay tells its followers it is alive."""
SILENT_S = 3.0
"""A relay not heard from for this long is taken as gone (its process stopped, or holds the
GIL): its followers wait on the store themselves."""
MAX_FRAME = 16 * 1024
"""Bytes of one follower's answer at most (a summary is at most 3 KiB, a record 1 KiB)."""
SEND_S = 2.0
"""How long a follower's write to its relay may block."""
BACKLOG = 512
_REQUEST = struct.Struct("<QHH")
_LENGTH = struct.Struct("<I")
HEARTBEAT = b"H"
REQUEST = b"R"


def address(*parts: str) -> bytes:
    """The relay's abstract socket name for a job (``parts``: whatever tells the job, and this
    attempt of it, from any other on the host)."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return b"\0flightrec-relay-" + digest.encode()


def join(name: bytes, connect: Callable[[], Any]) -> Relay | Link | None:
    """Follow the host's relay at ``name``, or become it (``connect`` then opens the store
    connection the followers' answers go through); None where there is no such socket (not
    Linux) or neither works."""
    if not sys.platform.startswith("linux"):
        return None
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(SEND_S)
            sock.connect(name)
            if not same_user(sock):  # (someone else's: no relay, rather than theirs)
                sock.close()
                return None
            return Link(sock)
        except OSError:  # nobody listens (refused), or not in time
            sock.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(name)
            listener.listen(BACKLOG)
            listener.setblocking(False)
            return Relay(listener, connect)
        except OSError:  # taken a moment ago: follow that one
            listener.close()
    return None


class Relay:
    """The host's relay: tells its followers of each request, sends their answers on."""

    def __init__(self, listener: socket.socket, connect: Callable[[], Any]) -> None:
        self._listener = listener
        self._connect = connect
        self._followers: dict[int, tuple[socket.socket, bytearray]] = {}
        self._lock = threading.Lock()
        """Held while writing to followers (the request thread's ``announce`` and this
        thread's heartbeats) and while changing who they are."""
        self._stop = threading.Event()
        self.forwarded = 0
        """Answers sent on so far."""
        self._own: list[bytes] = []
        """This process's own answers, to go with the next write (``forward``)."""
        self._wake, self._woken = socket.socketpair()
        self._wake.setblocking(False)
        self._woken.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="flightrec-relay", daemon=True)
        self._thread.start()

    @property
    def followers(self) -> int:
        """Processes following this relay now."""
        return len(self._followers)

    def announce(self, n: int, count: bytes, text: bytes) -> None:
        """Tell every follower of request ``n`` (the counter and the description as read):
        from the request thread, as soon as it has read them."""
        self._broadcast(REQUEST + _REQUEST.pack(n, len(count), len(text)) + count + text)

    def forward(self, requests: Sequence[bytes]) -> bool:
        """This process's own answer: sent with the followers' (one write for the host);
        False once the relay has stopped (the caller sends it itself)."""
        payload = b"".join(requests)
        with self._lock:
            if self._stop.is_set():
                return False
            self._own.append(payload)
        with contextlib.suppress(OSError):  # (full: a wake-up is pending already)
            self._wake.send(b"w")
        return True

    def close(self) -> None:
        """Stop relaying: the followers see the socket close and wait on the store."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with self._lock:
            for sock, _ in self._followers.values():
                _shut(sock)
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _broadcast(self, message: bytes) -> None:
        with self._lock:
            for sock, _ in self._followers.values():
                try:
                    if sock.send(message) == len(message):
                        continue
                except OSError:
                    pass
                _shut(sock)  # (not reading: its process is stopped; the loop drops it)

    def _run(self) -> None:
        store: Any = None
        try:
            store = self._connect()
        except Exception as exc:
            log.debug("flightrec: no host relay: the store does not answer (%s)", exc)
            self._stop.set()
        sel = selectors.DefaultSelector()
        try:
            if not self._stop.is_set():
                sel.register(self._listener, selectors.EVENT_READ)
                sel.register(self._woken, selectors.EVENT_READ)
                self._serve(sel, store)
        except Exception as exc:
            if not self._stop.is_set():
                log.warning(
                    "flightrec: this host's ranks answer the store on their own from now on: "
                    "their relay failed (%s)",
                    first_line(exc),
                )
        finally:
            with self._lock:
                self._stop.set()
                lost, self._own = self._own, []
            if lost and store is not None:  # (taken before the relay failed: tried once more)
                with contextlib.suppress(Exception):
                    store.send(lost)
            sel.close()
            self._listener.close()
            self._wake.close()
            self._woken.close()
            with self._lock:
                for sock, _ in self._followers.values():
                    _shut(sock)
                    sock.close()
                self._followers.clear()
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()

    def _serve(self, sel: selectors.BaseSelector, store: Any) -> None:
        beat = time.monotonic() + HEARTBEAT_S
        while not self._stop.is_set():
            ready = sel.select(max(0.0, beat - time.monotonic()))
            batch: list[bytes] = []
            for key, _ in ready:
                if key.fileobj is self._listener:
                    self._accept(sel)
                elif key.fileobj is self._woken:
                    with contextlib.suppress(OSError):
                        self._woken.recv(4096)
                else:
                    self._read(sel, key.fd, batch)
            with self._lock:
                batch += self._own
                self._own = []
            if batch:
                store.send(batch)  # several ranks' answers, one write
                self.forwarded += len(batch)
            if time.monotonic() >= beat:
                self._broadcast(HEARTBEAT)
                beat = time.monotonic() + HEARTBEAT_S

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if not same_user(sock):  # (any process of the host may connect: ours only)
                sock.close()
                continue
            sock.setblocking(False)
            with self._lock:
                self._followers[sock.fileno()] = (sock, bytearray())
            sel.register(sock, selectors.EVENT_READ)

    def _read(self, sel: selectors.BaseSelector, fd: int, batch: list[bytes]) -> None:
        """Take what a follower sent: complete answers go into ``batch``; a follower gone, or
        one that sends what is no answer, is dropped."""
        sock, buf = self._followers[fd]
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        buf += data
        alive = bool(data)
        while alive and len(buf) >= _LENGTH.size:
            size = _LENGTH.unpack_from(buf)[0]
            if size > MAX_FRAME:
                alive = False  # (no answer of ours is this long)
            elif len(buf) < _LENGTH.size + size:
                return
            else:
                batch.append(bytes(buf[_LENGTH.size : _LENGTH.size + size]))
                del buf[: _LENGTH.size + size]
        if not alive:
            sel.unregister(sock)
            with self._lock:
                del self._followers[fd]
            sock.close()


class Link:
    """A follower's end: the requests its relay announces, the answers it sends on."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._send_lock = threading.Lock()
        self._closed = False

    def next_request(self, stop: threading.Event) -> tuple[int, bytes, bytes] | None:
        """Wait for the relay's next request: (n, the counter, the description); None when
        the relay is gone or silent for ``SILENT_S``, or ``stop`` is set (then the caller
        waits on the store itself)."""
        heard = time.monotonic()
        while not stop.is_set() and not self._closed:
            try:
                got = self._parse()
            except ValueError as exc:
                log.debug("flightrec: leaving the host relay: %s", exc)
                return None
            if got is not None:
                return got
            left = heard + SILENT_S - time.monotonic()
            if left <= 0:
                return None
            try:
                readable, _, _ = select.select([self._sock], [], [], left)
                if not readable:
                    return None
                data = self._sock.recv(1 << 16)
            except (OSError, ValueError):  # (closed by ``close``)
                return None
            if not data:
                return None
            self._buf += data
            heard = time.monotonic()
        return None

    def forward(self, requests: Sequence[bytes]) -> bool:
        """Send store requests that get no answer through the relay, in one piece; False
        when the relay cannot take them (the caller sends them itself)."""
        payload = b"".join(requests)
        if len(payload) > MAX_FRAME or self._closed:
            return False
        with self._send_lock:
            try:
                self._sock.sendall(_LENGTH.pack(len(payload)) + payload)
            except OSError:
                return False
        return True

    def close(self) -> None:
        """Leave the relay (a ``next_request`` under way returns None)."""
        if not self._closed:
            self._closed = True
            _shut(self._sock)
            self._sock.close()

    def _parse(self) -> tuple[int, bytes, bytes] | None:
        """The next request in what arrived (heartbeats skipped); None until one is whole.

        Raises:
            ValueError: the relay sent what is no message of ours.
        """
        buf = self._buf
        while buf[:1] == HEARTBEAT:
            del buf[:1]
        if buf and buf[:1] != REQUEST:
            raise ValueError(f"the host relay sent {bytes(buf[:1])!r}")
        if len(buf) < 1 + _REQUEST.size:
            return None
        n, count_len, text_len = _REQUEST.unpack_from(buf, 1)
        end = 1 + _REQUEST.size + count_len + text_len
        if len(buf) < end:
            return None
        at = 1 + _REQUEST.size
        count, text = bytes(buf[at : at + count_len]), bytes(buf[at + count_len : end])
        del buf[:end]
        return n, count, text


_CREDENTIALS = struct.Struct("3i")


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of a local socket runs as this one's user (an
    abstract socket is open to every process of the host's network namespace)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    except (OSError, AttributeError):
        return False
    uid: int = _CREDENTIALS.unpack(raw)[1]
    return uid == os.getuid()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
