"""Spread imbalance, measured: how much time ranks that do the same work lose waiting for
each other when a different one is last each time (``spread_imbalance``), for the
``imbalance`` finding and the in-job slow check alike.

Measured on the groups whose members do the same work (every member in one pipeline stage:
data- and tensor-parallel groups; every group in a job without stages), over the same
recent collectives the straggler pass lines up (``timing.tallies``): per collective, how far
the last member arrived behind the typical other one (the median of the others), against
the time between collectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import ClassVar

from flightrec.analysis.model import Evidence
from flightrec.analysis.timing.tallies import Pending

MIN_LOST = 0.10
"""A typical rank spends at least this share of its time waiting for the last member of its
groups of ranks doing the same work."""
MIN_SPREAD_MS = 10.0
"""... the last arriving typically at least this long after the others' median (below that,
jitter on a busy host: the in-job slow check's floor too)."""
MAX_SAME_LAST = 0.5
"""... and in a typical group no member is last at more than this share of its collectives
(or 1.5 times its fair share, in a small group: 0.75 in a pair)."""
MIN_GROUPS = 1
MAX_GROUPS = 64
"""Groups measured at most (evenly spread): a job-wide typical value."""
MAX_MEMBERS = 256
"""Members of a larger group measured (evenly spread): enough for a typical lateness."""
MIN_COLLECTIVES = 32
"""A group's recent collectives needed before its spread counts: over fewer, start-up and a
busy host's scheduling read as spread (a healthy 4-rank run of 16 collectives on a busy 2-core
machine showed a fifth of its time waiting)."""


@dataclass(frozen=True, slots=True)
class ImbalanceEvidence(Evidence):
    """Evidence of an ``imbalance`` finding."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("lost_share", "median_spread_ms")

    lost_share: float
    """Typical share of a rank's time spent waiting for the last member of its groups of
    ranks doing the same work."""
    median_spread_ms: float
    """Typical lateness of a collective's last member behind the others' median."""
    most_often_last: float
    """The largest share of a group's collectives any one member was last at (typical)."""
    groups_measured: int
    """Groups of ranks doing the same work that were measured."""
    collectives: int
    """Collectives measured over all of them."""


@dataclass(frozen=True, slots=True)
class _GroupSpread:
    lost: float
    spread_ms: float
    same_last: float
    same_last_allowed: float
    """``same_last`` against what a group of its size may show (1 at the limit)."""
    collectives: int


def _spread(p: Pending) -> _GroupSpread | None:
    gt = p.tally
    n = len(p.ranks)
    if n < 2 or len(gt.seqs) < MIN_COLLECTIVES:
        return None
    taken = range(n) if n <= MAX_MEMBERS else [(j * n) // MAX_MEMBERS for j in range(MAX_MEMBERS)]
    rows = [gt.arrivals[j] for j in taken]
    spreads: list[float] = []
    middles: list[float] = []
    for col in zip(*rows, strict=True):
        ordered = sorted(col)
        mid = median(ordered[:-1])  # (the others': in a pair, the one that waited)
        spreads.append(ordered[-1] - mid)
        middles.append(median(ordered))
    span = middles[-1] - middles[0]
    if span <= 0:
        return None
    lost = sum(spreads[1:]) / span
    same_last = max(gt.lasts) / len(gt.seqs) if gt.lasts else 1.0
    allowed = max(MAX_SAME_LAST, 1.5 / n)
    return _GroupSpread(lost, median(spreads) / 1e6, same_last, same_last / allowed, len(gt.seqs))


def spread_imbalance(
    pendings: Sequence[Pending], stage_of: Mapping[int, int]
) -> ImbalanceEvidence | None:
    """The time lost to spread imbalance, where it is enough to report (see the module).

    Args:
        pendings: groups' recent arrivals (``tallies.tally_groups``, or the in-job slow
            check's digests lined up).
        stage_of: each rank's pipeline stage (``stages.Stages.stage_of``): groups whose
            members are all in one stage compare ranks doing the same work.

    Returns:
        The evidence, or None below ``MIN_LOST``, ``MIN_SPREAD_MS`` or with a member last
        too often (a straggler's, not spread).
    """
    alike = [
        p
        for p in pendings
        if len({stage_of.get(r, -1) for r in p.ranks}) == 1 and len(p.ranks) >= 2
    ]
    if len(alike) > MAX_GROUPS:
        alike = [alike[(i * len(alike)) // MAX_GROUPS] for i in range(MAX_GROUPS)]
    spreads = {id(p): g for p in alike if (g := _spread(p)) is not None}
    measured = list(spreads.values())
    if len(measured) < MIN_GROUPS:
        return None
    # Per rank, the share of its time it waits for the last member, summed over its groups
    # of ranks doing the same work (a tensor-parallel and a data-parallel one wait at
    # different times); and the typical lateness in the group where it waits most.
    per_rank: dict[int, list[_GroupSpread]] = {}
    for p in alike:
        g = spreads.get(id(p))
        if g is not None:
            for r in p.ranks:
                per_rank.setdefault(r, []).append(g)
    lost = median(sum(g.lost for g in gs) for gs in per_rank.values())
    spread_ms = median(max(gs, key=lambda g: g.lost).spread_ms for gs in per_rank.values())
    if (
        lost < MIN_LOST
        or spread_ms < MIN_SPREAD_MS
        or median(g.same_last_allowed for g in measured) > 1.0
    ):
        return None
    return ImbalanceEvidence(
        round(lost, 3),
        round(spread_ms, 3),
        round(median(g.same_last for g in measured), 3),
        len(measured),
        sum(g.collectives for g in measured),
    )


def imbalance_phrase(ev: ImbalanceEvidence) -> str:
    """``spend 13% of their time waiting for the last one ...`` (of ranks doing the same
    work)."""
    return (
        f"spend {100 * ev.lost_share:.0f}% of their time waiting for "
        f"the last one, which arrives typically {ev.median_spread_ms:.1f} ms after the others, "
        f"and no rank is last at more than {100 * ev.most_often_last:.0f}% of a group's "
        "collectives (typically)"
    )
