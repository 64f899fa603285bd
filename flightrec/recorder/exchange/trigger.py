"""``flightrec trigger``'s half: find a running job's store, ask every rank to dump, and wait
(bounded) for the ranks to say they did.

The address may be the workers' store itself (MASTER_ADDR:MASTER_PORT), torchrun's c10d
rendezvous endpoint (rank 0 left the workers' address there, ``endpoint.endpoint_key``) or the
endpoint file in a FLIGHTREC_DIR. Each rank that answers appends its rank to
``flightrec/<namespace>/dump_request/<n>/dumped`` (or ``/failed`` when its dump could not be
written) once it has dumped for request ``n`` (``store.Poller``).

Before torch is imported (seconds) or its store client tries (it logs C++ stack traces while
it retries), a plain socket probes the address: an address where nothing listens costs one
line, within the connect timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.errors import TorchMissingError, UsageError
from flightrec.recorder.exchange.endpoint import (
    ENDPOINT_FILE,
    Endpoint,
    endpoint_key,
    parse_address,
    reachable,
    read_file,
)
from flightrec.recorder.exchange.store import (
    MAX_RANK,
    connect,
    known_world_size,
    post_request,
    request_key,
    world_key,
)

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
    why = reachable(host, port, timeout_s)
    if why:
        raise UsageError(f"nothing answers at {host}:{port}: {why}")
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        raise TorchMissingError() from None
    try:
        return connect(host, port, timeout_s)
    except Exception as exc:
        first = (str(exc) or type(exc).__name__).splitlines()[0][:200]
        raise UsageError(f"no job store answers at {host}:{port} ({first})") from None


def find_store(host: str, port: int, namespace: str, timeout_s: float) -> tuple[Any, str, str]:
    """Connect to the workers' store of the job at ``host:port``.

    Returns:
        (store, its "host:port", how it was found: "" or "via the rendezvous store H:P").

    Raises:
        UsageError: nothing answers there, or no traced job registered there.
    """
    store = _connect(host, port, timeout_s)
    if store.check([world_key(namespace)]):
        return store, f"{host}:{port}", ""
    key = endpoint_key(namespace)
    if store.check([key]):
        where = parse_address(bytes(store.get(key)).decode("ascii", "replace")[:300])
        if where is not None:
            inner = _connect(where[0], where[1], timeout_s)
            if inner.check([world_key(namespace)]):
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
        TorchMissingError: torch is not installed here.
        UsageError: nothing answers at host:port, or no traced job registered there.
    """
    store, address, via = find_store(host, port, namespace, timeout_s)
    world = known_world_size(store, namespace)
    n = post_request(store, namespace, -1, "CLI_TRIGGER", world)
    done_key, failed_key = (
        f"{request_key(namespace)}/{n}/dumped",
        f"{request_key(namespace)}/{n}/failed",
    )
    started = time.monotonic()
    dumped: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    while True:
        dumped, failed = _ranks(store, done_key, world), _ranks(store, failed_key, world)
        waited = time.monotonic() - started
        if len({*dumped, *failed}) >= world or waited >= wait_s:
            return TriggerResult(address, via, n, world, dumped, failed, waited)
        time.sleep(POLL_S)
