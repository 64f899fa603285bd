"""``flightrec attach``: snapshot every rank of a job on this node from outside, one dump each.

Order of work: find the ranks (``processes``), sample every rank's and its children's stacks a
few times (``pyspy``), read torch's ring where the process serves it (``torchring``), then
build and write one snapshot per rank (``snapshot``). A rank that cannot be read costs one
line and the others are still taken; nothing is ever sent to the job but py-spy's reads (a
pause of milliseconds each) and, where the job started a worker server, one request to it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.attach.processes import Found, RankProcess, find_ranks, thread_cpu_ns
from flightrec.attach.pyspy import StackReadError, find_pyspy, read_stacks
from flightrec.attach.snapshot import Ring, Sample, build_snapshot
from flightrec.attach.torchring import SOCKET_VARIABLE, RingUnavailable, fetch_ring
from flightrec.errors import DumpError, UsageError
from flightrec.format.schema import dump_filename
from flightrec.format.write import write_dump
from flightrec.readers.native import load_native
from flightrec.readers.native.groups import rebuild_groups
from flightrec.readers.native.model import NativeDump

SAMPLES = 3
INTERVAL_S = 0.5
REASON = "attached"
"""The reason word in a snapshot's file name."""


@dataclass(frozen=True, slots=True)
class RankOutcome:
    """What attach took from one rank, or why it took nothing."""

    rank: int
    pid: int
    job_id: str = ""
    path: Path | None = None
    """The snapshot written; None when none was."""
    threads: int = 0
    children: int = 0
    """Child processes whose stacks are in the snapshot."""
    ring_entries: int | None = None
    """Entries of torch's ring in the snapshot; None when no ring was read."""
    ring_note: str = ""
    """Why no ring was read, where the process serves one and it failed."""
    problem: str = ""
    """Why nothing was written (one line), when nothing was."""
    note: str = ""
    """How its rank was told, where its environment does not say."""


@dataclass
class AttachReport:
    """What one ``attach`` call did: a line's worth per rank and per pid that led nowhere."""

    out: Path
    host: str
    ranks: list[RankOutcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Pids given that led to no rank."""
    seconds: float = 0.0
    samples: int = 0

    @property
    def written(self) -> list[RankOutcome]:
        """The ranks whose snapshot was written."""
        return [r for r in self.ranks if r.path is not None]


def _sample_all(
    procs: Sequence[int], pyspy: str, samples: int, interval_s: float
) -> tuple[dict[int, list[Sample]], dict[int, str]]:
    """Every process' samples, oldest first, in rounds ``interval_s`` apart; and per process
    that py-spy could not read, why (its samples stop there)."""
    taken: dict[int, list[Sample]] = {pid: [] for pid in procs}
    failed: dict[int, str] = {}
    for i in range(samples):
        if i:
            time.sleep(interval_s)
        for pid in procs:
            if pid in failed:
                continue
            try:
                threads = read_stacks(pid, pyspy)
            except StackReadError as exc:
                failed[pid] = exc.reason
                continue
            now = time.monotonic_ns()
            cpu = {t.native_id: thread_cpu_ns(pid, t.native_id) for t in threads}
            used = {tid: ns for tid, ns in cpu.items() if ns is not None}
            taken[pid].append(Sample(now, tuple(threads), used))
    return taken, failed


def _rings(ranks: Sequence[RankProcess]) -> tuple[dict[int, Ring], dict[int, str]]:
    """torch's ring of every rank that serves one (``torchring``), read as native dumps with
    the groups rebuilt from all of them; and per rank where that failed, why."""
    natives: dict[int, NativeDump] = {}
    notes: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="flightrec-attach-") as tmp:
        for proc in ranks:
            path = proc.environ.get(SOCKET_VARIABLE)
            if not path:
                continue
            try:
                data = fetch_ring(path)
                # The native reader reads files: the rank is in the name, as torch names them.
                file = Path(tmp) / f"rank_{proc.rank}.json"
                file.write_bytes(data)
                natives[proc.rank] = load_native(file)
            except RingUnavailable as exc:
                notes[proc.rank] = f"torch's ring: {exc}"
            except DumpError as exc:
                notes[proc.rank] = f"torch's ring unreadable: {exc.reason}"
    if not natives:
        return {}, notes
    groups = rebuild_groups(list(natives.values()))
    return {rank: Ring(d, groups) for rank, d in natives.items()}, notes


def _next_index(out: Path, proc: RankProcess) -> int:
    """The first snapshot number of this process that the folder does not hold yet (an
    earlier attach's files stay: the analysis reads the newest)."""
    index = 0
    while (out / dump_filename(proc.rank, index, REASON, proc.pid)).exists():
        index += 1
    return index


def attach(
    pids: Sequence[int],
    out: str | Path,
    *,
    samples: int = SAMPLES,
    interval_s: float = INTERVAL_S,
    pyspy: str | None = None,
) -> AttachReport:
    """Snapshot every rank at or below ``pids`` on this node into ``out``, one file each.

    Args:
        pids: launchers' (torchrun's agent, an ``srun`` step, an ``mp.spawn`` parent) or
            ranks' process ids.
        out: the folder to write into (created if missing).
        samples: stack samples per process (2 at least: a stack that changed between them
            is a rank that is moving).
        interval_s: seconds between samples.
        pyspy: the py-spy executable (default: ``find_pyspy``).

    Returns:
        What was written, and one line per rank or pid that could not be read.

    Raises:
        UsageError: no pid given, fewer than 2 samples, or no py-spy.
    """
    if not pids:
        raise UsageError("give at least one process id")
    if samples < 2:
        raise UsageError(
            f"--samples must be 2 or more (got {samples}): one cannot tell a still stack"
        )
    tool = pyspy or find_pyspy()
    if tool is None:
        raise UsageError(
            "py-spy not found on PATH or beside this Python: "
            "pip install 'torch-flightrec[attach]' (or pip install py-spy)"
        )
    began = time.monotonic()
    found: Found = find_ranks(pids)
    out = Path(out)
    report = AttachReport(out, found.ranks[0].host if found.ranks else "", samples=samples)
    report.problems.extend(found.problems)
    if not found.ranks:
        report.seconds = time.monotonic() - began
        return report
    procs = [p.pid for p in found.ranks] + [c for p in found.ranks for c in p.children]
    taken, failed = _sample_all(procs, tool, samples, interval_s)
    rings, ring_notes = _rings([p for p in found.ranks if p.pid not in failed])
    detail = (
        f"taken from outside by flightrec attach (py-spy): {samples} samples {interval_s:g} s apart"
    )
    for proc in found.ranks:
        report.ranks.append(
            _write_one(
                proc,
                taken,
                failed,
                rings.get(proc.rank),
                ring_notes.get(proc.rank, ""),
                out,
                detail,
            )
        )
    report.seconds = time.monotonic() - began
    return report


def _write_one(
    proc: RankProcess,
    taken: dict[int, list[Sample]],
    failed: dict[int, str],
    ring: Ring | None,
    ring_note: str,
    out: Path,
    detail: str,
) -> RankOutcome:
    own = taken[proc.pid]
    if proc.pid in failed:
        # Gone or unreadable part way: a snapshot of a process that ended since would say
        # where it no longer is.
        return RankOutcome(
            proc.rank, proc.pid, proc.job_id, problem=failed[proc.pid], note=proc.note
        )
    kids = [taken[c] for c in proc.children if taken.get(c) and c not in failed]
    index = _next_index(out, proc)
    dump = build_snapshot(proc, own, kids, ring, detail, index)
    try:
        path = write_dump(dump, out, dump_filename(proc.rank, index, REASON, proc.pid))
    except OSError as exc:
        return RankOutcome(
            proc.rank,
            proc.pid,
            proc.job_id,
            problem=f"cannot write into {out}: {exc.strerror or exc}",
        )
    return RankOutcome(
        proc.rank,
        proc.pid,
        proc.job_id,
        path=path,
        threads=len(own[-1].threads),
        children=len(kids),
        ring_entries=len(ring.native.entries) if ring is not None else None,
        ring_note=ring_note,
        note=proc.note,
    )
