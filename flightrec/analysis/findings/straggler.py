"""Stragglers: a rank that arrives last at collectives, again and again, while nothing hangs.

In a synchronous collective every member waits for the slowest, so durations all look alike;
the signal is who arrives last. Arrivals (enqueue times) of different ranks are compared on
one clock, aligned from the dumps themselves (``clocks.group_arrivals``: completions of one
collective are simultaneous). A straggler is last at most of the recent collectives it took
part in, by a margin well above ordinary jitter and above the alignment's own uncertainty,
and far more often than random arrival order would make it (in a 2-rank group every member is
last half the time).

Rank 0 often does legitimate extra work between steps (logging, evaluation, checkpoint
writes): when it is the late one, the finding says so and carries low confidence.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import ClassVar

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Evidence, Finding, FindingKind, is_library_frame
from flightrec.analysis.timing.clocks import (
    ClockAlignment,
    Clocks,
    HostArrivals,
    enqueue_arrivals,
    may_share,
)
from flightrec.analysis.timing.lastarrivals import GroupTally, members_of, tally, tally_arrivals
from flightrec.analysis.timing.trend import Trend, median_rule, straggler_trend, trend_phrase
from flightrec.text import compress

KINDS = (FindingKind.STRAGGLER,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""

# Words in a function or file name that say "extra work a coordinating rank does".
_EXTRA_WORK = re.compile(
    r"log|print|save|checkpoint|ckpt|write|wandb|tensorboard|eval|metric", re.I
)
# Ranks listed per finding in the lateness table.
TABLE_RANKS = 16


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


@dataclass(slots=True)
class _Tally:
    taken: int = 0
    last: int = 0
    late: list[float] = field(default_factory=list)
    """Margins (ms) behind the next-latest member, where it was last by a clear margin."""
    behind: list[float] = field(default_factory=list)
    """Arrival minus the other members' median arrival (ms), every collective."""
    waited_ns: int = 0
    delay_ns: int = 0
    groups: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    spread_ns: float = 0.0
    sizes: Counter[int] = field(default_factory=Counter)
    """Collectives taken part in, per member count of their group."""


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


_Rule = tuple[int, float, int, float, float]


@dataclass(frozen=True, slots=True)
class _Pending:
    """What a group's tally leaves for the steps that only a finding needs."""

    ranks: Sequence[int]
    """The members tallied, in rank order."""
    tally: GroupTally


def _count(
    m: Matched, group: str, ranks: Sequence[int], gt: GroupTally, t: dict[int, _Tally]
) -> _Pending:
    """Add a group's tally (members ``ranks``) to the per-rank tallies ``t``."""
    n = len(ranks)
    for j, c in enumerate(gt.lasts):
        if c:
            t[ranks[j]].last += c
    for i, j, margin in gt.late:
        r = ranks[j]
        tl = t[r]
        tl.late.append(margin / 1e6)
        tl.waited_ns += margin * (n - 1)
        tl.delay_ns += margin
        tl.groups[group] += 1
        d = m.dump(r)
        tl.ops[d.string(d.columns["op"][gt.positions[j][i]])] += 1
    taken = len(gt.seqs)
    for r in ranks:
        tr = t[r]
        tr.taken += taken
        tr.sizes[n] += taken
    return _Pending(ranks, gt)


def _add_evidence(pending: _Pending, blamed: set[int], t: dict[int, _Tally]) -> None:
    """Per member, arrival minus the others' median (ms); per blamed rank, its clock jitter.

    Only a finding needs these: computed then, one comprehension per member and group.
    """
    gt = pending.tally
    rows = [gt.arrivals[j] for j in range(len(pending.ranks))]
    rules = [median_rule(sorted(col)) for col in zip(*rows, strict=True)]
    for r, mine in zip(pending.ranks, rows, strict=True):
        t[r].behind.extend(
            [
                (a - (hi if a > t1 else (mid if a > t2 else lo))) / 1e6
                for a, (t1, hi, t2, mid, lo) in zip(mine, rules, strict=True)
            ]
        )
    for j, r in enumerate(pending.ranks):
        if gt.lasts[j] and r in blamed:
            t[r].spread_ns = max(t[r].spread_ns, gt.spread(j))


def lateness_table(
    tallies: dict[int, _Tally], keep: Sequence[int], alignment: ClockAlignment
) -> tuple[LatenessRow, ...]:
    """Per-rank lateness rows, latest first: the ``keep`` ranks plus the latest others.

    Each row also carries the rank's estimated clock offset and its uncertainty (None for a
    rank whose clock could not be linked to the reference).
    """
    rows = sorted(
        tallies.items(), key=lambda kv: (-(median(kv[1].behind) if kv[1].behind else 0.0), kv[0])
    )
    chosen = [r for r, _ in rows[:TABLE_RANKS]]
    chosen += [r for r in keep if r not in chosen]
    out: list[LatenessRow] = []
    for r, tr in rows:
        if r not in chosen:
            continue
        c = alignment.clocks.get(r)
        out.append(
            LatenessRow(
                rank=r,
                collectives=tr.taken,
                last_share=round(len(tr.late) / tr.taken, 3) if tr.taken else 0.0,
                median_behind_ms=round(median(tr.behind), 3) if tr.behind else 0.0,
                p90_behind_ms=round(percentile(tr.behind, 0.9), 3),
                clock_offset_ms=round(c.offset_ns / 1e6, 3) if c else None,
                clock_uncertainty_ms=round(c.uncertainty_ns / 1e6, 4) if c else None,
            )
        )
    return tuple(out)


def _extra_work_hint(m: Matched, rank: int) -> str | None:
    """Where rank's own code does extra work, if its stack at dump time says so."""
    for frame in m.dump(rank).current_stack():
        if not is_library_frame(frame) and _EXTRA_WORK.search(f"{frame.function} {frame.file}"):
            return f"{frame.function} ({frame.where()})"
    return None


def find_stragglers(
    m: Matched, clocks: Clocks, options: StragglerOptions | None = None
) -> list[Finding]:
    """Ranks that consistently arrive last at completed collectives.

    Args:
        m: the lined-up histories.
        clocks: the run's clock alignment (read only for the ranks found late).
        options: thresholds; defaults when None.

    Returns:
        ``straggler`` findings, the most consistent straggler first; empty for a healthy job.
    """
    opt = options or StragglerOptions()
    floor_ns = opt.min_margin_ms * 1e6
    tallies: dict[int, _Tally] = defaultdict(_Tally)
    pending: list[_Pending] = []
    assumed: dict[int, str] = {}
    windows: dict[int, tuple[array[int], array[int]]] = {}
    for key, info in m.groups.items():
        if len(info.ranks) < 2:
            continue
        if may_share(m, key, opt.recent):
            ranks, members = members_of(m, key, opt.recent, windows)
            gt = tally(members, floor_ns)
            if gt is not None:
                kept = [ranks[j] for j in gt.kept]
                pending.append(_count(m, key, kept, gt, tallies))
                continue
        # No completion times (PyTorch's gloo recorder): enqueue times, one host at a time.
        for ha in enqueue_arrivals(m, key, opt.recent):
            ga = ha.arrivals
            pending.append(_count(m, key, ga.ranks, tally_arrivals(ga, floor_ns), tallies))
            for r in ga.ranks:
                assumed[r] = _assumption(ha)
    blamed: list[tuple[float, int]] = []
    for r, tr in tallies.items():
        if tr.taken < opt.min_samples or len(tr.late) / tr.taken < opt.min_fraction:
            continue
        if median(tr.late) < opt.min_margin_ms:
            continue
        if chance_of_as_many(tr.sizes, len(tr.late)) > opt.max_chance:
            continue  # as often as random arrival order would make it last: no evidence
        blamed.append((len(tr.late) / tr.taken, r))
    # Rank 0's lateness is often by design (see the module doc): other stragglers first.
    blamed.sort(key=lambda kv: (kv[1] == 0, -kv[0], kv[1]))
    if not blamed:
        return []
    blamed_ranks = {r for _, r in blamed}
    for p in pending:
        _add_evidence(p, blamed_ranks, tallies)
    alignment = clocks.alignment(opt.recent)
    table = lateness_table(tallies, [r for _, r in blamed], alignment)
    clock = clock_summary(alignment)
    return [_finding(m, r, tallies[r], table, clock, assumed.get(r)) for _, r in blamed]


def _assumption(ha: HostArrivals) -> str:
    ranks = compress(ha.arrivals.ranks)
    where = f"on host {ha.host}" if ha.host else "on one host (their dumps do not name it)"
    return (
        f"compared by enqueue times alone (the dumps record no completion): assumes ranks "
        f"{ranks} {where} share one clock"
    )


def clock_summary(a: ClockAlignment) -> ClockSummary:
    """How the ranks' clocks line up: reference, offsets and their uncertainty."""
    offsets = [abs(c.offset_ns) for c in a.clocks.values()]
    return ClockSummary(
        reference_rank=a.reference,
        method="median of completion differences of shared collectives",
        max_offset_ms=round(max(offsets, default=0) / 1e6, 3),
        max_uncertainty_ms=round(a.max_uncertainty_ns / 1e6, 4),
        max_drift_ms=round(max((c.drift_ns for c in a.clocks.values()), default=0) / 1e6, 3),
        unaligned_ranks=tuple(a.unaligned),
    )


def _finding(
    m: Matched,
    r: int,
    tr: _Tally,
    table: tuple[LatenessRow, ...],
    clock: ClockSummary,
    assumption: str | None = None,
) -> Finding:
    n, total = len(tr.late), tr.taken
    typical, p90 = median(tr.late), percentile(tr.late, 0.9)
    group = tr.groups.most_common(1)[0][0]
    info = m.groups[group]
    d = m.dump(r)
    summary = (
        f"Rank {r} ({d.describe()}) arrived last at {n} of the {total} recent collectives it "
        f"took part in ({100 * n / total:.0f}%), typically {typical:.1f} ms after the next-latest "
        f"rank (p90 {p90:.1f} ms); the other ranks waited about {tr.waited_ns / 1e9:.2f} "
        f"rank-seconds for it ({tr.delay_ns / 1e9:.2f} s of job time). Nothing hangs"
    )
    evidence = StragglerEvidence(
        last_arrivals=n,
        collectives=total,
        last_share=round(n / total, 3),
        median_lateness_ms=round(typical, 3),
        p90_lateness_ms=round(p90, 3),
        others_waited_s=round(tr.waited_ns / 1e9, 3),
        job_delay_s=round(tr.delay_ns / 1e9, 3),
        groups=dict(tr.groups),
        clock_jitter_ms=round(tr.spread_ns / 1e6, 3),
        confidence="high",
        lateness_by_rank=table,
        clock=clock,
    )
    trend = straggler_trend(m, group, r) if assumption is None else None
    if trend is not None:
        summary += f"; {trend_phrase(trend)} over its last {trend.samples} collectives"
        evidence = replace(evidence, trend=trend)
    if assumption is not None:
        summary += f"; {assumption}"
        evidence = replace(
            evidence,
            clock=replace(clock, method="none: enqueue times as recorded, on one host's clock"),
            clock_assumption=assumption,
        )
    if r == 0:
        # The coordinating rank logs, evaluates and writes checkpoints while the others go on:
        # lateness there is often by design, so it is reported as such, not as a fault.
        hint = _extra_work_hint(m, r)
        evidence = replace(
            evidence,
            confidence="low",
            likely_cause="rank 0 extra work (logging, checkpoint writes)",
        )
        summary += (
            "; rank 0 often does extra work between steps (logging, checkpoint writes)"
            + (f", e.g. {hint}" if hint else "")
            + ": if that is expected, this is by design rather than a fault (low confidence)"
        )
    return Finding(
        kind=FindingKind.STRAGGLER,
        ranks=(r,),
        summary=summary,
        process_group=group,
        pg_ranks=info.ranks,
        op=tr.ops.most_common(1)[0][0] if tr.ops else None,
        evidence=evidence,
    )
