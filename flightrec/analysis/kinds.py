"""One row per finding kind: where it is made, where it is listed, and the traits that the
arbitration, the refinements and the renderers read instead of lists of their own.

A new kind is a ``model.FindingKind`` member, a row here, the one candidate module under
``analysis/findings/`` that makes it (named in ``made_by``, listing it in its ``KINDS``) and
is called at its priority in ``pipeline.diagnose``, and a scenario test; ``test_kinds_table``
fails while any of them is missing, and where a module other than ``made_by`` builds a
finding of the kind (another module hands the facts it finds to that one).
"""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.analysis.model import Action, FindingKind


@dataclass(frozen=True, slots=True)
class KindSpec:
    """What the analysis and the renderers know about one finding kind."""

    kind: FindingKind
    made_by: str
    """The module of ``flightrec.analysis.findings`` that builds findings of this kind (no
    other one does)."""
    priority: int
    """Where ``pipeline.diagnose`` lists the kind, lower first; kinds of equal priority are
    weighed against each other by the root-cause arbitration (``rootcause.Tie``)."""
    root_cause: bool
    """Names why a job stopped: what follows it may be folded into it (``fold``)."""
    out_of_step: bool
    """Describes counters out of step, which a rank held up by the root cause shows: folded
    into that root cause when it explains them (``fold``)."""
    crash_explains: bool
    """Blames ranks for what they did instead of arriving: an exception of that rank is its
    verdict (``crashes.place_crashes``)."""
    shifted_by_skips: bool
    """About one rank on one group: a skipped or extra call there is looked for (``skips``)."""
    low_confidence_below_timeout: bool
    """Built on waits: low confidence where every wait behind it is shorter than the hang
    timeout (``waits.mark_below_timeout``); a disagreement is wrong however short the wait."""
    hang: bool
    """Describes a hang: a timeline marks where its collective stalled (``report.trace``)."""
    marks_lanes: bool
    """Renderers mark the blamed ranks' own lanes with the kind (a timeline's thread names)."""
    gone: bool
    """Says the blamed ranks' processes are gone (died, exited, or left no dump): a death the
    root cause explains is folded into it, a root cause that says so needs no "then died"
    (``fold``), and a mismatch where such a rank's peers wait goes before it (``rootcause``)."""
    simulated_by: tuple[str, ...]
    """Faults of ``flightrec simulate`` (``simulate.faults.Fault`` values) whose expected
    verdict is this kind; empty where the simulator injects none that ends in it."""
    action: Action
    """What to do about it, unless the finding's own evidence says otherwise (a rank that
    died of an exception, a skipped call: ``advice.advise``)."""
    timed: bool
    """Built on times compared across ranks: less sure where clocks could not be aligned
    (``advice.advise``)."""


KINDS: dict[FindingKind, KindSpec] = {
    s.kind: s
    for s in (
        #        kind                       made_by          prio root  step   crash  skips  timeout hang   lanes  gone   simulated_by                                          action     timed
        KindSpec(FindingKind.NOT_ARRIVED, "not_arrived", 0, True, False, True, True, True, True, False, False, ("stall",), Action.RESTART, False),
        KindSpec(FindingKind.DEAD_RANK, "crashes", 0, True, False, True, True, True, True, False, True, (), Action.RESTART, False),
        KindSpec(FindingKind.MISSING_DUMP, "not_arrived", 0, True, False, False, False, True, True, False, True, ("crash",), Action.RESTART, False),
        KindSpec(FindingKind.MISMATCH, "mismatch", 0, True, False, False, True, False, True, False, False, ("op_mismatch", "size_mismatch", "dtype_mismatch"), Action.FIX_CODE, False),
        KindSpec(FindingKind.P2P_DEADLOCK, "p2p", 0, True, False, False, False, True, True, False, False, ("p2p_deadlock",), Action.FIX_CODE, False),
        KindSpec(FindingKind.DEADLOCK, "p2p", 0, True, False, False, False, True, True, False, False, (), Action.FIX_CODE, False),
        KindSpec(FindingKind.STUCK, "stuck", 0, True, False, False, False, True, True, False, False, (), Action.RESTART, False),
        KindSpec(FindingKind.STACK_HANG, "stacks", 0, True, False, False, False, False, True, False, False, (), Action.RESTART, False),
        KindSpec(FindingKind.P2P_UNMATCHED, "p2p", 1, False, True, False, False, True, True, False, False, (), Action.FIX_CODE, False),
        KindSpec(FindingKind.DESYNC, "desync", 2, False, True, False, True, True, True, False, False, (), Action.FIX_CODE, False),
        KindSpec(FindingKind.STRAGGLER, "straggler", 3, False, False, False, False, True, False, True, False, ("straggler", "slow_worker"), Action.RESTART, True),
        KindSpec(FindingKind.SLOW_STAGE, "slow_stage", 3, False, False, False, False, True, False, True, False, ("slow_stage",), Action.FIX_CODE, True),
        KindSpec(FindingKind.IMBALANCE, "imbalance", 4, False, False, False, False, True, False, False, False, ("spread_imbalance",), Action.FIX_CODE, True),
    )
}  # fmt: skip
"""Every kind's row (``test_kinds_table`` checks that none is missing)."""


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
