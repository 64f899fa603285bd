"""Find the rank processes of a job on this node from a launcher's pid or a rank's, in /proc.

A rank process carries ``RANK`` (or ``LOCAL_RANK``) in the environment it was started with
(torchrun's workers, ``srun`` tasks of a job that sets them); its own children (DataLoader
workers, compile workers) inherit the same variables and are kept as the rank's children, not
as ranks. ``torch.multiprocessing.spawn`` hands the rank to its function instead: its children
carry no ``RANK``, so they are numbered in the order the launcher started them (the order
``mp.spawn`` gives their index in). Nothing here stops or signals a process: it reads
``/proc/PID/stat``, ``cmdline`` and ``environ`` only.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")

RANK_VARIABLES = ("RANK", "LOCAL_RANK")
"""Either one makes a process a rank of a job."""
JOB_VARIABLES = ("FLIGHTREC_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
"""Where the job's id is read from, first found first (the same on every node of the job)."""
KEPT_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "FLIGHTREC_JOB_ID",
    "TORCH_WORKER_SERVER_SOCKET",
)
"""The variables a snapshot may use; nothing else of a process' environment is kept."""
_SPAWN_MARKS = ("multiprocessing.spawn", "multiprocessing.forkserver", "spawn_main")


class ProcessUnreadable(Exception):
    """A process' /proc entries cannot be read: it is gone, or belongs to someone else.

    Attributes:
        pid: the process.
        reason: one line, without the pid.
    """

    def __init__(self, pid: int, reason: str) -> None:
        super().__init__(f"pid {pid}: {reason}")
        self.pid = pid
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RankProcess:
    """One rank's process on this node, as its environment describes it."""

    pid: int
    rank: int
    world_size: int
    """0 when neither its environment nor its launcher says."""
    local_rank: int
    """-1 when unknown."""
    host: str
    job_id: str
    environ: Mapping[str, str] = field(default_factory=dict)
    """The ``KEPT_VARIABLES`` it was started with."""
    children: tuple[int, ...] = ()
    """Its descendant processes (DataLoader workers, ...), which are not ranks."""
    note: str = ""
    """How its rank was told where its environment does not say (``mp.spawn`` order)."""


def _read(pid: int, name: str) -> bytes:
    try:
        return (PROC / str(pid) / name).read_bytes()
    except FileNotFoundError:
        raise ProcessUnreadable(pid, "no such process (it has exited)") from None
    except ProcessLookupError:
        raise ProcessUnreadable(pid, "no such process (it has exited)") from None
    except PermissionError:
        raise ProcessUnreadable(
            pid, f"no permission to read /proc/{pid}/{name}: run as the job's user or as root"
        ) from None
    except OSError as exc:
        raise ProcessUnreadable(pid, f"cannot read /proc/{pid}/{name}: {exc.strerror}") from None


def environ_of(pid: int) -> dict[str, str]:
    """The environment a process was started with (only ``KEPT_VARIABLES``).

    Raises:
        ProcessUnreadable: it is gone, or its environment is not ours to read.
    """
    out: dict[str, str] = {}
    for item in _read(pid, "environ").split(b"\0"):
        name, sep, value = item.partition(b"=")
        key = name.decode(errors="replace")
        if sep and key in KEPT_VARIABLES:
            out[key] = value.decode(errors="replace")
    return out


def cmdline_of(pid: int) -> str:
    """The process' command line, arguments joined by spaces ("" when unreadable)."""
    try:
        return _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
    except ProcessUnreadable:
        return ""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, None when gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process' children (by start time) and start time, read from /proc/*/stat."""
    children: dict[int, list[tuple[int, int]]] = defaultdict(list)
    started: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        found = _stat(int(entry.name))
        if found is None:
            continue
        parent, start = found
        started[int(entry.name)] = start
        children[parent].append((start, int(entry.name)))
    return {p: [pid for _, pid in sorted(kids)] for p, kids in children.items()}, started


def descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def job_id_of(environ: Mapping[str, str]) -> str:
    """The job's id from the first of ``JOB_VARIABLES`` set ("" when none is). torchrun's
    placeholder "none" counts as unset, as the recorder counts it (``job_id_from_env``), so
    that a traced job's dumps and its snapshots name the job alike."""
    for name in JOB_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value != "none":
            return value
    return ""


def _is_rank(environ: Mapping[str, str], variables: Sequence[str] = RANK_VARIABLES) -> bool:
    return any(v in environ for v in variables)


def _rank_of(environ: Mapping[str, str]) -> int:
    return _int(
        environ.get("RANK"), _int(environ.get("LOCAL_RANK"), _int(environ.get("SLURM_PROCID"), -1))
    )


@dataclass
class Found:
    """What ``find_ranks`` found: the rank processes, and one line per pid it could not use."""

    ranks: list[RankProcess] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find_ranks(pids: Iterable[int], host: str | None = None) -> Found:
    """The rank processes at or below each of ``pids``.

    A pid whose environment names a rank (``RANK_VARIABLES``) is that rank, its descendants
    its children. Otherwise it is a launcher, and its ranks are, first found first: its
    descendants whose environment names a rank, the topmost of each (a rank's DataLoader
    workers inherit its variables); the child processes ``multiprocessing`` spawned
    (``mp.spawn``), numbered in start order; itself or its topmost descendants with
    ``SLURM_PROCID`` (``srun`` tasks of a script that sets its rank itself). A pid below another rank found (a DataLoader
    worker that a ``pgrep`` matched too) is that rank's child, not a rank.

    Args:
        pids: launchers' or ranks' process ids.
        host: the host name to record (default: this machine's).

    Returns:
        The ranks, by rank, and one line per pid that led to none.
    """
    host = host or socket.gethostname()
    children, _ = process_table()
    found = Found()
    for pid in pids:
        try:
            env = environ_of(pid)
        except ProcessUnreadable as exc:
            found.problems.append(str(exc))
            continue
        if _is_rank(env):
            found.ranks.append(_rank(pid, env, host, children))
            continue
        ranks, unreadable = _ranks_below(pid, env, host, children)
        if not ranks:
            why = f"; {len(unreadable)} of them unreadable ({unreadable[0]})" if unreadable else ""
            below = len(descendants(pid, children))
            found.problems.append(
                f"pid {pid} ({_short(cmdline_of(pid))}): no rank process found below it "
                f"({below} descendant process{'es' if below != 1 else ''}, none with RANK, "
                f"LOCAL_RANK or SLURM_PROCID in its environment or started by multiprocessing"
                f"{why})"
            )
        found.ranks.extend(ranks)
    below_a_rank = {c for r in found.ranks for c in r.children}
    unique = {r.pid: r for r in found.ranks if r.pid not in below_a_rank}
    found.ranks = sorted(unique.values(), key=lambda r: (r.rank, r.pid))
    return found


def _short(cmdline: str, width: int = 60) -> str:
    if not cmdline:
        return "command line unknown"
    return cmdline if len(cmdline) <= width else cmdline[: width - 1] + "…"


def _rank(
    pid: int,
    env: Mapping[str, str],
    host: str,
    children: Mapping[int, list[int]],
    *,
    rank: int | None = None,
    world_size: int = 0,
    note: str = "",
) -> RankProcess:
    local = _int(env.get("LOCAL_RANK"), _int(env.get("SLURM_LOCALID"), -1))
    return RankProcess(
        pid=pid,
        rank=_rank_of(env) if rank is None else rank,
        world_size=_int(env.get("WORLD_SIZE"), _int(env.get("SLURM_NTASKS"), world_size)),
        local_rank=local if rank is None else rank,
        host=host,
        job_id=job_id_of(env),
        environ=dict(env),
        children=tuple(descendants(pid, children)),
        note=note,
    )


def _topmost(
    launcher: int, variables: Sequence[str], host: str, children: Mapping[int, list[int]]
) -> tuple[list[RankProcess], list[str]]:
    """The topmost descendants of ``launcher`` with one of ``variables`` in their
    environment, as ranks; and the descendants that could not be read."""
    ranks: list[RankProcess] = []
    unreadable: list[str] = []
    below_rank: set[int] = set()
    for pid in descendants(launcher, children):
        if pid in below_rank:
            continue
        try:
            env = environ_of(pid)
        except ProcessUnreadable as exc:
            unreadable.append(str(exc))
            continue
        if _is_rank(env, variables):
            ranks.append(_rank(pid, env, host, children))
            below_rank.update(descendants(pid, children))
    return ranks, unreadable


def _ranks_below(
    launcher: int, launcher_env: Mapping[str, str], host: str, children: Mapping[int, list[int]]
) -> tuple[list[RankProcess], list[str]]:
    """The ranks below a launcher, and the descendants that could not be read."""
    ranks, unreadable = _topmost(launcher, RANK_VARIABLES, host, children)
    if ranks:
        return ranks, unreadable
    # mp.spawn: the launcher's own children that multiprocessing started, in start order.
    spawned = [
        p for p in children.get(launcher, ()) if any(m in cmdline_of(p) for m in _SPAWN_MARKS)
    ]
    for index, pid in enumerate(spawned):
        try:
            env = environ_of(pid)
        except ProcessUnreadable as exc:
            unreadable.append(str(exc))
            continue
        env = {**{k: v for k, v in launcher_env.items() if k in KEPT_VARIABLES}, **env}
        ranks.append(
            _rank(
                pid,
                env,
                host,
                children,
                rank=index,
                world_size=len(spawned),
                note=(
                    f"rank taken as its start order among pid {launcher}'s {len(spawned)} "
                    "processes started by multiprocessing (mp.spawn's index)"
                ),
            )
        )
    if ranks:
        return ranks, unreadable
    if "SLURM_PROCID" in launcher_env:
        # The step's own process (srun's task) with no rank below it: it is the rank.
        return [_rank(launcher, launcher_env, host, children)], unreadable
    slurm, _ = _topmost(launcher, ("SLURM_PROCID",), host, children)
    if slurm:
        return slurm, unreadable
    return [], unreadable


_TICK_NS = 1_000_000_000 // max(1, os.sysconf("SC_CLK_TCK"))


def thread_cpu_ns(pid: int, tid: int) -> int | None:
    """CPU time (user and system) a thread of a process has used; None when it is gone."""
    try:
        raw = (PROC / str(pid) / "task" / str(tid) / "stat").read_bytes()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return (int(rest[11]) + int(rest[12])) * _TICK_NS
    except (IndexError, ValueError):
        return None
