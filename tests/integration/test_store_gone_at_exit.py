"""A thread of ours, or the job's own exit path, never waits out the store's timeout on a store
whose host is gone: connections of flightrec's own open within a bound of their own (a real
TCPStore client on loopback, nothing listening where the store was)."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

pytest.importorskip("torch.distributed")

from flightrec.recorder.exchange.store import own_connection
from flightrec.recorder.exchange.verdict import EXIT_CONNECT_S, Exchange
from tests.integration.jobs import free_port

STORE_TIMEOUT = timedelta(seconds=120)
"""The store's own timeout (a process group's is 30 minutes by default)."""


def gone_store() -> SimpleNamespace:
    """What flightrec clones its connections from, as torch's TCPStore client shows it, once
    the process that hosted the store has exited."""
    return SimpleNamespace(host="127.0.0.1", port=free_port(), timeout=STORE_TIMEOUT)


def test_a_connection_of_our_own_opens_within_its_own_bound() -> None:
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - torch's DistNetworkError or a RuntimeError
        own_connection(gone_store(), timeout_s=1.0)
    assert time.monotonic() - started < 5, "waited on the store's own timeout"


def test_a_live_store_keeps_its_own_timeout_for_requests() -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
    conn = own_connection(server, timeout_s=1.0)
    conn.set("k", "v")
    assert bytes(server.get("k")) == b"v"
    assert conn.timeout == STORE_TIMEOUT


def test_the_exit_path_says_it_left_in_bounded_time_when_the_store_is_gone() -> None:
    """``destroy_process_group()`` (or exit) tells the store this rank left; with the store's
    host gone (rank 0 exited first), that costs the job ``EXIT_CONNECT_S``, not the store's
    timeout."""
    gone = gone_store()
    poller = SimpleNamespace(
        new_connection=lambda timeout_s: own_connection(gone, timeout_s), failing=False
    )
    ex = Exchange(poller, 1, 4, "job", lambda rnd: None)  # type: ignore[arg-type]
    started = time.monotonic()
    ex.after_exit()
    took = time.monotonic() - started
    assert took < EXIT_CONNECT_S + 3, took
    assert ex.store_gone  # and nothing else on the way out waits on it again
