"""One row per finding kind: the module that makes it, the finder ``pipeline.diagnose`` runs
for it and in which order, and the traits that the arbitration, the refinements and the
renderers read instead of lists of their own.

A new kind is a ``model.FindingKind`` member, a row here, the one module under
``analysis/findings/`` that makes it (named in ``made_by``, listing it in its ``KINDS``, with
the row's ``finder``: a ``candidates.Finder``) and a scenario test; ``test_kinds_table``
fails while any of them is missing, where a module other than ``made_by`` builds a finding of
the kind (another module hands the facts it finds to that one), and where docs/analysis.md
lists the kinds in another order than the table runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.analysis.model import Action, FindingKind


@dataclass(frozen=True, slots=True, kw_only=True)
class KindSpec:
    """What the analysis and the renderers know about one finding kind."""

    kind: FindingKind
    made_by: str
    """The module of ``flightrec.analysis.findings`` that builds findings of this kind (no
    other one does)."""
    order: int
    """Where ``pipeline.diagnose`` runs ``finder``, lower first, after the arbitration's root
    causes (which come first, weighed against each other: ``rootcause.Tie``); 0 for a kind
    only the arbitration makes."""
    finder: str = ""
    """The function of ``made_by`` that finds the kind after the arbitration, a
    ``candidates.Finder``; empty where only the arbitration makes the kind."""
    beside: bool = False
    """``finder`` reads the lined-up histories alone (``candidates.Histories``): at scale it
    runs in a forked process beside the wait graph and the arbitration."""
    action: Action
    """What to do about it, unless the finding's own evidence says otherwise (a rank that
    died of an exception, a skipped call: ``advice.advise``)."""
    simulated_by: tuple[str, ...] = ()
    """Faults of ``flightrec simulate`` (``simulate.faults.Fault`` values) whose expected
    verdict is this kind; empty where the simulator injects none that ends in it."""
    root_cause: bool = False
    """Names why a job stopped: what follows it may be folded into it (``fold``)."""
    out_of_step: bool = False
    """Describes counters out of step, which a rank held up by the root cause shows: folded
    into that root cause when it explains them (``fold``)."""
    crash_explains: bool = False
    """Blames ranks for what they did instead of arriving: an exception of that rank is its
    verdict (``crashes.place_crashes``)."""
    shifted_by_skips: bool = False
    """About one rank on one group: a skipped or extra call there is looked for (``skips``)."""
    low_confidence_below_timeout: bool = False
    """Built on waits: low confidence where every wait behind it is shorter than the hang
    timeout (``waits.mark_below_timeout``); a disagreement is wrong however short the wait."""
    hang: bool = False
    """Describes a hang: a timeline marks where its collective stalled (``report.trace``)."""
    marks_lanes: bool = False
    """Renderers mark the blamed ranks' own lanes with the kind (a timeline's thread names)."""
    gone: bool = False
    """Says the blamed ranks' processes are gone (died, exited, or left no dump): a death the
    root cause explains is folded into it, a root cause that says so needs no "then died"
    (``fold``), and a mismatch where such a rank's peers wait goes before it (``rootcause``)."""
    timed: bool = False
    """Built on times compared across ranks: less sure where clocks could not be aligned
    (``advice.advise``)."""


KINDS: dict[FindingKind, KindSpec] = {
    s.kind: s
    for s in (
        # Made by the arbitration alone (the ends of the wait-for graph, the mismatches).
        KindSpec(
            kind=FindingKind.NOT_ARRIVED,
            made_by="not_arrived",
            order=0,
            action=Action.RESTART,
            simulated_by=("stall",),
            crash_explains=True,
            shifted_by_skips=True,
            low_confidence_below_timeout=True,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.MISMATCH,
            made_by="mismatch",
            order=0,
            action=Action.FIX_CODE,
            simulated_by=("op_mismatch", "size_mismatch", "dtype_mismatch"),
            shifted_by_skips=True,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.P2P_DEADLOCK,
            made_by="p2p",
            order=0,
            action=Action.FIX_CODE,
            simulated_by=("p2p_deadlock",),
            low_confidence_below_timeout=True,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.DEADLOCK,
            made_by="p2p",
            order=0,
            action=Action.FIX_CODE,
            low_confidence_below_timeout=True,
            root_cause=True,
            hang=True,
        ),
        # Made by the arbitration too, and by a finder after it.
        KindSpec(
            kind=FindingKind.STUCK,
            made_by="stuck",
            order=1,
            finder="find_unstarted",
            action=Action.RESTART,
            low_confidence_below_timeout=True,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.STACK_HANG,
            made_by="stacks",
            order=2,
            finder="find_stack_hangs",
            action=Action.RESTART,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.P2P_UNMATCHED,
            made_by="p2p",
            order=3,
            finder="find_unmatched",
            action=Action.FIX_CODE,
            out_of_step=True,
            low_confidence_below_timeout=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.DESYNC,
            made_by="desync",
            order=4,
            finder="find_desyncs",
            action=Action.FIX_CODE,
            out_of_step=True,
            shifted_by_skips=True,
            low_confidence_below_timeout=True,
            hang=True,
        ),
        # Nothing hangs, but time is lost: one tally of arrivals and one own-time analysis
        # serve all three (``candidates.Histories``).
        KindSpec(
            kind=FindingKind.STRAGGLER,
            made_by="straggler",
            order=5,
            finder="find_stragglers",
            beside=True,
            action=Action.RESTART,
            simulated_by=("straggler", "slow_worker"),
            low_confidence_below_timeout=True,
            marks_lanes=True,
            timed=True,
        ),
        KindSpec(
            kind=FindingKind.SLOW_STAGE,
            made_by="slow_stage",
            order=6,
            finder="find_slow_stages",
            beside=True,
            action=Action.FIX_CODE,
            simulated_by=("slow_stage",),
            low_confidence_below_timeout=True,
            marks_lanes=True,
            timed=True,
        ),
        KindSpec(
            kind=FindingKind.IMBALANCE,
            made_by="imbalance",
            order=7,
            finder="find_imbalance",
            beside=True,
            action=Action.FIX_CODE,
            simulated_by=("spread_imbalance",),
            low_confidence_below_timeout=True,
            timed=True,
        ),
        # Deaths and missing dumps nothing above blames, and every exception ranks died of.
        KindSpec(
            kind=FindingKind.DEAD_RANK,
            made_by="crashes",
            order=8,
            finder="find_deaths",
            action=Action.RESTART,
            crash_explains=True,
            shifted_by_skips=True,
            low_confidence_below_timeout=True,
            gone=True,
            root_cause=True,
            hang=True,
        ),
        KindSpec(
            kind=FindingKind.MISSING_DUMP,
            made_by="not_arrived",
            order=9,
            finder="find_quiet_missing",
            action=Action.RESTART,
            simulated_by=("crash",),
            low_confidence_below_timeout=True,
            gone=True,
            root_cause=True,
            hang=True,
        ),
    )
}
"""Every kind's row (``test_kinds_table`` checks that none is missing)."""


def by_order() -> list[KindSpec]:
    """The rows of the kinds that have a finder, in the order ``pipeline.diagnose`` runs them."""
    return sorted((s for s in KINDS.values() if s.finder), key=lambda s: s.order)


def kinds_where(trait: str) -> frozenset[FindingKind]:
    """The kinds whose row has ``trait`` (a boolean field of ``KindSpec``) set.

    Args:
        trait: the field's name, ``"root_cause"`` for one.

    Returns:
        Those kinds.
    """
    return frozenset(k for k, s in KINDS.items() if getattr(s, trait))


def kind_of_fault(fault: str) -> FindingKind | None:
    """The kind a simulated fault's expected verdict has (``KindSpec.simulated_by``).

    Args:
        fault: a ``simulate.faults.Fault`` value, ``"stall"`` for one.

    Returns:
        The kind; None for a fault that ends in no finding (``"none"``).
    """
    return next((k for k, s in KINDS.items() if fault in s.simulated_by), None)
