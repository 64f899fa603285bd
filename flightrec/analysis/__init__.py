"""Merge every rank's dump and name the culprit.

``analyze_dir(path)`` loads the dumps (one view per rank), lines their histories up, runs the
passes (mismatch, wait-for graph and root causes, P2P, desync, missing ranks) and returns a
``Report`` whose findings are ordered most likely root cause first. Renderers in
``flightrec.report`` turn it into text or JSON.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass

from flightrec.analysis.crashes import find_crashes, merge_crashes
from flightrec.analysis.desync import find_desyncs
from flightrec.analysis.loader import Progress, Run, View, load_dir
from flightrec.analysis.matching import Matched, match
from flightrec.analysis.mismatch import find_mismatches
from flightrec.analysis.model import (
    Consequence,
    Culprit,
    FileProblem,
    Finding,
    FindingKind,
    ProcessGroupInfo,
    RankDump,
)
from flightrec.analysis.not_arrived import rank_finding
from flightrec.analysis.p2p import find_unmatched
from flightrec.analysis.rootcause import root_causes
from flightrec.analysis.skips import annotate_shifts
from flightrec.analysis.states import RankState, Status, rank_states
from flightrec.analysis.straggler import find_stragglers
from flightrec.analysis.waits import build_wait_graph
from flightrec.readers.blackbox import died

__all__ = [
    "AnalysisOptions",
    "Consequence",
    "FileProblem",
    "Finding",
    "FindingKind",
    "ProcessGroupInfo",
    "Progress",
    "RankDump",
    "RankState",
    "Report",
    "Status",
    "View",
    "analyze",
    "analyze_dir",
]


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """How to analyse.

    Attributes:
        view: which dump to use for ranks that dumped more than once.
        workers: processes that read dump files (None: the usable CPUs; 1: this process only).
        progress: called as ``progress(files_done, files_total)`` while files are read.
    """

    view: View = View.HANG
    workers: int | None = None
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """The analysis of one folder of dumps."""

    findings: list[Finding]
    """Most likely root cause first; empty for a healthy job."""
    matched: Matched
    """The lined-up histories, for renderers that show evidence."""
    states: dict[int, RankState]
    """Where every rank was at dump time."""

    @property
    def run(self) -> Run:
        """The loaded dumps, problems and notes."""
        return self.matched.run

    @property
    def world_size(self) -> int:
        """World size from the dumps' headers."""
        return self.matched.run.world_size

    @property
    def ranks_with_dump(self) -> tuple[int, ...]:
        """Global ranks that have a dump."""
        return self.matched.run.ranks_with_dump


def analyze(run: Run) -> Report:
    """Analyse already loaded dumps.

    Args:
        run: one dump per rank, as ``load_dir`` returns.

    Returns:
        The report.
    """
    m = match(run)
    mismatches = find_mismatches(m)
    graph, waits = build_wait_graph(m)
    findings, explained = root_causes(m, graph, waits, mismatches)
    findings += find_unmatched(m, graph)
    explained |= {f.process_group for f in mismatches if f.process_group}
    findings += find_desyncs(m, explained)
    findings += find_stragglers(m)
    findings = merge_crashes(m, findings, find_crashes(m))
    blamed = {r for f in findings for r in f.ranks}
    # A rank whose black box says it died is news even when nobody was left waiting on it.
    for rank, d in sorted(run.dumps.items()):
        if rank not in blamed and died(d.header):
            findings.append(rank_finding(m, [rank], Culprit.EXITED, None, ()))
    quiet_missing = [r for r in run.missing_ranks if r not in blamed]
    if quiet_missing:
        findings.append(rank_finding(m, quiet_missing, Culprit.NO_DUMP, None, ()))
    return Report(annotate_shifts(m, findings), m, rank_states(m, waits))


def analyze_dir(path: str, options: AnalysisOptions | None = None) -> Report:
    """Load every dump under ``path`` and diagnose the job.

    Args:
        path: a folder searched recursively (or one dump file).
        options: analysis options; defaults when None.

    Returns:
        The report: findings ordered most likely root cause first, problems with files, notes.

    Raises:
        UsageError: ``path`` does not exist.
        NoDumpsError: no readable dump under ``path``.
    """
    options = options or AnalysisOptions()
    with gc_paused():
        run = load_dir(path, options.view, workers=options.workers, progress=options.progress)
        return analyze(run)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration (restored after).

    Loading a 16,384-rank job creates about a million long-lived objects and no reference
    cycles; every automatic full collection walks all of them (about a tenth of the loading
    process's CPU time). Whatever cycles do arise are collected once it is back on.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
