"""Arrival lateness: the straggler thresholds (``StragglerOptions``, whose window and margin
the shared arrivals tally uses too), the evidence of a ``straggler`` finding (what the
renderers and the in-job slow check read), and the statistics that judge it
(``chance_of_as_many``, ``percentile``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from flightrec.analysis.model import Evidence
from flightrec.analysis.timing.activity import per_step_phrase
from flightrec.analysis.timing.trend import Trend


@dataclass(frozen=True, slots=True)
class StragglerOptions:
    """Thresholds of the straggler pass.

    Attributes:
        recent: completed collectives per group looked at (the newest ones).
        min_samples: collectives a rank must have taken part in to be judged.
        min_fraction: share of them at which it must have arrived last, late.
        min_margin_ms: how much after the next-latest member an arrival must be to count as
            late (raised to three times the clock alignment's jitter where that is larger).
        max_chance: the most probability allowed that a rank with nothing wrong, arriving
            in random order among each group's members, would be last this often. A member
            of a 2-rank group is last half the time by chance alone: five late arrivals out
            of five (1 in 32) are no evidence there, but out of five in an 8-rank group
            (1 in 32,768) they are.
    """

    recent: int = 64
    min_samples: int = 5
    min_fraction: float = 0.5
    min_margin_ms: float = 5.0
    max_chance: float = 0.01


@dataclass(frozen=True, slots=True)
class LatenessRow:
    """One rank's arrival lateness over the collectives looked at, on aligned clocks."""

    rank: int
    collectives: int
    last_share: float
    """Share of them where it arrived last by a clear margin."""
    median_behind_ms: float
    """Median of its arrival minus the other members' median arrival."""
    p90_behind_ms: float
    clock_offset_ms: float | None
    """Its clock's estimated offset against the reference; None when it could not be linked."""
    clock_uncertainty_ms: float | None


@dataclass(frozen=True, slots=True)
class ClockSummary:
    """How the ranks' clocks line up: reference, offsets and their uncertainty."""

    reference_rank: int
    method: str
    max_offset_ms: float
    max_uncertainty_ms: float
    max_drift_ms: float
    unaligned_ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OwnTime:
    """A rank's time outside communication (``format.activity``) against its stage's."""

    share: float
    """Of its time, the share spent outside communication."""
    others_share: float
    """The same, typical of the other ranks of its stage (the job's, without stages)."""
    compared: int
    """How many other ranks were compared."""
    ms_per_step: float | None = None
    """Its own time per training step, where steps repeat."""
    others_ms_per_step: float | None = None


@dataclass(frozen=True, slots=True)
class StragglerEvidence(Evidence):
    """Evidence of a ``straggler`` finding."""

    HEADLINE: ClassVar[tuple[str, ...]] = (
        "last_share",
        "median_lateness_ms",
        "p90_lateness_ms",
        "others_waited_s",
        "job_delay_s",
        "confidence",
    )

    last_arrivals: int
    """Collectives it arrived at last, by a clear margin."""
    collectives: int
    """Recent collectives it took part in."""
    last_share: float
    median_lateness_ms: float
    """Typical margin behind the next-latest member, where it was last."""
    p90_lateness_ms: float
    others_waited_s: float
    """Rank-seconds the other members spent waiting for it."""
    job_delay_s: float
    """Seconds of job time its lateness cost."""
    groups: Mapping[str, int]
    """Late arrivals per group key."""
    clock_jitter_ms: float
    confidence: str
    """``high``; ``low`` for rank 0, whose extra work is often by design."""
    lateness_by_rank: tuple[LatenessRow, ...]
    """The latest ranks, and every straggler, latest first."""
    clock: ClockSummary
    likely_cause: str | None = None
    clock_assumption: str | None = None
    """Where only enqueue times were compared (no completion to align clocks): the
    assumption that made them comparable."""
    trend: Trend | None = None
    """Onset and shape of its lateness in its main group over the whole history the dumps
    hold (``flightrec.analysis.timing.trend``); None where arrivals cannot be lined up."""
    late_groups: tuple[str, ...] = ()
    """The groups where it was judged late (most late arrivals first)."""
    stage: int | None = None
    """Its pipeline stage (0 is the first), where the job has stages."""
    stages: int | None = None
    """Stages per pipeline, where the job has stages."""
    own_time: OwnTime | None = None
    """Its time outside communication against the other ranks of its stage; None where it
    cannot be measured."""
    slow_worker: bool = False
    """Its own time stands out among its stage's: it is slow itself (not only late)."""
    held_up: tuple[int, ...] = ()
    """Ranks found late because they waited on it (directly or down a chain of waits)."""
    held_by: int | None = None
    """Where its own time is like its stage's: the rank at the head of the chain of waits
    that made it late."""


def chance_of_as_many(sizes: Mapping[int, int], k: int) -> float:
    """Probability of being last at ``k`` or more of the collectives, for a member whose
    arrivals are in random order among its groups' members: ``sizes`` maps a member count
    ``n`` to collectives in groups of ``n`` (last at each with probability ``1/n``).

    The exact tail of that sum of Bernoulli variables, summed over counts (at most a few
    hundred collectives per rank: ``recent`` per group).
    """
    dist = [1.0]  # dist[j]: probability of exactly j lasts so far
    for n, count in sizes.items():
        p = 1.0 / n if n > 0 else 1.0
        for _ in range(count):
            nxt = [0.0] * (len(dist) + 1)
            for j, q in enumerate(dist):
                nxt[j] += q * (1.0 - p)
                nxt[j + 1] += q * p
            dist = nxt
    return min(1.0, sum(dist[k:]))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def own_phrase(own: OwnTime, staged: bool) -> str:
    """``it spends 67% of its time outside communication, against 34% for the other ranks
    of its stage (about 1350.0 ms a step against 680.0 ms)``."""
    where = "of its stage" if staged else "of the job"
    per_step = per_step_phrase(own.ms_per_step, own.others_ms_per_step)
    return (
        f"it spends {100 * own.share:.0f}% of its time outside communication, against "
        f"{100 * own.others_share:.0f}% for the other ranks {where}{per_step}"
    )
