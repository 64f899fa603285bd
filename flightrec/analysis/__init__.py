"""Merge every rank's dump and name the culprit.

``analyze_dir(path)`` loads the dumps (one view per rank), lines their histories up, runs the
stages of ``pipeline.diagnose`` (wait graph, candidates, arbitration, refinements) and returns
a ``Report`` whose findings are ordered most likely root cause first. Renderers in ``flightrec.report``
turn it into text, JSON or a timeline.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from flightrec.analysis.loading.loader import (
    AnalysisOptions,
    Progress,
    Run,
    View,
    default_workers,
    load_dir,
)
from flightrec.analysis.matching.matching import Matched, match
from flightrec.analysis.model import (
    Consequence,
    FileProblem,
    Finding,
    FindingKind,
    ProcessGroupInfo,
    RankDump,
    Status,
)
from flightrec.analysis.pipeline import diagnose
from flightrec.analysis.states import RankState
from flightrec.analysis.timing.clocks import Clocks, TimelineClock
from flightrec.format.location import is_url

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
    "TimelineClock",
    "View",
    "analyze",
    "analyze_dir",
    "gc_paused",
]


@dataclass(frozen=True, slots=True)
class Report:
    """The analysis of one folder of dumps: what renderers read, and all they read."""

    findings: list[Finding]
    """Most likely root cause first; empty for a healthy job."""
    matched: Matched
    """The lined-up histories, for renderers that show evidence."""
    states: dict[int, RankState]
    """Where every rank was at dump time."""
    clocks: Clocks = field(repr=False, compare=False)
    """The run's clock alignment, for what a renderer may ask for later (computed on demand)."""

    @property
    def run(self) -> Run:
        """The loaded dumps, problems and notes."""
        return self.matched.run

    @property
    def notes(self) -> tuple[str, ...]:
        """The loader's notes about choices made, then what the analysis could not measure."""
        return self.matched.run.notes + self.clocks.notes

    @property
    def world_size(self) -> int:
        """World size from the dumps' headers."""
        return self.matched.run.world_size

    @property
    def ranks_with_dump(self) -> tuple[int, ...]:
        """Global ranks that have a dump."""
        return self.matched.run.ranks_with_dump

    @property
    def timeline_clock(self) -> TimelineClock:
        """Every rank's shift onto one aligned clock, for timelines.

        Estimated from the dumps on first use only: the text and JSON reports never pay for it.
        """
        return self.clocks.timeline_clock


def analyze(run: Run, workers: int = 1) -> Report:
    """Analyse already loaded dumps: match them, then every stage of ``pipeline.diagnose``.

    Args:
        run: one dump per rank, as ``load_dir`` returns.
        workers: CPUs the candidates may use (more than one: one may run in a forked process,
            ``pipeline.diagnose``); 1, the default, forks nothing (a verdict computed
            inside a training job).

    Returns:
        The report.
    """
    matched = match(run)
    clocks = Clocks(matched)
    findings, states = diagnose(matched, clocks, workers)
    return Report(findings, matched, states, clocks)


def analyze_dir(path: str | os.PathLike[str], options: AnalysisOptions | None = None) -> Report:
    """Load every dump under ``path`` and diagnose the job.

    Args:
        path: a folder searched recursively (or one dump file), or a URL of either
            (``s3://bucket/prefix``: fsspec and the protocol's package needed).
        options: analysis options; defaults when None.

    Returns:
        The report: findings ordered most likely root cause first, problems with files, notes.

    Raises:
        UsageError: ``path`` does not exist, or its URL cannot be listed.
        NoDumpsError: no readable dump under ``path``.
    """
    options = options or AnalysisOptions()
    with gc_paused():
        if isinstance(path, str) and is_url(path):  # s3://bucket/prefix: downloaded, then loaded
            from flightrec.analysis.loading.remote import load_url

            run = load_url(path, options)
        else:
            run = load_dir(os.fspath(path), options)
        return analyze(run, options.workers or default_workers())


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
