"""The host relay's own protocol (``exchange.relay``) over real local sockets; the store it
sends answers on is a list here (``tests/integration/test_host_relay.py`` runs it against a
real TCPStore)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from flightrec.recorder.exchange import relay

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


class Store:
    """What the relay sends on: each write's requests."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def send(self, requests: list[bytes]) -> None:
        self.writes.append(list(requests))

    def close(self) -> None:
        pass


def _until(check: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def host() -> Iterator[tuple[relay.Relay, bytes, Store]]:
    name = relay.address("test", uuid.uuid4().hex)
    store = Store()
    first = relay.join(name, lambda: store)
    assert isinstance(first, relay.Relay)
    try:
        yield first, name, store
    finally:
        first.close()


def test_followers_hear_each_request_and_their_answers_go_on_whole(
    host: tuple[relay.Relay, bytes, Store],
) -> None:
    leader, name, store = host
    links = [relay.join(name, lambda: store) for _ in range(3)]
    assert all(isinstance(link, relay.Link) for link in links)
    assert _until(lambda: leader.followers == 3)
    leader.announce(7, b"7", b"3 WATCHDOG_TIMEOUT")
    stop = threading.Event()
    for link in links:
        assert isinstance(link, relay.Link)
        assert link.next_request(stop) == (7, b"7", b"3 WATCHDOG_TIMEOUT")
        assert link.forward([b"a" * 100, b"b" * 50])
    assert _until(lambda: sum(len(w) for w in store.writes) == 3)
    assert all(r == b"a" * 100 + b"b" * 50 for w in store.writes for r in w)
    # The relay's own process answers with its followers' (no connection of its own).
    assert leader.forward([b"own"])
    assert _until(lambda: store.writes[-1:] == [[b"own"]])
    assert leader.forwarded == 4
    # An answer too large for the relay is the caller's to send.
    link = links[0]
    assert isinstance(link, relay.Link)
    assert not link.forward([b"x" * (relay.MAX_FRAME + 1)])
    leader.close()
    assert not leader.forward([b"late"])  # a relay that stopped: the caller sends it


def test_a_follower_that_sends_no_answer_is_dropped_and_the_others_stay(
    host: tuple[relay.Relay, bytes, Store],
) -> None:
    leader, name, store = host
    good = relay.join(name, lambda: store)
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(name)
    assert _until(lambda: leader.followers == 2)
    bad.sendall((relay.MAX_FRAME + 1).to_bytes(4, "little") + b"junk")
    assert _until(lambda: leader.followers == 1)
    assert isinstance(good, relay.Link) and good.forward([b"answer"])
    assert _until(lambda: store.writes == [[b"answer"]])
    bad.close()


def test_a_link_leaves_a_relay_that_is_silent_closed_or_speaks_nonsense() -> None:
    stop = threading.Event()
    for what in (b"", b"Z", None):
        ours, theirs = socket.socketpair()
        link = relay.Link(ours)
        if what is None:
            ours.settimeout(None)
            started = time.monotonic()
            assert link.next_request(stop) is None  # silent: after SILENT_S
            assert time.monotonic() - started >= relay.SILENT_S - 0.1
        elif what:
            theirs.sendall(relay.HEARTBEAT * 3 + what)
            assert link.next_request(stop) is None
        else:
            theirs.close()
            assert link.next_request(stop) is None
        link.close()
        theirs.close()


def test_a_request_split_across_writes_and_heartbeats_reads_whole() -> None:
    ours, theirs = socket.socketpair()
    link = relay.Link(ours)
    message = relay.REQUEST + relay._REQUEST.pack(12, 2, 4) + b"12" + b"1 SI"

    def send() -> None:
        theirs.sendall(relay.HEARTBEAT)
        for i in range(len(message)):
            theirs.sendall(message[i : i + 1])
            time.sleep(0.002)

    t = threading.Thread(target=send)
    t.start()
    assert link.next_request(threading.Event()) == (12, b"12", b"1 SI")
    t.join()
    link.close()
    theirs.close()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # (the child only connects)
def test_a_process_of_another_user_is_no_follower(host: tuple[relay.Relay, bytes, Store]) -> None:
    leader, name, _ = host
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:  # (only system calls here, then _exit)
        try:
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(name)
            os.write(done_w, b"in")
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        assert os.read(done_r, 2) == b"in"
        ours = relay.join(name, Store)
        assert isinstance(ours, relay.Link)
        assert _until(lambda: leader.followers == 1)
        time.sleep(0.3)
        assert leader.followers == 1  # the stranger's connection was closed at accept
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(done_r)
        os.close(done_w)
