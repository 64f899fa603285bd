"""What a candidate finder receives: the stages before it (``Stages``) and the findings listed
above it. ``kinds.KINDS`` names each kind's finder; ``pipeline.diagnose`` runs them in the
table's order.

A finder is ``find(stages, above) -> list[Finding]``: ``above`` is every finding listed before
its own (the arbitration's root causes, then the finders of lower order), so that a finder
that reports only what nothing above it explains can skip what they blame (``blamed_by``).
Finders of kinds marked ``beside`` read the lined-up histories alone (``Histories``): at scale
they run in a forked process while this one builds the wait graph, and each sees only the
findings of the ``beside`` finders above it, however they run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

from flightrec.analysis.facts.lateness import StragglerOptions
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Finding
from flightrec.analysis.timing.activity import Activity
from flightrec.analysis.timing.clocks import Clocks
from flightrec.analysis.timing.tallies import Tallied, tally_groups
from flightrec.analysis.waitgraph.waits import WaitGraph


@dataclass(frozen=True)
class Histories:
    """The lined-up histories and what the slowness finders share, made once on first use."""

    m: Matched
    clocks: Clocks
    """The run's clock alignment, estimated where first read."""

    @functools.cached_property
    def tallied(self) -> Tallied:
        """Every group's recent late arrivals (``tallies.tally_groups``, with the straggler
        thresholds' window and margin)."""
        opt = StragglerOptions()
        return tally_groups(self.m, opt.recent, opt.min_margin_ms * 1e6)

    @functools.cached_property
    def activity(self) -> Activity:
        """Own times, stages and wait chains (``timing.activity``)."""
        return Activity(self.m)


@dataclass(frozen=True)
class Stages(Histories):
    """``Histories``, the wait graph and what the arbitration explained."""

    wait_graph: WaitGraph
    """Who is blocked, in what, waiting on whom (``waits.build_wait_graph``)."""
    explained: Set[str]
    """Groups the arbitration's root causes and the mismatches explain
    (``rootcause.explained_groups``)."""


Finder = Callable[[Stages, Sequence[Finding]], list[Finding]]
"""A kind's candidate finder (``kinds.KindSpec.finder``)."""


def blamed_by(findings: Iterable[Finding]) -> frozenset[int]:
    """Ranks the given findings blame."""
    return frozenset(r for f in findings for r in f.ranks)
