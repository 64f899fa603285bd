"""The analysis, stage by stage, top to bottom: each stage is a function of what the earlier
ones returned, so what a stage reads is in its arguments and nothing depends on call order.

    load (``loader.load_dir``) -> match (``matching.match``)       before ``diagnose``
    wait graph     who is blocked, in what, waiting on whom         ``waits.build_wait_graph``
    candidates     each finding module's ``find_*``: mismatches, p2p_unmatched, desync,
                   the slowness candidates (straggler, slow_stage, imbalance: one own-time
                   and arrivals analysis shared, ``find_slowness``), quiet deaths and
                   missing dumps, crashes
    arbitration    the ends of the wait-for graph weighed with the mismatches
                   (``rootcause.root_causes``): not_arrived, dead_rank, missing_dump,
                   p2p_deadlock, deadlock, stuck, mismatch; stack_hang where the dumps
                   are stacks alone (``flightrec attach``)
    refinements    crashes placed, consequences folded, skipped calls, waits below timeout,
                   what to do next (``advice.advise``)

The report lists findings in the order ``diagnose`` collects them, which is each kind's
priority (``kinds.KINDS``); a candidate orders its own findings (the arbitration weighs each
root by how many ranks it holds up, ``rootcause.Tie``). A candidate that reports only what
nothing above it explains takes what it must skip as an argument (``blamed_by`` the findings
above it, the groups the arbitration explained).

A new finding kind: a ``model.FindingKind`` member, its row in ``kinds.KINDS``, the one
candidate module that builds its findings (a ``find_*`` returning them, and its ``Evidence``
subclass, which the JSON renderer writes without being told about it) called here at its
priority, and a scenario test; ``tests/unit/test_kinds_table.py`` fails while one of them is
missing, or where another module builds a finding of the kind.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from typing import NamedTuple

from flightrec.analysis.fanout import Background, can_fork
from flightrec.analysis.findings.crashes import find_crashes, find_quiet_deaths, place_crashes
from flightrec.analysis.findings.desync import find_desyncs
from flightrec.analysis.findings.imbalance import find_imbalance
from flightrec.analysis.findings.mismatch import find_mismatches
from flightrec.analysis.findings.not_arrived import find_quiet_missing
from flightrec.analysis.findings.p2p import find_unmatched
from flightrec.analysis.findings.slow_stage import find_slow_stages
from flightrec.analysis.findings.stacks import find_stack_hangs
from flightrec.analysis.findings.straggler import StragglerOptions, find_stragglers
from flightrec.analysis.findings.stuck import find_unstarted
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Finding
from flightrec.analysis.states import RankState, rank_states
from flightrec.analysis.timing.activity import Activity
from flightrec.analysis.timing.clocks import Clocks
from flightrec.analysis.timing.tallies import tally_groups
from flightrec.analysis.verdict.advice import advise
from flightrec.analysis.verdict.fold import fold_consequences
from flightrec.analysis.verdict.rootcause import explained_groups, root_causes
from flightrec.analysis.verdict.skips import annotate_shifts
from flightrec.analysis.waitgraph.waits import build_wait_graph, mark_below_timeout

BESIDE_FROM = 256
"""Ranks from which the slowness candidates run in a forked process beside the others (they
read the lined-up histories alone; below this, forking costs more than they do)."""


class Diagnosis(NamedTuple):
    """What ``diagnose`` returns."""

    findings: list[Finding]
    """Most likely root cause first; empty for a healthy job."""
    states: dict[int, RankState]
    """Where every rank was at dump time."""


def blamed_by(findings: Iterable[Finding]) -> frozenset[int]:
    """Ranks the given findings blame."""
    return frozenset(r for f in findings for r in f.ranks)


def find_slowness(m: Matched, clocks: Clocks) -> list[Finding]:
    """Nothing hangs, but time is lost: slow workers and the ranks they hold up
    (``straggler``), slow pipeline stages (``slow_stage``), then spread imbalance where
    neither explains it (``imbalance``). One arrivals tally and one own-time analysis
    (``timing.activity``) serve all three.

    Args:
        m: the lined-up histories.
        clocks: the run's clock alignment.

    Returns:
        Their findings, in that order.
    """
    opt = StragglerOptions()
    tallied = tally_groups(m, opt.recent, opt.min_margin_ms * 1e6)
    activity = Activity(m)
    found = find_stragglers(m, clocks, opt, activity, tallied)
    found += find_slow_stages(m, activity)
    return found + find_imbalance(m, tallied, activity, blamed_by(found))


def diagnose(m: Matched, clocks: Clocks, workers: int = 1) -> Diagnosis:
    """Every stage after matching, in order: wait graph, candidates, arbitration, refinements.

    Args:
        m: the lined-up histories (``matching.match``).
        clocks: the run's clock alignment, estimated where first read.
        workers: CPUs the analysis may use. With more than one (and at least ``BESIDE_FROM``
            ranks), the slowness candidates run in a forked process while this one runs the
            rest (about half of the candidates' time at 16,384 ranks); their findings take
            their place all the same.

    Returns:
        The findings, most likely root cause first, and every rank's state.
    """
    with contextlib.ExitStack() as stack:
        slowness: Background[Matched, list[Finding]] | None = None
        if workers > 1 and can_fork() and len(m.run.dumps) >= BESIDE_FROM:
            find = functools.partial(find_slowness, clocks=clocks)
            slowness = stack.enter_context(Background(find, m))
        # Wait graph, and the mismatches the arbitration weighs with its ends.
        wait_graph = build_wait_graph(m)
        mismatches = find_mismatches(m)
        # Arbitration: not_arrived, dead_rank, missing_dump, p2p_deadlock, deadlock, stuck,
        # and every mismatch, weighed together.
        roots = root_causes(m, wait_graph, mismatches)
        findings = list(roots.findings)
        # A second fault in a collective someone never entered: members whose GPU never
        # started it while other members' GPUs are inside it.
        findings += find_unstarted(m, wait_graph, blamed_by(findings))
        # Snapshots taken from outside with stacks and no ring: where each rank stands.
        findings += find_stack_hangs(m)
        # Sends and receives that never paired, where nobody is blocked on them.
        findings += find_unmatched(m, wait_graph.graph)
        # Groups out of step that no root cause or mismatch explains.
        findings += find_desyncs(m, explained_groups(roots, mismatches))
        # Nothing hangs, but a rank, a stage or uneven work keeps everyone waiting.
        findings += slowness.result() if slowness is not None else find_slowness(m, clocks)
    # Ranks whose black box says they died, or without a dump, blamed by nothing above.
    findings += find_quiet_deaths(m, blamed_by(findings))
    findings += find_quiet_missing(m, blamed_by(findings))
    # Ranks that died of an exception (placed by ``place_crashes`` below).
    findings += find_crashes(m, wait_graph.waits)
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
