"""Where ``flightrec trigger`` finds a running job's store, however the job was launched.

Every rank waits for dump requests on the store of its default process group: MASTER_ADDR:
MASTER_PORT for a static ``torchrun --master-port``, an ``srun`` script or ``mp.spawn``. A user
does not always know that address: torchrun's c10d rendezvous and ``--standalone`` choose the
workers' port themselves. So the ranks leave it where a user can look:

- the endpoint file ``FLIGHTREC_DIR/.flightrec-endpoint``, written by the lowest rank of each
  node (``flightrec trigger DIR``, or ``flightrec trigger`` where FLIGHTREC_DIR is set);
- under torchrun's c10d rendezvous, the rendezvous store (``--rdzv-endpoint HOST:PORT``), where
  rank 0 sets ``Keys.endpoint`` (``flightrec trigger --host HOST --port PORT``);
- the start-up line in the job's log, which names the address.

Nothing here may disturb the job: every failure is one debug line, and the rendezvous store
is written from a thread of its own through flightrec's own client (``wire``: torch's logs
C++ warnings with stack traces into the job's log when it cannot connect).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.wire import WireStore

log = logging.getLogger("flightrec")
ENDPOINT_FILE = ".flightrec-endpoint"
"""The endpoint file's name in FLIGHTREC_DIR (hidden: it is no dump)."""
MAGIC = "flightrec endpoint 1"
MAX_FILE_BYTES = 4096
DEFAULT_RDZV_PORT = 29400
"""torchrun's c10d rendezvous port when ``--rdzv-endpoint`` names none."""
LAUNCHERS = ("torch.distributed.run", "torchrun", "torch.distributed.launch")
REGISTER_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A job's store as the ranks registered it."""

    host: str
    port: int
    namespace: str = ""
    world_size: int = 0
    pid: int = 0
    written: float = 0.0
    """Wall time the file was written (0 when not read from a file)."""

    @property
    def address(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str) -> tuple[str, int] | None:
    """``(host, port)`` from ``"host:port"`` (IPv6 hosts in brackets); None when malformed."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(host) > 255:
        return None
    if any(c.isspace() or not c.isprintable() for c in host):
        return None
    return host, int(port)


def render_file(ep: Endpoint) -> str:
    """The endpoint file's text: a magic line, then ``key value`` lines."""
    return (
        f"{MAGIC}\nstore {ep.address}\njob {ep.namespace}\nworld {ep.world_size}\n"
        f"pid {ep.pid}\nwritten {ep.written:.3f}\n"
    )


def parse_file(text: str) -> Endpoint | None:
    """The endpoint an endpoint file describes; None when it is not one."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != MAGIC:
        return None
    fields = dict(line.partition(" ")[::2] for line in lines[1:])
    where = parse_address(fields.get("store", ""))
    if where is None:
        return None
    world, pid, written = fields.get("world", ""), fields.get("pid", ""), fields.get("written", "")
    try:
        stamp = float(written)
    except ValueError:
        stamp = 0.0
    namespace = fields.get("job", "").strip()
    return Endpoint(
        where[0], where[1], namespace if namespace.isprintable() else "",
        int(world) if world.isdigit() and len(world) < 9 else 0,
        int(pid) if pid.isdigit() and len(pid) < 9 else 0, stamp,
    )  # fmt: skip


def write_file(directory: str, ep: Endpoint) -> Path:
    """Write the endpoint file into ``directory`` (a temporary name renamed into place, so a
    reader never sees half of it; the file follows the umask like any other)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ENDPOINT_FILE
    tmp = folder / f"{ENDPOINT_FILE}.{os.getpid()}.tmp"
    tmp.write_text(render_file(ep))
    os.replace(tmp, path)
    return path


def read_file(path: Path) -> Endpoint | None:
    """The endpoint in ``path``; None when the file is missing or not an endpoint file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES)
    except OSError:
        return None
    return parse_file(data.decode("utf-8", "replace"))


def agent_rendezvous(argv: list[str]) -> tuple[str, int] | None:
    """The c10d rendezvous endpoint torchrun was started with, from its command line.

    ``argv`` is the launcher's (a worker's parent's) command line. It is read with torchrun's
    own argument parser, so every spelling torchrun accepts (``--rdzv-endpoint=H:P``,
    ``--rdzv_endpoint H:P``, ``PET_RDZV_ENDPOINT``) means what it meant to torchrun. None for a
    static rendezvous (the workers' store is the one at ``--master-port``), for
    ``--standalone`` (its port is chosen at start), and for anything that is not torchrun.
    """
    at = next(
        (i for i, a in enumerate(argv) if a in LAUNCHERS or os.path.basename(a) == "torchrun"),
        None,
    )
    if at is None:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def fail(message: str) -> Any:  # argparse prints and exits; we only want to know
        raise ValueError(message)

    parser.error = fail  # type: ignore[method-assign]
    try:
        args, _ = parser.parse_known_args(argv[at + 1 :])
    except (ValueError, SystemExit):
        return None
    if getattr(args, "standalone", False) or getattr(args, "rdzv_backend", "") != "c10d":
        return None
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    if not endpoint:
        return None
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    try:
        host, port = parse_rendezvous_endpoint(endpoint, DEFAULT_RDZV_PORT)
    except ValueError:
        return None
    return str(host), int(port)


def parent_argv() -> list[str]:
    """This process's parent's command line (Linux; empty where it cannot be read)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def connect_failure(exc: OSError, timeout_s: float) -> str:
    """Why a connection could not be made, in one phrase."""
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return (exc.strerror or str(exc)).lower()


class Registration:
    """Leave the workers' store address where ``flightrec trigger`` looks (a thread)."""

    def __init__(
        self, ep: Endpoint, directory: str | None, rendezvous: tuple[str, int] | None
    ) -> None:
        """Args:
        ep: the workers' store, as this rank sees it.
        directory: the local FLIGHTREC_DIR to write the endpoint file into (None: none).
        rendezvous: torchrun's c10d rendezvous store, to set ``Keys.endpoint`` in (None: none).
        """
        self._ep, self._directory, self._rendezvous = ep, directory, rendezvous
        self.path: Path | None = None
        self._thread = threading.Thread(target=self._run, name="flightrec-endpoint", daemon=True)
        self._thread.start()

    def join(self, wait_s: float) -> None:
        """At exit: a store call left running while the interpreter finalizes can abort it."""
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        if self._directory is not None:
            try:
                self.path = write_file(self._directory, self._ep)
            except Exception as exc:
                log.debug("flightrec: no endpoint file in %s: %s", self._directory, exc)
        if self._rendezvous is not None:
            host, port = self._rendezvous
            try:
                store = WireStore(host, port, REGISTER_TIMEOUT_S)
                try:
                    key = Keys(self._ep.namespace).endpoint
                    store.set(key, self._ep.address)
                    store.check([key])  # (answered once the set is in: then close)
                finally:
                    store.close()
            except Exception as exc:
                log.debug("flightrec: could not register in the rendezvous store: %s", exc)


def register(address: str, namespace: str, world_size: int, directory: str | None,
             rank: int) -> Registration | None:  # fmt: skip
    """Start registering ``address`` (the workers' store, ``"host:port"``); None when there is
    nothing to register (a store that is not a TCPStore)."""
    where = parse_address(address)
    if where is None:
        return None
    ep = Endpoint(where[0], where[1], namespace, world_size, os.getpid(), time.time())
    rendezvous = None
    if rank == 0 and os.environ.get("TORCHELASTIC_RUN_ID"):
        try:
            rendezvous = agent_rendezvous(parent_argv())
        except Exception as exc:
            log.debug("flightrec: could not read torchrun's command line: %s", exc)
        if rendezvous == where:
            rendezvous = None
    if directory is None and rendezvous is None:
        return None
    return Registration(ep, directory, rendezvous)
