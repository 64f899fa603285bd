"""flightrec's own client of torch's TCPStore protocol (``exchange.wire``) against real torch
servers, both ways: each call answered as torch's client sees it, on the libuv server (the
default) and the legacy one; dump requests reaching every rank's poller on both; and
``flightrec trigger`` without torch.

A server of another torch version: set ``FLIGHTREC_OTHER_TORCH_PYTHON`` to a Python whose torch
is that version (the checks then run against a server started there too)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import (
    CALL_TIMEOUT_S,
    Poller,
    answered_connection,
    first_free,
    post_request,
)
from flightrec.recorder.exchange.wire import ProtocolError, WireStore, encode_append, encode_set
from tests.integration.stores import store_server

torch = pytest.importorskip("torch")
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVERS = [("this", "libuv"), ("this", "legacy")]
OTHER = os.environ.get("FLIGHTREC_OTHER_TORCH_PYTHON", "")
if OTHER:
    SERVERS += [("other", "libuv"), ("other", "legacy")]


@pytest.fixture(params=SERVERS, ids=["-".join(s) for s in SERVERS])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, str]]:
    """(port, torch version) of a TCPStore server in a process of its own."""
    which, backend = request.param
    with store_server(backend, OTHER if which == "other" else sys.executable) as running:
        yield running


def torch_client(port: int) -> TCPStore:
    from datetime import timedelta

    return TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def test_every_call_reads_as_torchs_client_reads_it(server: tuple[int, str]) -> None:
    port, _ = server
    ours, theirs = WireStore("127.0.0.1", port), torch_client(port)
    theirs.set("flightrec/a", "from torch")
    assert theirs.get("flightrec/a") == b"from torch"  # taken in (a set has no answer)
    assert ours.check(["flightrec/a"]) and not ours.check(["flightrec/a", "flightrec/none"])
    assert ours.get("flightrec/a") == b"from torch"
    ours.set("flightrec/b", b"\x00\xffours")
    assert theirs.get("flightrec/b") == b"\x00\xffours"
    assert ours.add("n", 5) == 5 and theirs.add("n", 1) == 6 and ours.add("n", 0) == 6
    assert ours.compare_set("c", "", "1") == b"1"
    assert theirs.compare_set("c", "1", "2") == b"2"
    assert ours.compare_set("c", "1", "3") == b"2"  # not what it holds: unchanged
    # (Two connections: each one's requests are in order; a reply says all before it is in.)
    ours.append("l", "0,")
    assert ours.check(["l"])
    theirs.append("l", "1,")
    assert theirs.get("l") == b"0,1," and ours.get("l") == b"0,1,"
    ours.multi_set(["m/1", "m/2"], ["x", "y"])
    assert theirs.multi_get(["m/1", "m/2"]) == ours.multi_get(["m/1", "m/2"]) == [b"x", b"y"]
    assert ours.delete_key("m/1") and not ours.delete_key("m/1")
    assert not theirs.check(["m/1"])
    assert ours.num_keys() == theirs.num_keys()
    ours.close()


def test_a_wait_ends_when_the_key_comes_when_it_times_out_or_when_closed(
    server: tuple[int, str],
) -> None:
    port, _ = server
    ours, theirs = WireStore("127.0.0.1", port), torch_client(port)
    assert ours.wait(["later"], timeout_s=0.2) is False  # cancelled, as torch's client does
    threading.Timer(0.2, lambda: theirs.set("later", "1")).start()
    assert ours.wait(["later"]) is True
    assert ours.get("later") == b"1"  # the connection is still in step after both
    other = WireStore("127.0.0.1", port)
    threading.Timer(0.2, other.close).start()
    started = time.monotonic()
    with pytest.raises(OSError):
        other.wait(["never"])
    assert time.monotonic() - started < 5
    ours.close()
    # The recorder's connections: the handshake within the connect timeout, then each call
    # waits longer for its answer (a server every rank answers at once answers late), and a
    # timed wait leaves it so.
    recorders = answered_connection("127.0.0.1", port, 2.0)
    assert recorders.socket.gettimeout() == CALL_TIMEOUT_S
    assert recorders.wait(["never"], timeout_s=0.2) is False
    assert recorders.socket.gettimeout() == CALL_TIMEOUT_S
    recorders.close()


def test_a_wait_sent_with_a_read_and_requests_sent_together(
    server: tuple[int, str], request: pytest.FixtureRequest
) -> None:
    # What a rank sends when a request wakes it (the read and the next wait in one write) and
    # when it answers (its requests in one write): each answered as when sent one by one.
    if request.node.callspec.id.endswith("legacy"):
        # torch's legacy server (use_libuv=False) closes a connection around a WAIT now and
        # then (2 of 12 fresh servers here, pipelined or not); the Poller reconnects and
        # retries (Poller._reconnect), so a job sees a late wake-up, not a lost request.
        pytest.skip("the legacy server drops a waiting connection now and then; libuv's does not")
    port, _ = server
    ours, theirs = WireStore("127.0.0.1", port), torch_client(port)
    theirs.set("d/1", "x")
    assert ours.multi_get(["d/1"], then_wait=["d/2"]) == [b"x"]
    threading.Timer(0.2, lambda: theirs.set("d/2", "y")).start()
    assert ours.wait(["d/2"], timeout_s=20) is True  # registered already: only read
    assert ours.get("d/2") == b"y"  # in step
    # A request that gets an answer, while such a wait is registered, cancels it first: its
    # answer is never taken for the wait's, nor the other way round.
    ours.multi_get(["d/1"], then_wait=["d/3"])
    assert ours.get("d/1") == b"x"
    theirs.set("d/3", "z")
    assert theirs.get("d/3") == b"z"  # (taken in: the server orders no two connections)
    assert ours.check(["d/3"]) and ours.get("d/3") == b"z"
    theirs.set("d/4", "w")  # a wait answered at once, before the cancel
    assert theirs.get("d/4") == b"w"
    ours.multi_get(["d/1"], then_wait=["d/4"])
    assert ours.get("d/4") == b"w" and ours.get("d/1") == b"x"
    ours.multi_get(["d/1"], then_wait=["d/5"])  # a wait for other keys: cancelled, then sent
    assert ours.wait(["d/4"], timeout_s=20) is True and ours.get("d/1") == b"x"
    ours.send([encode_set("q/a", "1"), encode_append("q/l", "0,"), encode_append("q/l", "1,")])
    assert ours.compare_set("q/c", "", "me", first=[encode_append("q/l", "2,")]) == b"me"
    assert theirs.get("q/l") == b"0,1,2," and theirs.get("q/a") == b"1"
    ours.close()


def test_a_peer_that_is_no_store_is_told_apart() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_nonsense() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_nonsense, daemon=True).start()
        with pytest.raises(ProtocolError, match="does not answer as torch's TCPStore does"):
            WireStore("127.0.0.1", port, timeout_s=5)


def test_a_request_reaches_every_ranks_poller(server: tuple[int, str]) -> None:
    port, _ = server
    theirs = torch_client(port)
    answered: list[tuple[int, int, int, str]] = []

    def callback(rank: int):  # type: ignore[no-untyped-def]
        def on_request(n: int, requester: int, reason: str) -> bool:
            answered.append((rank, n, requester, reason))
            return True

        return on_request

    pollers = [Poller(theirs, "job", callback(r), rank=r, world_size=4) for r in range(4)]
    try:
        assert all(p.waits for p in pollers)  # a wait on the store, no polling
        trigger = WireStore("127.0.0.1", port)
        n = post_request(trigger, Keys("job"), -1, "CLI_TRIGGER")
        deadline = time.monotonic() + 20
        while len(answered) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(answered) == [(r, n, -1, "CLI_TRIGGER") for r in range(4)]
        key = Keys("job").acknowledged(n, "dumped")
        while not trigger.check([key]) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Someone moved the counter: the next request still reaches every rank.
        theirs.set(Keys("job").requests, str(10**15))
        assert first_free(trigger, Keys("job"), 10**15) == n + 1
        time.sleep(1.1)  # (one request-driven dump per second)
        answered.clear()
        posted, m = pollers[2].start_round(2, "WATCHDOG_TIMEOUT", pollers[2].seen)
        assert posted and m == n + 1
        # A rank that timed out at the same moment finds the round posted.
        assert pollers[3].start_round(3, "WATCHDOG_TIMEOUT", n) == (False, m)
        while len(answered) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # The poster does not dump again for its own round; the others do.
        assert {(0, m, 2, "WATCHDOG_TIMEOUT"), (1, m, 2, "WATCHDOG_TIMEOUT")} <= set(answered)
        assert all(rank != 2 for rank, *_ in answered), answered
    finally:
        started = time.monotonic()
        for p in pollers:
            p.stop(wait_s=5)
        assert time.monotonic() - started < 5  # their waits end when their connections close


def test_trigger_imports_no_torch(server: tuple[int, str], tmp_path: Path) -> None:
    port, _ = server
    torch_client(port).set(Keys().world, "2")
    code = (
        "import sys\n"
        "from flightrec_cli.app import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
    out = subprocess.run(
        [sys.executable, "-c", code, "trigger", "--host", "127.0.0.1", "--port", str(port),
         "--wait", "0.2"],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out  # no rank answers: nothing runs there
    assert "0 of 2 ranks answered within 0.2 s (request 1 at 127.0.0.1:" in out.stderr, out
    assert out.stderr.rstrip().endswith("no torch"), out.stderr
