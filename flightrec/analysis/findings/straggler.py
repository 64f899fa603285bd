"""Stragglers: a rank that arrives last at collectives, again and again, while nothing hangs.

In a synchronous collective every member waits for the slowest, so durations all look alike;
the signal is who arrives last. Arrivals (enqueue times) of different ranks are compared on
one clock, aligned from the dumps themselves (``clocks.group_arrivals``: completions of one
collective are simultaneous). A rank is late in a group when it is last at most of that
group's recent collectives, by a margin well above ordinary jitter and above the alignment's
own uncertainty, and far more often than random arrival order would make it (in a 2-rank
group every member is last half the time). It is judged group by group
(``timing.tallies``): a rank late at every collective of its data-parallel group is late
even where its other groups dilute it.

Late is not slow. A rank late because it waited (on a tensor-parallel peer, on the send of
the pipeline stage before it) spent the difference inside operations; the rank that is slow
itself spends longer outside communication than the other ranks of its stage
(``timing.activity``). So a late rank whose own time stands out is a **slow worker**: the
finding says so, with its stage and both times; a late rank whose own time does not is
followed down the chain of what it waited on, and its finding names the rank at the head
(``Finding.held_by``), under whose finding it is then folded (``verdict.fold``). Ranks of a
slow stage are the ``slow_stage`` finding's.

Rank 0 often does legitimate extra work between steps (logging, evaluation, checkpoint
writes): when it is the late one, the finding says so and carries low confidence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import median

from flightrec.analysis.candidates import Histories
from flightrec.analysis.facts.lateness import (
    ClockSummary,
    LatenessRow,
    OwnTime,
    StragglerEvidence,
    StragglerOptions,
    chance_of_as_many,
    own_phrase,
    percentile,
)
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Finding, FindingKind, is_library_frame
from flightrec.analysis.timing.activity import Excess
from flightrec.analysis.timing.clocks import ClockAlignment
from flightrec.analysis.timing.tallies import Tally, add_evidence, tally_groups
from flightrec.analysis.timing.trend import straggler_trend, trend_phrase
from flightrec.text import ranks_phrase

KINDS = (FindingKind.STRAGGLER,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""

# Words in a function or file name that say "extra work a coordinating rank does".
_EXTRA_WORK = re.compile(
    r"log|print|save|checkpoint|ckpt|write|wandb|tensorboard|eval|metric", re.I
)
# Ranks listed per finding in the lateness table.
TABLE_RANKS = 16


def lateness_table(
    tallies: Mapping[int, Tally], keep: Sequence[int], alignment: ClockAlignment
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
        if not tr.taken:
            continue
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


def late_in(t: Tally, opt: StragglerOptions) -> bool:
    """Whether a rank's tally in one group says it is late there (``StragglerOptions``)."""
    if t.taken < opt.min_samples or len(t.late) / t.taken < opt.min_fraction:
        return False
    if median(t.late) < opt.min_margin_ms:
        return False
    # As often as random arrival order would make it last: no evidence.
    return chance_of_as_many(t.sizes, len(t.late)) <= opt.max_chance


def find_stragglers(
    h: Histories, above: Sequence[Finding], options: StragglerOptions | None = None
) -> list[Finding]:
    """Ranks that consistently arrive last at completed collectives of some group.

    Args:
        h: the lined-up histories, the run's clock alignment (read only for the ranks found
            late), and what the slowness finders share: every group's late arrivals
            (``Histories.tallied``, with the default thresholds' window and margin) and own
            times and wait chains (``Histories.activity``).
        above: the slowness findings listed before these (not read: stragglers come first).
        options: thresholds; the defaults when None (other ones tally the arrivals anew).

    Returns:
        ``straggler`` findings: slow workers and late ranks whose own time cannot be told
        first (the most consistent first), then the late ranks held up by another
        (``Finding.held_by``), which ``verdict.fold`` folds under the finding of that rank.
        Empty for a healthy job.
    """
    m, clocks = h.m, h.clocks
    opt = options or StragglerOptions()
    tallied = h.tallied if options is None else tally_groups(m, opt.recent, opt.min_margin_ms * 1e6)
    late: dict[int, list[str]] = {}
    for (r, g), t in tallied.per_group.items():
        if late_in(t, opt):
            late.setdefault(r, []).append(g)
    if not late:
        return []
    activity = h.activity
    stage_ranks = activity.slow_stage_ranks

    def is_head(q: int) -> bool:
        return q in stage_ranks or activity.is_slow_worker(q)

    # Who is slow itself, who only waited (and on whom), who belongs to a slow stage.
    held_by: dict[int, int] = {}
    for r in sorted(late):
        if not is_head(r):
            head = activity.head_of(r, is_head)
            if head is not None:
                held_by[r] = head
    held_up: dict[int, list[int]] = {}
    for r, head in held_by.items():
        held_up.setdefault(head, []).append(r)
    workers = [q for q in held_up if q not in late and q not in stage_ranks]
    named = sorted(late) + workers
    blamed = set(named)
    for p in tallied.pending:
        add_evidence(p, blamed, tallied.per_group)
    pooled = tallied.pooled()
    alignment = clocks.alignment(opt.recent)
    table = lateness_table(pooled, named, alignment)
    clock = clock_summary(alignment)
    findings: list[tuple[tuple[bool, bool, float, int], Finding]] = []
    for r in named:
        groups = sorted(late.get(r, ()), key=lambda g: -len(tallied.per_group[(r, g)].late))
        mine = Tally()
        for g in groups:
            mine.add(tallied.per_group[(r, g)])
        f = _finding(
            m,
            r,
            _Judged(mine, tuple(groups), pooled.get(r, Tally())),
            table,
            clock,
            tallied.assumed.get(r),
            _Roles(
                activity.excess(r),
                activity.stages.place(r),
                activity.is_slow_worker(r),
                tuple(sorted(held_up.get(r, ()))),
                held_by.get(r, r if r in stage_ranks else None),
            ),
        )
        share = len(mine.late) / mine.taken if mine.taken else 0.0
        # Heads first (the slow workers, then rank 0, whose lateness is often by design),
        # then the ranks they held up.
        findings.append(((r in held_by or r in stage_ranks, r == 0, -share, r), f))
    findings.sort(key=lambda kf: kf[0])
    return [f for _, f in findings]


@dataclass(frozen=True, slots=True)
class _Judged:
    """A rank's late arrivals where it was judged late, and over all its groups."""

    late: Tally
    """Pooled over ``groups`` (empty for a slow worker late nowhere itself)."""
    groups: tuple[str, ...]
    everywhere: Tally


@dataclass(frozen=True, slots=True)
class _Roles:
    """What the own-time comparison and the wait chains say of a rank."""

    excess: Excess | None
    stage: tuple[int, int] | None
    """(its stage, stages per pipeline), where the job has stages."""
    slow_worker: bool
    held_up: tuple[int, ...]
    held_by: int | None
    """The head of its chain of waits (itself for a rank of a slow stage); None for a head."""


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


def _own_time(ex: Excess | None) -> OwnTime | None:
    if ex is None:
        return None
    return OwnTime(
        round(ex.share, 3),
        round(ex.others_share, 3),
        ex.others,
        ex.per_step_ms,
        ex.others_per_step_ms,
    )


def _groups_phrase(m: Matched, groups: Sequence[str]) -> str:
    """``group 7 (dp)``; ``groups 7, 9``."""
    if len(groups) == 1:
        return m.groups[groups[0]].label()
    return "groups " + ", ".join(groups)


def _parts(
    m: Matched, r: int, judged: _Judged, roles: _Roles, own: OwnTime | None, staged: bool
) -> list[str]:
    """The clauses of a straggler's verdict after its name: how often and how late it
    arrived, its own time (a slow worker), what it cost, whom it held up or who held it."""
    tr = judged.late if judged.late.late else judged.everywhere
    n, total = len(tr.late), tr.taken
    parts: list[str] = []
    if n and total:
        of = (
            f"of the {total} recent collectives of {_groups_phrase(m, judged.groups)}"
            if judged.groups and judged.everywhere.taken > total
            else f"of the {total} recent collectives it took part in"
        )
        typical = median(tr.late) if tr.late else 0.0
        parts.append(
            f"arrived last at {n} {of} ({100 * n / total:.0f}%), typically {typical:.1f} ms "
            f"after the next-latest rank (p90 {percentile(tr.late, 0.9):.1f} ms)"
        )
    if roles.slow_worker and own is not None:
        parts.append(own_phrase(own, staged).removeprefix("it " if not parts else ""))
    if tr.waited_ns:
        parts.append(
            f"the other ranks waited about {tr.waited_ns / 1e9:.2f} rank-seconds for it "
            f"({tr.delay_ns / 1e9:.2f} s of job time)"
        )
    if roles.held_up:
        they = "it" if len(roles.held_up) == 1 else "they"
        parts.append(
            f"{ranks_phrase(roles.held_up)} arrived late because {they} waited on it, through "
            "its collectives or down its pipeline"
        )
    if roles.held_by is not None and roles.held_by != r:
        parts.append(
            f"its time outside communication is like its stage's: it waited on rank {roles.held_by}"
        )
    return parts


def _rank0(m: Matched, summary: str, evidence: StragglerEvidence) -> tuple[str, StragglerEvidence]:
    """Rank 0 late, holding nobody up: the coordinating rank logs, evaluates and writes
    checkpoints while the others go on, so lateness there is often by design, and is
    reported as such (low confidence), not as a fault."""
    hint = _extra_work_hint(m, 0)
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
    return summary, evidence


def _finding(
    m: Matched,
    r: int,
    judged: _Judged,
    table: tuple[LatenessRow, ...],
    clock: ClockSummary,
    assumption: str | None,
    roles: _Roles,
) -> Finding:
    tr = judged.late if judged.late.late else judged.everywhere
    n, total = len(tr.late), tr.taken
    typical = median(tr.late) if tr.late else 0.0
    p90 = percentile(tr.late, 0.9)
    group = (
        judged.groups[0]
        if judged.groups
        else tr.groups.most_common(1)[0][0]
        if tr.groups
        else max(m.groups, key=lambda g: (r in m.groups[g].ranks, len(m.groups[g].ranks)))
    )
    info = m.groups[group]
    d = m.dump(r)
    own = _own_time(roles.excess)
    lead = f"Rank {r} ({d.describe()})"
    stage = f"stage {roles.stage[0]} of {roles.stage[1]}" if roles.stage else ""
    if roles.slow_worker:
        lead += f" is a slow worker{f' ({stage})' if stage else ''}: it"
    parts = _parts(m, r, judged, roles, own, bool(stage))
    summary = f"{lead} " + "; ".join(parts) + ". Nothing hangs"
    evidence = StragglerEvidence(
        last_arrivals=n,
        collectives=total,
        last_share=round(n / total, 3) if total else 0.0,
        median_lateness_ms=round(typical, 3),
        p90_lateness_ms=round(p90, 3),
        others_waited_s=round(tr.waited_ns / 1e9, 3),
        job_delay_s=round(tr.delay_ns / 1e9, 3),
        groups=dict(judged.everywhere.groups),
        clock_jitter_ms=round(tr.spread_ns / 1e6, 3),
        confidence="high",
        lateness_by_rank=table,
        clock=clock,
        late_groups=judged.groups,
        stage=roles.stage[0] if roles.stage else None,
        stages=roles.stage[1] if roles.stage else None,
        own_time=own,
        slow_worker=roles.slow_worker,
        held_up=roles.held_up,
        held_by=roles.held_by if roles.held_by != r else None,
    )
    trend = straggler_trend(m, group, r) if assumption is None and n else None
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
    if r == 0 and not roles.held_up:
        summary, evidence = _rank0(m, summary, evidence)
    return Finding(
        kind=FindingKind.STRAGGLER,
        ranks=(r,),
        summary=summary,
        process_group=group,
        pg_ranks=info.ranks,
        op=tr.ops.most_common(1)[0][0] if tr.ops else None,
        evidence=evidence,
        held_by=() if roles.held_by is None else (roles.held_by,),
    )
