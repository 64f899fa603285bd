"""The analysis, stage by stage, top to bottom: each stage is a function of what the earlier
ones returned, so what a stage reads is in its arguments and nothing depends on call order.

    load (``loader.load_dir``) -> match (``matching.match``)       before ``diagnose``
    wait graph     who is blocked, in what, waiting on whom         ``waits.build_wait_graph``
    mismatches     disagreements in the collectives groups are in   ``mismatch.find_mismatches``
    arbitration    the ends of the wait-for graph weighed with the mismatches
                   (``rootcause.root_causes``): not_arrived, dead_rank, missing_dump,
                   p2p_deadlock, deadlock, stuck, mismatch
    finders        each kind's finder, in the kinds table's order (``kinds.by_order``):
                   stuck (a second fault: a GPU that never started), stack_hang,
                   p2p_unmatched, desync, straggler, slow_stage, imbalance (the ``beside``
                   kinds: one arrivals tally and one own-time analysis shared, in a forked
                   process at scale), dead_rank (quiet deaths, every exception ranks died
                   of), missing_dump (ranks without a dump nobody waited on)
    refinements    crashes placed, consequences folded, skipped calls, waits below timeout,
                   what to do next (``advice.advise``)

The report lists findings in the order ``diagnose`` collects them: the arbitration's root
causes (each weighed by how many ranks it holds up, ``rootcause.Tie``), then each finder's in
the table's order; a finder orders its own findings. A finder that reports only what nothing
above it explains reads the findings above it (``candidates.blamed_by``); the crashes are put
where each explains most afterwards (``crashes.place_crashes``).

A new finding kind: a ``model.FindingKind`` member, its row in ``kinds.KINDS`` (with its
finder and order), the one module that builds its findings (the finder, and its ``Evidence``
subclass, which the JSON renderer writes without being told about it), and a scenario test;
``tests/unit/test_kinds_table.py`` fails while one of them is missing, or where another module
builds a finding of the kind.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flightrec.analysis.findings as findings_package
from flightrec.analysis.candidates import Histories, Stages
from flightrec.analysis.fanout import Background, can_fork
from flightrec.analysis.findings.crashes import place_crashes
from flightrec.analysis.findings.mismatch import find_mismatches
from flightrec.analysis.kinds import KindSpec, by_order
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Finding
from flightrec.analysis.states import RankState, rank_states
from flightrec.analysis.timing.clocks import Clocks
from flightrec.analysis.verdict.advice import advise
from flightrec.analysis.verdict.fold import fold_consequences
from flightrec.analysis.verdict.rootcause import explained_groups, root_causes
from flightrec.analysis.verdict.skips import annotate_shifts
from flightrec.analysis.waitgraph.waits import build_wait_graph, mark_below_timeout

BESIDE_FROM = 256
"""Ranks from which the ``beside`` finders run in a forked process beside the others (they
read the lined-up histories alone; below this, forking costs more than they do)."""


class Diagnosis(NamedTuple):
    """What ``diagnose`` returns."""

    findings: list[Finding]
    """Most likely root cause first; empty for a healthy job."""
    states: dict[int, RankState]
    """Where every rank was at dump time."""


def finder_of(spec: KindSpec) -> Callable[..., list[Finding]]:
    """The finder a kind's row names (``KindSpec.finder`` in ``KindSpec.made_by``): a
    ``candidates.Finder``, which a ``beside`` kind's takes ``candidates.Histories`` for."""
    module = importlib.import_module(f"{findings_package.__name__}.{spec.made_by}")
    found: Callable[..., list[Finding]] = getattr(module, spec.finder)
    return found


def run_beside(h: Histories, rows: Sequence[KindSpec]) -> list[Finding]:
    """The ``beside`` kinds' finders, in order, each seeing the findings of those before it.

    Args:
        h: the lined-up histories.
        rows: the ``beside`` rows, in the table's order.

    Returns:
        Their findings, in that order.
    """
    found: list[Finding] = []
    for spec in rows:
        found += finder_of(spec)(h, found)
    return found


def diagnose(m: Matched, clocks: Clocks, workers: int = 1) -> Diagnosis:
    """Every stage after matching, in order: wait graph, arbitration, finders, refinements.

    Args:
        m: the lined-up histories (``matching.match``).
        clocks: the run's clock alignment, estimated where first read.
        workers: CPUs the analysis may use. With more than one (and at least ``BESIDE_FROM``
            ranks), the ``beside`` finders run in a forked process while this one builds the
            wait graph and the rest (about half of the candidates' time at 16,384 ranks);
            their findings take their place all the same.

    Returns:
        The findings, most likely root cause first, and every rank's state.
    """
    rows = by_order()
    beside = [spec for spec in rows if spec.beside]
    with contextlib.ExitStack() as stack:
        lane: Background[Histories, list[Finding]] | None = None
        if beside and workers > 1 and can_fork() and len(m.run.dumps) >= BESIDE_FROM:
            run = functools.partial(run_beside, rows=beside)
            lane = stack.enter_context(Background(run, Histories(m, clocks)))
        # Wait graph, and the mismatches the arbitration weighs with its ends.
        wait_graph = build_wait_graph(m)
        mismatches = find_mismatches(m)
        # Arbitration: not_arrived, dead_rank, missing_dump, p2p_deadlock, deadlock, stuck,
        # and every mismatch, weighed together.
        roots = root_causes(m, wait_graph, mismatches)
        stages = Stages(m, clocks, wait_graph, explained_groups(roots, mismatches))
        findings = list(roots.findings)
        # Each kind's finder, in the table's order; the beside ones as one lane.
        for spec in rows:
            if not spec.beside:
                findings += finder_of(spec)(stages, findings)
            elif spec is beside[0]:
                findings += lane.result() if lane is not None else run_beside(stages, beside)
    # Refinements, over the ordered findings. The exception that ended the job first (the
    # verdict), later ones as evidence or last.
    findings = place_crashes(m, findings)
    # What the root cause explains (its peers' deaths, desyncs and unmatched transfers of the
    # ranks it held up) folded into it; waits of processes that ended since marked so.
    findings = fold_consequences(m, findings)
    # The skipped or extra call behind a finding about one rank on one group.
    findings = annotate_shifts(m, findings)
    # Findings whose every wait a requested snapshot caught before the hang timeout.
    findings = mark_below_timeout(wait_graph.waits, findings)
    # What to do next, and how sure: restart or fix the code.
    findings = advise(m, findings)
    return Diagnosis(findings, rank_states(m, wait_graph.waits))
