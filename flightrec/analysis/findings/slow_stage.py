"""A slow stage: one pipeline stage spends longer outside communication than the others.

In a pipeline every stage waits for the slowest one at every micro-batch, so a stage whose
share of the model is too heavy (the last stage with the loss and the output layer, a first
stage with the embeddings) sets the pace of the whole job, and nothing else shows it: nobody
is late at a collective more than the others of its stage, every rank of the other stages
simply waits in its receives. What shows it is the time between completing one operation
and entering the next (``format.activity``): all ranks of that stage spend longer outside
communication than the ranks of the other stages (``timing.activity.slow_stages``). That is
stage imbalance, a matter of how the model was split, not of any one rank: the finding
blames every rank of the stage, and says how much longer per step.

With one rank per stage (no data or tensor parallelism), a slow worker and a slow stage
look alike: the finding says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from flightrec.analysis.candidates import Histories
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Evidence, Finding, FindingKind
from flightrec.analysis.timing.activity import SlowStage, per_step_phrase
from flightrec.text import compress

KINDS = (FindingKind.SLOW_STAGE,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class SlowStageEvidence(Evidence):
    """Evidence of a ``slow_stage`` finding."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("stage", "stages", "own_share", "others_own_share")

    stage: int
    """The stage (0 is the first)."""
    stages: int
    """Stages per pipeline."""
    own_share: float
    """Typical share of time its ranks spend outside communication."""
    others_own_share: float
    """The same for the other stages' ranks."""
    elevated_ranks: int
    """Of its ranks, how many spend that much longer (about; from a sample at scale)."""
    pipelines: int
    """Pipelines the stages were read from (one per data-parallel replica and
    tensor-parallel index)."""
    ms_per_step: float | None = None
    """Typical own time of its ranks per training step, where steps repeat."""
    others_ms_per_step: float | None = None


def find_slow_stages(h: Histories, above: Sequence[Finding]) -> list[Finding]:
    """Stages whose ranks spend longer outside communication than the other stages'.

    Args:
        h: the lined-up histories, with own times and stages (``Histories.activity``).
        above: the slowness findings listed before these (not read).

    Returns:
        One ``slow_stage`` finding per such stage, the slowest first; empty for a job
        without pipeline stages or with balanced ones.
    """
    m, activity = h.m, h.activity
    stages = activity.stages
    out = [_finding(m, s, stages.count, len(stages.pipelines)) for s in activity.slow_stages]
    out.sort(key=lambda f: -_factor(f))
    return out


def _factor(f: Finding) -> float:
    ev = f.evidence
    assert isinstance(ev, SlowStageEvidence)
    return ev.own_share / ev.others_own_share if ev.others_own_share else 0.0


def _finding(m: Matched, s: SlowStage, count: int, pipelines: int) -> Finding:
    where = "the last stage" if s.stage == count - 1 else "the first stage" if s.stage == 0 else ""
    name = f"Stage {s.stage} of {count}" + (f" ({where})" if where else "")
    per_step = per_step_phrase(s.per_step_ms, s.others_per_step_ms)
    alone = len(s.ranks) == pipelines == 1 or len(s.ranks) == 1
    who = (
        f"rank {s.ranks[0]} alone: with one rank per stage a slow worker and a slow stage "
        "look alike"
        if alone
        else f"ranks {compress(s.ranks)}, all {len(s.ranks)} of its ranks rather than any one"
    )
    summary = (
        f"{name} is slower than the others (stage imbalance): its ranks spend "
        f"{100 * s.share:.0f}% of their time outside communication, against "
        f"{100 * s.others_share:.0f}% on the other stages{per_step}; every stage waits for it "
        f"at every micro-batch ({who}). Nothing hangs"
    )
    # The stage's first pipeline's group that holds its ranks' collectives, for the report.
    group = next(
        (k for k, g in m.groups.items() if len(g.ranks) > 1 and set(g.ranks) <= set(s.ranks)),
        None,
    )
    return Finding(
        kind=FindingKind.SLOW_STAGE,
        ranks=s.ranks,
        summary=summary,
        process_group=group,
        pg_ranks=m.groups[group].ranks if group is not None else (),
        evidence=SlowStageEvidence(
            stage=s.stage,
            stages=count,
            own_share=s.share,
            others_own_share=s.others_share,
            elevated_ranks=s.elevated,
            pipelines=pipelines,
            ms_per_step=s.per_step_ms,
            others_ms_per_step=s.others_per_step_ms,
        ),
    )
