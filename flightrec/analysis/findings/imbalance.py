"""Spread imbalance: ranks that do the same work keep waiting for each other, and a different
one is last each time.

Batches of different lengths, data-dependent compute (mixture-of-experts routing, variable
sequence lengths) or a noisy host make each rank's step a little longer or shorter at
random. Then at every collective someone is last and the others wait, but never the same
rank: there is no straggler and no slow stage, yet the job loses time. The finding says how
much, and that no rank is to blame (``ranks`` is empty).

How it is measured: ``facts.spread``.
"""

from __future__ import annotations

from collections.abc import Sequence

from flightrec.analysis.candidates import Histories, blamed_by
from flightrec.analysis.facts.spread import imbalance_phrase, spread_imbalance
from flightrec.analysis.model import Finding, FindingKind

KINDS = (FindingKind.IMBALANCE,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


def find_imbalance(h: Histories, above: Sequence[Finding]) -> list[Finding]:
    """Spread imbalance, where no rank or stage explains the time lost.

    Args:
        h: the lined-up histories, with every group's recent arrivals (``Histories.tallied``)
            and the stages (groups within one stage compare ranks doing the same work).
        above: the slowness findings listed before (a straggler, a slow stage): where they
            blame a rank, the time lost is theirs, and nothing is reported here.

    Returns:
        One ``imbalance`` finding, or none.
    """
    if blamed_by(above) or h.m.run.missing_ranks:
        return []
    ev = spread_imbalance(h.tallied.pending, h.activity.stages.stage_of)
    if ev is None:
        return []
    summary = (
        f"A different rank is last each time (spread imbalance): in {ev.groups_measured} "
        f"group(s) of ranks doing the same work, the ranks {imbalance_phrase(ev)}. No culprit: uneven "
        "work from step to step (batches of different lengths, data-dependent compute), not a "
        "slow rank or stage. Nothing hangs"
    )
    return [Finding(kind=FindingKind.IMBALANCE, ranks=(), summary=summary, evidence=ev)]
