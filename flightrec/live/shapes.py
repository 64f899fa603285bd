"""Where the time goes, while the job runs: a slow worker, a slow pipeline stage, or spread
imbalance, judged from the digests by the rules ``flightrec analyze`` uses.

Each digest carries its rank's own time (time outside communication over its newest entries)
and its point-to-point peers (``format.activity.RingActivity``). From those the reporting
rank reads the pipelines' stages (``timing.stages.stages_from_peers``) and compares own
times: a late rank whose own time stands out among its stage's is a slow worker
(``timing.activity.slow_worker``); a stage whose ranks all spend longer outside
communication than the other stages is a slow stage (``timing.activity.slow_stages_of``);
and where neither holds, groups of ranks doing the same work that keep waiting for each
other, a different one last each time, are spread imbalance
(``findings.imbalance.spread_imbalance``).

``Shapes`` keeps what it said, as ``SlowJudge`` does for ranks: a shape is said once it has
held for ``confirm`` checks in a row at least ``min_persist_s`` apart, again only when what
its line says changes, and once when it is over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flightrec.analysis.facts.spread import ImbalanceEvidence, imbalance_phrase, spread_imbalance
from flightrec.analysis.timing.activity import (
    RankTime,
    SlowStage,
    per_step_phrase,
    slow_stages_of,
    slow_worker,
)
from flightrec.analysis.timing.stages import Stages, stages_from_peers
from flightrec.analysis.timing.tallies import Pending
from flightrec.format.digest import Digest
from flightrec.text import compress


def rank_times(digests: Mapping[int, Digest]) -> dict[int, RankTime]:
    """Each rank's own time, as its digest says (ranks that measured nothing left out)."""
    out: dict[int, RankTime] = {}
    for r, d in digests.items():
        a = d.activity
        if a.span_ns > 0 and a.entries >= 3:
            out[r] = RankTime(r, a.own_ns, a.span_ns, a.entries, a.period or None, False)
    return out


def stages_of(digests: Mapping[int, Digest]) -> Stages:
    """The pipelines' stages, from each rank's point-to-point peers."""
    return stages_from_peers({r: d.activity.peers for r, d in digests.items()})


def is_slow_worker(rank: int, stages: Stages, times: Mapping[int, RankTime]) -> bool:
    """Whether the rank's own time stands out among the other ranks of its stage."""
    mine = times.get(rank)
    if mine is None or rank not in stages.stage_of:
        return False
    cohort = stages.cohort(stages.stage_of[rank])
    return slow_worker(mine, [times[r] for r in cohort if r != rank and r in times])


def slow_stages(stages: Stages, times: Mapping[int, RankTime]) -> tuple[SlowStage, ...]:
    """The slow stages among every rank's own time."""
    sampled = {s: [times[r] for r in stages.cohort(s) if r in times] for s in range(stages.count)}
    return slow_stages_of(stages, sampled)


def stage_line(s: SlowStage, count: int) -> str:
    """The log line naming a slow stage."""
    return (
        f"flightrec: slow stage: stage {s.stage} of {count} (ranks {compress(s.ranks)}) spends "
        f"{100 * s.share:.0f}% of its time outside communication against "
        f"{100 * s.others_share:.0f}% on the other stages"
        f"{per_step_phrase(s.per_step_ms, s.others_per_step_ms)}: every stage waits for it "
        "(stage imbalance, no single rank). Nothing hangs.\n"
    )


def imbalance_line(ev: ImbalanceEvidence) -> str:
    """The log line saying time is lost to spread imbalance."""
    return (
        f"flightrec: spread imbalance: ranks doing the same work {imbalance_phrase(ev)}; no "
        "culprit (uneven work from "
        "step to step). Nothing hangs.\n"
    )


@dataclass(slots=True)
class _Said:
    checks: int = 0
    since_ns: int = 0
    said: tuple[object, ...] | None = None
    clear: int = 0
    over: str = ""


@dataclass(slots=True)
class Shapes:
    """The slow-stage and spread-imbalance lines of one job, check after check."""

    confirm: int
    min_persist_s: float
    _seen: dict[str, _Said] = field(default_factory=dict)

    def check(
        self,
        digests: Mapping[int, Digest],
        pendings: Sequence[Pending],
        stages: Stages,
        times: Mapping[int, RankTime],
        blamed: bool,
    ) -> list[str]:
        """The lines to print after this check (those confirmed, and those now over).

        Args:
            digests: this check's digests.
            pendings: each group's lined-up arrivals (``SlowJudge``'s).
            stages: the pipelines' stages (``stages_of``).
            times: each rank's own time (``rank_times``).
            blamed: whether a rank is late (then spread imbalance is not looked for).
        """
        now = max((d.taken_ns for d in digests.values()), default=0)
        found: dict[str, tuple[tuple[object, ...], str, str]] = {}
        for s in slow_stages(stages, times):
            size = round(math.log2(max(s.share / max(s.others_share, 1e-9), 1.0)) * 4)
            found[f"stage {s.stage}"] = (
                (s.stage, size),
                stage_line(s, stages.count),
                f"flightrec: slow stage: stage {s.stage} of {stages.count} is no longer slow.\n",
            )
        if not found and not blamed:
            ev = spread_imbalance(pendings, stages.stage_of)
            if ev is not None:
                found["imbalance"] = (
                    (round(math.log2(max(ev.lost_share, 1e-3))),),
                    imbalance_line(ev),
                    "flightrec: spread imbalance: no longer.\n",
                )
        lines: list[str] = []
        for key, (what, line, over) in found.items():
            seen = self._seen.setdefault(key, _Said())
            seen.checks, seen.clear, seen.over = seen.checks + 1, 0, over
            if seen.checks == 1:
                seen.since_ns = now
            if (
                seen.checks >= self.confirm
                and now - seen.since_ns >= self.min_persist_s * 1e9
                and seen.said != what
            ):
                seen.said = what
                lines.append(line)
        for key, seen in list(self._seen.items()):
            if key in found:
                continue
            seen.checks = 0
            seen.clear += 1
            if seen.said is not None and seen.clear >= self.confirm:
                lines.append(seen.over)
                del self._seen[key]
            elif seen.said is None:
                del self._seen[key]
        return lines
