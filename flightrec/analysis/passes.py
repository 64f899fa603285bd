"""The passes, in one list, in priority order: the report lists their findings in this order.

Each pass is ``find(ctx) -> list[Finding]`` over one ``AnalysisContext``; what passes share
(the wait-for graph, the mismatches, the groups a root cause explains, clock alignment) is a
context property computed once. Within a pass, the pass orders its own findings (the root-cause
pass weighs each root by how many ranks it holds up, see ``rootcause.Tie``). After the passes,
each refinement may rewrite a finding (add what it found); one reorders: ``place_crashes``
brings the exception that ended the job to the front, since a crash explains what follows it.

A new finding kind is a member of ``model.FindingKind``, a pass module (its ``find(ctx)`` and
its ``Evidence`` subclass, which the JSON renderer writes without being told about it) listed
here at its priority, and a scenario test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from flightrec.analysis.context import AnalysisContext
from flightrec.analysis.crashes import find_crashes, place_crashes
from flightrec.analysis.desync import find_desyncs
from flightrec.analysis.fanout import Background, can_fork
from flightrec.analysis.fold import fold_consequences
from flightrec.analysis.model import Finding
from flightrec.analysis.not_arrived import find_quiet_deaths, find_quiet_missing
from flightrec.analysis.p2p import find_unmatched
from flightrec.analysis.rootcause import find_root_causes
from flightrec.analysis.skips import annotate_shifts
from flightrec.analysis.straggler import find_stragglers
from flightrec.analysis.waits import mark_below_timeout

Pass = Callable[[AnalysisContext], list[Finding]]
Refinement = Callable[[AnalysisContext, list[Finding]], list[Finding]]

PASSES: tuple[Pass, ...] = (
    # What holds the job up: not_arrived, dead_rank, missing_dump, p2p_deadlock, deadlock,
    # stuck, and every mismatch (ctx.mismatches), weighed together.
    find_root_causes,
    # Sends and receives that never paired, where nobody is blocked on them: p2p_unmatched.
    find_unmatched,
    # Groups out of step that no root cause or mismatch explains: desync.
    find_desyncs,
    # Nothing hangs, but one rank keeps everyone waiting: straggler.
    find_stragglers,
    # Ranks whose black box says they died, blamed by nothing above: dead_rank.
    find_quiet_deaths,
    # Ranks without a dump, blamed by nothing above: missing_dump.
    find_quiet_missing,
    # Ranks that died of an exception: dead_rank (placed by ``place_crashes`` below).
    find_crashes,
)
"""Every pass, highest priority first."""

BESIDE: frozenset[Pass] = frozenset({find_stragglers})
"""Passes that read the lined-up histories alone, never ``ctx.earlier`` nor what another
pass leaves in the context: with more than one CPU, they may run in a forked process beside
the others (``run_passes``), and give the same findings."""
BESIDE_FROM = 256
"""Ranks from which a pass in ``BESIDE`` runs beside the others (below, forking costs more
than the pass)."""

REFINEMENTS: tuple[Refinement, ...] = (
    # The exception that ended the job first (the verdict), later ones as evidence or last.
    place_crashes,
    # What the root cause explains (its peers' deaths, desyncs and unmatched transfers of the
    # ranks it held up) folded into it; waits of processes that ended since marked so.
    fold_consequences,
    # The skipped or extra call behind a finding about one rank on one group.
    annotate_shifts,
    # Findings whose every wait a requested snapshot caught before the hang timeout.
    mark_below_timeout,
)
"""Run over the ordered findings after every pass."""


def run_passes(ctx: AnalysisContext, workers: int = 1) -> list[Finding]:
    """Run every pass in priority order, then every refinement.

    Args:
        ctx: the analysis context; its ``earlier`` list is filled as passes run.
        workers: CPUs the analysis may use. With more than one, the passes in ``BESIDE``
            run in forked processes while this one runs the rest (the straggler pass is
            about half of the passes' time at 16,384 ranks); their findings take their
            place in priority order all the same.

    Returns:
        The findings, most likely root cause first.
    """
    with contextlib.ExitStack() as stack:
        beside: dict[Pass, Background[AnalysisContext, list[Finding]]] = {}
        if workers > 1 and can_fork() and len(ctx.run.dumps) >= BESIDE_FROM:
            for find in PASSES:
                if find in BESIDE:
                    beside[find] = stack.enter_context(Background(find, ctx))
        for find in PASSES:
            found = beside[find].result() if find in beside else find(ctx)
            ctx.earlier = ctx.earlier + found
    findings = ctx.earlier
    for refine in REFINEMENTS:
        findings = refine(ctx, findings)
    return findings
