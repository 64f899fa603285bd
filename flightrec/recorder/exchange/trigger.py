"""``flightrec trigger``'s half: find a running job's store, ask every rank to dump, and wait
(bounded) for the ranks to say they did.

The address may be the workers' store itself (MASTER_ADDR:MASTER_PORT), torchrun's c10d
rendezvous endpoint (rank 0 left the workers' address there, ``Keys.endpoint``) or the
endpoint file in a FLIGHTREC_DIR. Each rank that answers appends its rank to
``Keys.acknowledged(n, "dumped")`` (or ``"failed"`` when its dump could not be written) once it
has dumped for request ``n`` (``store.Poller``).

No torch here: the store is spoken to through ``wire`` (importing torch took 4 to 9 s on a busy
machine). Only a store that answers, but not as torch's TCPStore does, is tried once more
through torch's own client where torch is installed (a torch whose protocol differs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.errors import UsageError
from flightrec.recorder.exchange.endpoint import (
    ENDPOINT_FILE,
    Endpoint,
    connect_failure,
    parse_address,
    read_file,
)
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import MAX_RANK, known_world_size, post_request
from flightrec.recorder.exchange.wire import ProtocolError, WireStore

POLL_S = 0.1
"""How often the acknowledgements are read while waiting."""


@dataclass(frozen=True, slots=True)
class TriggerResult:
    """What one trigger did.

    Attributes:
        address: the workers' store that was asked ("host:port").
        via: how it was found: "" (the address given), or a phrase naming the rendezvous
            store or endpoint file that pointed to it.
        request: the dump request's number.
        world_size: ranks the job registered (every one is asked).
        dumped: ranks that wrote their dump.
        failed: ranks that answered but could not write their dump (their log says why).
        waited_s: how long the acknowledgements were waited for.
    """

    address: str
    via: str
    request: int
    world_size: int
    dumped: tuple[int, ...]
    failed: tuple[int, ...]
    waited_s: float

    @property
    def silent(self) -> tuple[int, ...]:
        """Ranks that did not answer in time."""
        answered = {*self.dumped, *self.failed}
        return tuple(r for r in range(self.world_size) if r not in answered)


def endpoint_from_folder(folder: Path) -> Endpoint:
    """The endpoint the job writing into ``folder`` (its FLIGHTREC_DIR) registered.

    Raises:
        UsageError: the folder or its endpoint file is missing or unreadable.
    """
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder")
    ep = read_file(folder / ENDPOINT_FILE)
    if ep is None:
        raise UsageError(
            f"{folder}: no {ENDPOINT_FILE} file: no traced job has started with this "
            "FLIGHTREC_DIR (pass the job's address with --host and --port instead)"
        )
    return ep


def _connect(host: str, port: int, timeout_s: float) -> Any:
    try:
        return WireStore(host, port, timeout_s)
    except ProtocolError as exc:
        unexpected = exc
    except OSError as exc:
        why = connect_failure(exc, timeout_s)
        raise UsageError(f"nothing answers at {host}:{port}: {why}") from None
    store = _torch_client(host, port, timeout_s)
    if store is None:
        raise UsageError(
            f"something answers at {host}:{port}, but not as a job's store (torch's TCPStore) "
            f"does: {unexpected}; is this the job's MASTER_PORT or torchrun's --rdzv-endpoint?"
        )
    return store


def _torch_client(host: str, port: int, timeout_s: float) -> Any:
    """torch's own client, where torch is installed and its client connects; else None."""
    try:
        from flightrec.recorder.exchange.store import connect

        return connect(host, port, timeout_s)
    except Exception:  # no torch, or torch's client fails as ours did
        return None


def find_store(host: str, port: int, namespace: str, timeout_s: float) -> tuple[Any, str, str]:
    """Connect to the workers' store of the job at ``host:port``.

    Returns:
        (store, its "host:port", how it was found: "" or "via the rendezvous store H:P").

    Raises:
        UsageError: nothing answers there, or no traced job registered there.
    """
    keys = Keys(namespace)
    store = _connect(host, port, timeout_s)
    if store.check([keys.world]):
        return store, f"{host}:{port}", ""
    if store.check([keys.endpoint]):
        where = parse_address(bytes(store.get(keys.endpoint)).decode("ascii", "replace")[:300])
        if where is not None:
            inner = _connect(where[0], where[1], timeout_s)
            if inner.check([keys.world]):
                return inner, f"{where[0]}:{where[1]}", f"via the rendezvous store {host}:{port}"
    job = f" (FLIGHTREC_JOB_ID={namespace})" if namespace else ""
    raise UsageError(
        f"a store answers at {host}:{port}, but no traced job{job} registered there: is the job "
        "running with FLIGHTREC=1, and is this its MASTER_PORT or torchrun's --rdzv-endpoint? "
        "Under torchrun --standalone, pass the job's FLIGHTREC_DIR instead"
    )


def _ranks(store: Any, key: str, world_size: int) -> tuple[int, ...]:
    if not store.check([key]):
        return ()
    raw = bytes(store.get(key))[: 10 * world_size + 16]
    found = {int(t) for t in raw.split(b",") if t.isdigit() and len(t) < 9}
    return tuple(sorted(r for r in found if r < min(world_size, MAX_RANK)))


def trigger(
    host: str, port: int, namespace: str = "", timeout_s: float = 5.0, wait_s: float = 10.0
) -> TriggerResult:
    """Ask every rank of the job at ``host:port`` to dump; wait up to ``wait_s`` for them.

    Args:
        host: the workers' store (MASTER_ADDR) or torchrun's c10d rendezvous host.
        port: its port.
        namespace: the job's FLIGHTREC_JOB_ID, if it set one.
        timeout_s: how long to try to reach the store.
        wait_s: how long to wait for the ranks' acknowledgements (0: do not wait).

    Raises:
        UsageError: nothing answers at host:port, or no traced job registered there.
    """
    store, address, via = find_store(host, port, namespace, timeout_s)
    keys = Keys(namespace)
    world = known_world_size(store, keys)
    n = post_request(store, keys, -1, "CLI_TRIGGER")
    done_key, failed_key = keys.acknowledged(n, "dumped"), keys.acknowledged(n, "failed")
    started = time.monotonic()
    dumped: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    while True:
        dumped, failed = _ranks(store, done_key, world), _ranks(store, failed_key, world)
        waited = time.monotonic() - started
        if len({*dumped, *failed}) >= world or waited >= wait_s:
            return TriggerResult(address, via, n, world, dumped, failed, waited)
        time.sleep(POLL_S)
