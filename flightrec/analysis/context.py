"""What the passes share: the lined-up histories and everything derived from them once.

Every pass has one signature, ``find(ctx) -> list[Finding]``. What more than one pass (or a
renderer) needs is a property of the ``AnalysisContext``, computed on first use and kept: the
wait-for graph, the mismatches, the root causes and the groups they explain, every rank's
state, the clock alignment. A pass that builds on another pass's result reads it from here
rather than having it passed in, so the order of ``passes.PASSES`` is only their priority.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

from flightrec.analysis import mismatch, rootcause
from flightrec.analysis.clocks import (
    ClockAlignment,
    TimelineClock,
    estimate_offsets,
    timeline,
    timing_notes,
)
from flightrec.analysis.graph import DiGraph
from flightrec.analysis.loader import Run
from flightrec.analysis.matching import Matched
from flightrec.analysis.model import Finding
from flightrec.analysis.states import RankState, rank_states
from flightrec.analysis.waits import Wait, build_wait_graph

# Newest completed collectives per group that the timeline's clock alignment reads.
TIMELINE_RECENT = 256


class WaitGraph(NamedTuple):
    """The wait-for graph (see ``waits``) and every blocked entry behind it."""

    graph: DiGraph
    waits: list[Wait]


class AnalysisContext:
    """The lined-up histories of one run and what passes derive from them, each once, lazily.

    Args:
        matched: the lined-up histories (``matching.match``).

    Attributes:
        matched: the lined-up histories.
        earlier: the findings of the passes that ran before the current one, in priority
            order (``passes.run_passes`` fills it), for passes that report only what nothing
            before them explained.
    """

    def __init__(self, matched: Matched) -> None:
        self.matched = matched
        self.earlier: list[Finding] = []
        self._alignments: dict[int, ClockAlignment] = {}

    @property
    def run(self) -> Run:
        """The loaded dumps."""
        return self.matched.run

    @cached_property
    def wait_graph(self) -> WaitGraph:
        """Who is blocked, in what, waiting on whom."""
        return WaitGraph(*build_wait_graph(self.matched))

    @cached_property
    def mismatches(self) -> list[Finding]:
        """Every group's first disagreement (``mismatch.find_mismatches``)."""
        return mismatch.find_mismatches(self)

    @cached_property
    def root_causes(self) -> rootcause.RootCauses:
        """The ends of the wait-for graph with the mismatches, most explanatory first."""
        return rootcause.root_causes(self)

    @cached_property
    def explained_groups(self) -> frozenset[str]:
        """Groups a root cause or a mismatch already accounts for."""
        found = {f.process_group for f in self.mismatches if f.process_group}
        return frozenset(self.root_causes.explained | found)

    @property
    def blamed(self) -> set[int]:
        """Ranks blamed by the findings of the passes that ran so far."""
        return {r for f in self.earlier for r in f.ranks}

    @cached_property
    def states(self) -> dict[int, RankState]:
        """Where every rank was at dump time."""
        return rank_states(self.matched, self.wait_graph.waits)

    def clock_alignment(self, recent: int = TIMELINE_RECENT) -> ClockAlignment:
        """Every rank's clock offset, from its newest ``recent`` collectives per group.

        Args:
            recent: completed collectives per group to read.

        Returns:
            The alignment (computed once per ``recent``).
        """
        if recent not in self._alignments:
            self._alignments[recent] = estimate_offsets(self.matched, recent)
        return self._alignments[recent]

    @cached_property
    def timeline_clock(self) -> TimelineClock:
        """Each rank's shift from its monotonic clock to the aligned one, for timelines."""
        return timeline(self.matched, self.clock_alignment(TIMELINE_RECENT))

    @cached_property
    def notes(self) -> tuple[str, ...]:
        """What the dumps cannot say that the report should (timing missing, for one)."""
        return timing_notes(self.matched)
