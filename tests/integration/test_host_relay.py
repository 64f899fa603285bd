"""One connection to the store per host (``exchange.relay``), against a real TCPStore server:
one process of a host waits on the store and tells the others; their answers reach the store
through it; a relay that dies or stops hands its ranks back to the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flightrec.format.read import read_dump
from flightrec.recorder.exchange import relay
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import Poller, post_request
from flightrec.recorder.exchange.verdict import Exchange
from flightrec.recorder.exchange.wire import WireStore
from tests.integration.stores import store_server

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
ROOT = Path(__file__).resolve().parents[2]
RELAY = """
import sys, time
from types import SimpleNamespace
from flightrec.recorder.exchange.store import Poller
store = SimpleNamespace(host="127.0.0.1", port=int(sys.argv[1]))
p = Poller(store, "job", lambda n, r, why: True, rank=0, world_size=8, relay_scope=sys.argv[2])
print("relay" if p.relay is not None else "follower", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def port() -> Iterator[int]:
    with store_server("libuv") as (port, _):
        yield port


class Heard:
    """What each poller's ``on_request`` was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, str]] = []

    def of(self, rank: int) -> Callable[[int, int, str], bool]:
        def on_request(n: int, requester: int, reason: str) -> bool:
            self.calls.append((rank, n, requester, reason))
            return True

        return on_request

    def wait_for(self, count: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.calls) < count and time.monotonic() < deadline:
            time.sleep(0.01)


def _where(port: int) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(host="127.0.0.1", port=port)


def test_one_process_waits_on_the_store_for_its_host_and_the_answers_go_through_it(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[int] = []
    real_wait = WireStore.wait

    def counting_wait(self: WireStore, keys: list[str], timeout_s: float | None = None) -> bool:
        waited.append(id(self))
        return real_wait(self, keys, timeout_s)

    monkeypatch.setattr(WireStore, "wait", counting_wait)
    heard = Heard()
    pollers = [
        Poller(_where(port), "job", heard.of(r), rank=r, world_size=128, relay_scope="a")
        for r in range(100, 104)
    ]
    try:
        first, others = pollers[0], pollers[1:]
        assert first.relay is not None and first.link is None
        assert all(p.link is not None and p.relay is None for p in others)
        deadline = time.monotonic() + 10
        while first.relay.followers < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first.relay.followers == 3
        poster = WireStore("127.0.0.1", port)
        n = post_request(poster, Keys("job"), 5, "WATCHDOG_TIMEOUT")
        heard.wait_for(4)
        assert sorted(heard.calls) == [(r, n, 5, "WATCHDOG_TIMEOUT") for r in range(100, 104)]
        # Only the relay's connection ever waited on the store.
        assert set(waited) == {id(first._wire)}
        # A follower's answer (not a rank that may report) reaches the store through it.
        follower = Exchange(others[0], 101, 128, "job", lambda rnd: None)
        dump = read_dump(next((ROOT / "samples" / "stalled_rank").glob("*.frdump")))
        dump.header.rank, dump.header.world_size = 101, 128
        follower.on_dump(dump, None)
        follower.after_request(n, "WATCHDOG_TIMEOUT")
        keys = Keys("job")
        while not poster.check([keys.round(n, "ranks")]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poster.get(keys.round(n, "ranks")) == b"101,"
        assert poster.check([keys.summary(101)])
        assert first.relay.forwarded == 1
        assert follower._store is None  # no store connection of its own was needed
    finally:
        for p in pollers:
            p.stop(wait_s=5)


def _relay_process(port: int, scope: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", RELAY, str(port), scope],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "relay"
    return proc


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_relay_that_dies_or_stops_hands_its_ranks_back_to_the_store(port: int, how: str) -> None:
    proc = _relay_process(port, how)
    heard = Heard()
    pollers: list[Poller] = []
    try:
        pollers = [
            Poller(_where(port), "job", heard.of(r), rank=r, world_size=8, relay_scope=how)
            for r in (1, 2)
        ]
        assert all(p.link is not None for p in pollers)
        time.sleep(0.5)
        if how == "killed":
            proc.kill()
            proc.wait(10)
        else:
            os.kill(proc.pid, signal.SIGSTOP)
        poster = WireStore("127.0.0.1", port)
        posted = time.monotonic()
        n = post_request(poster, Keys("job"), 0, "WATCHDOG_TIMEOUT")
        heard.wait_for(2)
        took = time.monotonic() - posted
        assert sorted(heard.calls) == [(r, n, 0, "WATCHDOG_TIMEOUT") for r in (1, 2)]
        assert all(p.link is None for p in pollers)  # each waits on the store now
        # A relay that closed is left at once; a stopped one once silent for SILENT_S.
        assert took < relay.SILENT_S + 10
    finally:
        for p in pollers:
            p.stop(wait_s=5)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)
