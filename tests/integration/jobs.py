"""Launch real N-rank gloo jobs as separate processes and collect their flightrec dumps.

Reusable by anyone who needs real dumps (integration tests, sample recording)::

    from tests.integration.jobs import start_job

    with start_job("scenario.py", ["stall", "--stall-rank", "2"], world_size=4,
                   env={"FLIGHTREC_TIMEOUT": "2"}) as job:
        job.wait_for_dumps(count=4, timeout=30)
    dumps = job.dumps()          # {rank: [(path, flightrec_pb2.Dump), ...]} oldest first

Each rank is a plain ``python SCRIPT ARGS`` process with the usual torchrun variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>) and FLIGHTREC=1, so
the script is traced exactly the way a user's job is: it never imports flightrec unless it
wants to. ``PYTHONPATH`` puts this source tree first. Leaving the ``with`` block kills
whatever is still running, so a hung scenario can never outlive its test.

``launch="spawn"`` runs one process that starts the ranks with ``torch.multiprocessing``;
``launch="torchrun"`` runs ``python -m torch.distributed.run`` (``"torchrun-c10d"`` and
``"torchrun-standalone"``: with its c10d rendezvous, or ``--standalone``). Scripts read their rank from
the environment, or from their argv under spawn (see scripts/scenario.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.read import read_dump
from flightrec.format.schema import SUFFIX

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None, *, flightrec: bool = True) -> dict[str, str]:
    """The environment of a job process: this tree first on PYTHONPATH, FLIGHTREC on or off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCH_FR"))}
    paths = [str(REPO), str(REPO / "cli")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    # Quiet torch's C++ logs so a failing test shows the script's own output.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if flightrec:
        env["FLIGHTREC"] = "1"
    env.update(extra or {})
    return env


def descendants(pids: Sequence[int]) -> list[int]:
    """Every process below ``pids`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found: list[int] = []
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Job:
    """A running (or finished) job: its processes, its dump folder and its port."""

    dump_dir: Path
    port: int
    world_size: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    # -- waiting ----------------------------------------------------------------------------
    def dump_files(self) -> list[Path]:
        """Every finished dump file (temporary files excluded), sorted by name."""
        if not self.dump_dir.exists():
            return []
        return sorted(p for p in self.dump_dir.rglob(f"*{SUFFIX}") if not p.name.startswith("."))

    def wait_for_dumps(self, count: int, timeout: float = 30.0, reason: str = "") -> list[Path]:
        """Wait until at least ``count`` dump files (whose name contains ``reason``) exist.

        Raises:
            TimeoutError: with the processes' output, when they did not appear in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            files = [p for p in self.dump_files() if reason.lower() in p.name]
            if len(files) >= count:
                return files
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(files)} of {count} {reason} dumps after {timeout}s\n{self.output()}"
                )
            time.sleep(0.1)

    def wait_for_output(self, rank: int, text: str, timeout: float = 30.0) -> None:
        """Wait until process ``rank``'s output contains ``text`` (a script's progress marker)."""
        deadline = time.monotonic() + timeout
        while text not in self.logs[rank].read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} never printed {text!r}\n{self.output()}")
            time.sleep(0.05)

    def wait(self, timeout: float = 60.0) -> list[int]:
        """Wait for every process; returns their exit codes (negative: killed by that signal)."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"job still running after {timeout}s\n{self.output()}") from None
        return codes

    def where_stuck(self, rank: int, settle_s: float = 3.0) -> str:
        """Every thread's stack in process ``rank``, which should have ended, for a failure
        message: it is asked for a SIGUSR1 dump (needs Python to run); where no Python thread
        ran for FLIGHTREC_TIMEOUT, faulthandler's raw stacks beside its black box say more."""
        before = set(self.dump_files())
        with contextlib.suppress(ProcessLookupError):
            self.signal(rank, signal.SIGUSR1)
        with contextlib.suppress(TimeoutError):  # none comes where no Python thread runs
            self.wait_for_dumps(count=len(before) + 1, timeout=settle_s)
        lines = [f"--- where process {rank} is ---"]
        for path in sorted(set(self.dump_files()) - before):
            dump = read_dump(path)
            for t in dump.threads:
                frames = [dump.frames[f] for f in dump.stacks[t.stack].frames]
                where = [f"{dump.strings[f.file]}:{f.line} {dump.strings[f.name]}" for f in frames]
                lines.append(f"thread {t.name}: " + " <- ".join(where[:8]))
        if len(lines) == 1:
            lines.append("no SIGUSR1 dump: no Python thread runs")
        for raw in sorted(self.dump_dir.glob(".*.stacks")):
            text = raw.read_text(errors="replace")
            if text.count("\n") > 1:  # more than its header: faulthandler wrote into it
                lines.append(f"{raw.name}:\n{text[-4000:]}")
        return "\n".join(lines)

    # -- acting -----------------------------------------------------------------------------
    def signal(self, rank: int, sig: int) -> None:
        """Send ``sig`` to process ``rank`` (the rank's own process in the default launch)."""
        self.procs[rank].send_signal(sig)

    def kill(self) -> None:
        """Kill whatever is still running: each launched process's group, and every process
        below it (torchrun starts its workers in sessions of their own: killing torchrun's
        group alone left them running, hung, for good)."""
        below = descendants([p.pid for p in self.procs if p.poll() is None])
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    # -- reading ----------------------------------------------------------------------------
    def dumps(self) -> dict[int, list[tuple[Path, pb.Dump]]]:
        """Every dump, parsed and validated, by rank, in the order each process wrote them."""
        out: dict[int, list[tuple[Path, pb.Dump]]] = {}
        for path in self.dump_files():
            dump = read_dump(path)
            out.setdefault(dump.header.rank, []).append((path, dump))
        for items in out.values():
            items.sort(key=lambda item: (item[1].header.pid, item[1].header.dump_index))
        return out

    def output(self) -> str:
        """All processes' combined stdout/stderr, for failure messages."""
        parts = []
        for i, log in enumerate(self.logs):
            text = log.read_text(errors="replace") if log.exists() else ""
            if len(text) > 12000:  # the start (warnings, the first failure) and the end
                text = f"{text[:4000]}\n[... {len(text) - 12000} characters ...]\n{text[-8000:]}"
            parts.append(f"--- process {i} ---\n{text}")
        return "\n".join(parts)


@contextlib.contextmanager
def start_job(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    world_size: int = 4,
    env: Mapping[str, str] | None = None,
    flightrec: bool = True,
    launch: str = "procs",
    workdir: Path | None = None,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    launcher: Sequence[str] = (),
) -> Iterator[Job]:
    """Start a job; kill what is left of it when the block ends.

    Args:
        script: a file in ``tests/integration/scripts/`` or any path.
        args: the script's arguments.
        world_size: number of ranks.
        env: extra environment for every rank (FLIGHTREC_TIMEOUT, FLIGHTREC_DUMP_ON_EXIT...).
        flightrec: set FLIGHTREC=1 (False: a job that must run untraced).
        launch: "procs" (one process per rank), "spawn" (torch.multiprocessing.spawn from one
            process), "torchrun" (static rendezvous at ``port``), "torchrun-c10d" (c10d
            rendezvous at ``port``; the workers' store is elsewhere) or "torchrun-standalone"
            (``--standalone``: ``port`` is unused), or "self": one process runs
            ``python *launcher SCRIPT ARGS`` and a framework's launcher starts the ranks
            (Lightning's, ``accelerate launch``, Ray); only MASTER_ADDR/MASTER_PORT are set.
        workdir: folder for the dumps (``workdir/dumps``, the FLIGHTREC_DIR) and the
            processes' logs; a new temporary folder, left for the caller, when omitted.
        rank_env: per rank, environment of its own (launch "procs" only).
        launcher: for "self", what goes between ``python`` and the script
            (``["-m", "accelerate.commands.launch", "--multi_gpu", ...]``).
    """
    path = Path(script)
    if not path.is_absolute():
        path = SCRIPTS / path
    root = workdir or Path(tempfile.mkdtemp(prefix="flightrec-job-"))
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    job = Job(dump_dir=root / "dumps", port=port, world_size=world_size)
    base = child_env({"FLIGHTREC_DIR": str(job.dump_dir), **(env or {})}, flightrec=flightrec)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size))

    def popen(cmd: list[str], proc_env: dict[str, str], name: str) -> None:
        log = root / f"{name}.log"
        job.logs.append(log)
        with open(log, "wb") as f:
            job.procs.append(
                subprocess.Popen(
                    cmd, env=proc_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    try:
        if launch == "procs":
            for rank in range(world_size):
                own = dict(
                    base, RANK=str(rank), LOCAL_RANK=str(rank), **(rank_env or {}).get(rank, {})
                )
                popen([sys.executable, str(path), *args], own, f"rank{rank}")
        elif launch == "self":
            drop = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
            proc_env = {k: v for k, v in base.items() if k not in drop}
            popen([sys.executable, *launcher, str(path), *args], proc_env, "launcher")
        elif launch == "spawn":
            popen([sys.executable, str(path), "--spawn", str(world_size), *args], base, "spawn")
        elif launch.startswith("torchrun"):
            rendezvous = {
                "torchrun": ["--master-addr=127.0.0.1", f"--master-port={port}"],
                "torchrun-c10d": [
                    "--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                ],
                "torchrun-standalone": ["--standalone"],
            }[launch]  # fmt: skip
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}",
                *rendezvous, str(path), *args,
            ]  # fmt: skip
            drop = ("WORLD_SIZE",) if launch == "torchrun" else ("WORLD_SIZE", "MASTER_PORT")
            popen(cmd, {k: v for k, v in base.items() if k not in drop}, "torchrun")
        else:
            raise ValueError(f"unknown launch {launch!r}")
        yield job
    finally:
        job.kill()
