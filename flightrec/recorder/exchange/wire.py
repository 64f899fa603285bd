"""torch's TCPStore protocol, the part flightrec speaks itself: no torch import, and a wait that
another thread can end.

``flightrec trigger`` used to import torch for its store client (4 to 9 s on a busy machine);
each rank's request thread used to sit in torch's client, where a wait cannot be ended from
outside (the thread rang a doorbell key of its own to get out) and a store that goes away makes
torch log a C++ stack trace. This client is a plain socket: ``close()`` from any thread ends a
wait at once, and a store that goes away is one ``OSError``.

The protocol, as torch's client (``torch/csrc/distributed/c10d/TCPStore.cpp``) and both of its
servers (the libuv one, the default since torch 2.4, and the legacy one, ``USE_LIBUV=0``) speak
it; checked against torch 2.13 and 2.14 by ``tests/integration/test_store_wire.py``:

- a request is one byte (``Query``) and its arguments; a string or a value is a ``uint64``
  length and its bytes; integers are native (little-endian on every platform torch ships);
- every key carries the prefix ``"/"`` that torch's ``TCPStore`` adds (its prefix stores add
  theirs before that), so both clients see the same keys;
- a connection starts with ``VALIDATE`` and the magic number (no answer), then ``PING`` with a
  nonce, answered with the same nonce: a server that answers anything else, or closes the
  connection, does not speak this protocol (``ProtocolError``);
- ``SET``, ``APPEND`` and ``MULTI_SET`` get no answer; ``GET`` and ``MULTI_GET`` answer a key
  that does not exist with an empty value on the libuv server (torch's client waits for the
  keys first: callers here ``check`` or ``wait`` first); ``WAIT`` answers ``STOP_WAITING``
  once every key exists, and a ``CANCEL_WAIT`` after it is answered ``WAIT_CANCELED``;
- both servers go on answering a connection's later requests while its ``WAIT`` is
  registered, in order; its ``STOP_WAITING`` comes whenever the keys do.

What a request costs the server is mostly the system calls around it: one read for what
arrived on a connection (however many requests it holds), one write per answer. Requests
sent together therefore cost it about as much as one (``send``, ``compare_set(first=...)``,
``multi_get(then_wait=...)``; ``benchmarks/bench_store.py --mode events`` measures it), and a
``WAIT`` registered in the same write as a read costs nothing more. While such a wait is
registered, a request that gets an answer first cancels it (its ``STOP_WAITING`` could
otherwise come in the middle of that answer).

Limits of the libuv server that a request must respect: at most ``MAX_KEYS`` keys in one
request, keys of at most ``MAX_KEY_BYTES``, values of at most ``MAX_VALUE_BYTES``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import TypeVar

MAGIC = 0x3C85F7CE
"""torch's ``validationMagicNumber``: the first thing a client sends."""
KEY_PREFIX = b"/"
"""What torch's ``TCPStore`` puts before every key."""
MAX_KEYS = 128 * 1024
MAX_KEY_BYTES = 8 * 1024
MAX_VALUE_BYTES = 8 * 1024 * 1024
MAX_REPLY_BYTES = 1 << 30
"""A reply announcing more than this is no reply of a store flightrec talks to."""

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_T = TypeVar("_T")


class Query(IntEnum):
    """torch's ``QueryType``, in its order (``TCPStoreBackend.hpp``)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13


READY = 0
"""``CheckResponseType.READY``: every key checked exists."""
STOP_WAITING = 0
WAIT_CANCELED = 1


class ProtocolError(OSError):
    """The peer answered something torch's TCPStore server never answers."""


def _key(key: str | bytes) -> bytes:
    raw = KEY_PREFIX + (key.encode() if isinstance(key, str) else key)
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"store key of {len(raw)} bytes (the server takes {MAX_KEY_BYTES})")
    return _U64.pack(len(raw)) + raw


def _value(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) > MAX_VALUE_BYTES:
        raise ValueError(f"store value of {len(raw)} bytes (the server takes {MAX_VALUE_BYTES})")
    return _U64.pack(len(raw)) + raw


def _keys(keys: Sequence[str | bytes]) -> bytes:
    if len(keys) > MAX_KEYS:
        raise ValueError(f"{len(keys)} keys in one request (the server takes {MAX_KEYS})")
    return _U64.pack(len(keys)) + b"".join(_key(k) for k in keys)


def encode_set(key: str | bytes, value: str | bytes) -> bytes:
    """A ``SET`` request (no answer)."""
    return bytes([Query.SET]) + _key(key) + _value(value)


def encode_append(key: str | bytes, value: str | bytes) -> bytes:
    """An ``APPEND`` request (no answer)."""
    return bytes([Query.APPEND]) + _key(key) + _value(value)


def encode_compare_set(key: str | bytes, expected: str | bytes, desired: str | bytes) -> bytes:
    """A ``COMPARE_SET`` request (answered with the value the key holds after it)."""
    return bytes([Query.COMPARE_SET]) + _key(key) + _value(expected) + _value(desired)


def encode_wait(keys: Sequence[str | bytes]) -> bytes:
    """A ``WAIT`` request (answered once every key exists)."""
    return bytes([Query.WAIT]) + _keys(keys)


def encode_multi_get(keys: Sequence[str | bytes]) -> bytes:
    """A ``MULTI_GET`` request (answered with one value per key)."""
    return bytes([Query.MULTI_GET]) + _keys(keys)


def encode_add(key: str | bytes, amount: int) -> bytes:
    """An ``ADD`` request (answered with the new value)."""
    return bytes([Query.ADD]) + _key(key) + _I64.pack(amount)


def handshake(nonce: int) -> bytes:
    """What a client sends first: ``VALIDATE`` with the magic number, then ``PING``."""
    return bytes([Query.VALIDATE]) + _U32.pack(MAGIC) + bytes([Query.PING]) + _U32.pack(nonce)


class WireStore:
    """A client of a TCPStore server, over one connection, without torch.

    Calls are serialised on a lock; ``close()`` takes none, so another thread can end a
    ``wait`` (the waiting call then raises ``OSError``).
    """

    def __init__(
        self, host: str, port: int, timeout_s: float = 5.0, call_timeout_s: float | None = None
    ) -> None:
        """Connect and check that the peer speaks the protocol.

        ``call_timeout_s``: how long a later call waits for its answer (default
        ``timeout_s``): a server that answered the handshake is alive, and one that every
        rank's answer reaches at once answers late, not never.

        Raises:
            OSError: nothing accepts the connection, or answers, within ``timeout_s``.
            ProtocolError: the peer does not answer the ping as a TCPStore server does.
        """
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: tuple[str | bytes, ...] | None = None
        """The keys of a ``WAIT`` sent ahead (``multi_get(then_wait=...)``), not answered yet."""
        self._sock: socket.socket = socket.create_connection((host, port), timeout=timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.getpid() & 0xFFFFFFFF
            self._sock.sendall(handshake(nonce))
            try:
                answer = _U32.unpack(self._recv(4))[0]
            except ConnectionError as exc:  # (a TimeoutError stays one: no answer at all)
                raise ProtocolError(
                    f"{host}:{port} does not answer as torch's TCPStore does ({exc})"
                ) from None
            if answer != nonce:
                raise ProtocolError(
                    f"{host}:{port} does not answer as torch's TCPStore does "
                    f"(ping {nonce:#x} answered {answer:#x})"
                )
        except BaseException:
            self._sock.close()
            raise
        if call_timeout_s is not None:
            self.timeout_s = call_timeout_s
            self._sock.settimeout(call_timeout_s)

    # -- requests ------------------------------------------------------------------------------
    def set(self, key: str | bytes, value: str | bytes) -> None:
        """Set ``key`` (no answer: the server takes it in order with what follows)."""
        self._send(encode_set(key, value))

    def append(self, key: str | bytes, value: str | bytes) -> None:
        """Append to ``key``'s value (creating it)."""
        self._send(encode_append(key, value))

    def send(self, requests: Sequence[bytes]) -> None:
        """Requests that get no answer (``encode_set``, ``encode_append``), in one write: the
        server reads them with one system call."""
        self._send(b"".join(requests))

    def multi_set(self, keys: Sequence[str | bytes], values: Sequence[str | bytes]) -> None:
        """Set several keys in one request (keep it small: the libuv server reparses a request
        from its start each time more of it arrives, so its cost grows with its square)."""
        if len(keys) != len(values):
            raise ValueError("multi_set: as many values as keys")
        body = b"".join(_key(k) + _value(v) for k, v in zip(keys, values, strict=True))
        self._send(bytes([Query.MULTI_SET]) + _U64.pack(len(keys)) + body)

    def get(self, key: str | bytes) -> bytes:
        """``key``'s value (check first: a missing key reads as empty, or fails)."""
        return self._ask(bytes([Query.GET]) + _key(key), self._read_value)

    def multi_get(
        self, keys: Sequence[str | bytes], then_wait: Sequence[str | bytes] = ()
    ) -> list[bytes]:
        """The values of ``keys`` (which must exist), in one request.

        ``then_wait``: keys to ``wait`` for next, registered in the same write (the next
        ``wait`` for exactly these keys only reads its answer).
        """
        if not then_wait:
            return self._ask(encode_multi_get(keys), lambda: [self._read_value() for _ in keys])
        with self._lock:
            self._settle()
            self._sock.sendall(encode_multi_get(keys) + encode_wait(then_wait))
            self._waiting = tuple(then_wait)
            return [self._read_value() for _ in keys]

    def add(self, key: str | bytes, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` (created at 0); returns the new value."""
        return self._ask(encode_add(key, amount), lambda: int(_I64.unpack(self._recv(8))[0]))

    def compare_set(
        self,
        key: str | bytes,
        expected: str | bytes,
        desired: str | bytes,
        first: Sequence[bytes] = (),
    ) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected``
        is empty); returns what it holds after (``expected`` when missing and not empty).

        ``first``: requests that get no answer, sent ahead of it in the same write."""
        request = encode_compare_set(key, expected, desired)
        return self._ask(b"".join((*first, request)), self._read_value)

    def check(self, keys: Sequence[str | bytes]) -> bool:
        """Whether every key exists."""
        return self._ask(
            bytes([Query.CHECK]) + _keys(keys), lambda: bool(self._recv(1)[0] == READY)
        )

    def delete_key(self, key: str | bytes) -> bool:
        """Delete ``key``; whether it existed."""
        return self._ask(
            bytes([Query.DELETE_KEY]) + _key(key), lambda: bool(_I64.unpack(self._recv(8))[0] == 1)
        )

    def num_keys(self) -> int:
        """How many keys the store holds."""
        return self._ask(bytes([Query.GETNUMKEYS]), lambda: int(_I64.unpack(self._recv(8))[0]))

    def wait(self, keys: Sequence[str | bytes], timeout_s: float | None = None) -> bool:
        """Block until every key exists: True; False after ``timeout_s`` (the server's wait is
        cancelled, as torch's client does). ``close()`` from another thread ends it with an
        ``OSError``. A wait for these keys sent ahead (``multi_get(then_wait=...)``) is not
        sent again; one for other keys is cancelled first."""
        with self._lock:
            if self._waiting != tuple(keys):
                self._settle()
                self._sock.sendall(encode_wait(keys))
            self._waiting = None
            self._sock.settimeout(timeout_s)
            try:
                answer = self._recv(1)[0]
            except TimeoutError:
                answer = -1
            finally:
                if not self._closed:
                    self._sock.settimeout(self.timeout_s)
            if answer == STOP_WAITING:
                return True
            if answer != -1:
                raise ProtocolError(f"{self.host}:{self.port}: wait answered {answer}")
            self._cancel()
            return False

    def close(self) -> None:
        """Close the connection; a ``wait`` under way in another thread ends at once."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # (not connected any more)
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    @property
    def socket(self) -> socket.socket:
        """The connection, past its handshake (``benchmarks/`` send prepared requests on it)."""
        return self._sock

    @property
    def closed(self) -> bool:
        """``close()`` was called."""
        return self._closed

    # -- plumbing ------------------------------------------------------------------------------
    def _cancel(self) -> None:
        """Cancel the registered wait (its ``STOP_WAITING``, if it came first, is read too)."""
        self._sock.sendall(bytes([Query.CANCEL_WAIT]))
        answer = self._recv(1)[0]
        if answer == STOP_WAITING:  # the keys came just before the cancel did
            answer = self._recv(1)[0]
        if answer != WAIT_CANCELED:
            raise ProtocolError(f"{self.host}:{self.port}: cancel answered {answer}")

    def _settle(self) -> None:
        """Before a request that gets an answer: no wait sent ahead may still be registered."""
        if self._waiting is not None:
            self._waiting = None
            self._cancel()

    def _send(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def _ask(self, data: bytes, read: Callable[[], _T]) -> _T:
        with self._lock:
            self._settle()
            self._sock.sendall(data)
            return read()

    def _read_value(self) -> bytes:
        size = _U64.unpack(self._recv(8))[0]
        if size > MAX_REPLY_BYTES:
            raise ProtocolError(f"{self.host}:{self.port}: a value of {size} bytes announced")
        return self._recv(size)

    def _recv(self, size: int) -> bytes:
        if size == 0:
            return b""
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError(f"{self.host}:{self.port} closed the connection")
            got += n
        return bytes(buf)
