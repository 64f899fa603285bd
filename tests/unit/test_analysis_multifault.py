"""Jobs with two faults, and NCCL jobs whose CPUs ran ahead of a stuck GPU: every fault rank
is named by a root cause, and no finding blames a rank that only waited."""

from __future__ import annotations

from flightrec.analysis import analyze
from flightrec.analysis.findings.stuck import StuckEvidence
from flightrec.analysis.model import Action, FindingKind
from tests.unit.factories import Job, gpu_progress, healthy


def _nccl_job(world: int = 8) -> Job:
    job = Job(world_size=world)
    job.device = "cuda"
    for i in range(world // 2):
        job.group(str(1 + i), [2 * i, 2 * i + 1], desc="tp")
    return healthy(job)


def _blamed(findings: list) -> set[int]:  # type: ignore[type-arg]
    return {r for f in findings for r in f.ranks}


def test_two_faults_are_both_named_and_nobody_else() -> None:
    # Rank 2 stalls before its tensor-parallel all_reduce; rank 5's GPU hangs, so its
    # all_reduce is issued by the CPU and never started, while rank 4's GPU is inside it. Every
    # CPU but rank 2's ran ahead into the world all_reduce, which no GPU reached.
    job = _nccl_job()
    job.collective(group="1")  # ranks 0, 1
    job.collective(group="2", ranks=[3], complete=False)
    job.collective(group="3", complete=False)  # ranks 4, 5
    job.collective(group="4")  # ranks 6, 7
    job.stall(2)
    job.collective(ranks=[r for r in range(8) if r != 2], complete=False)
    gpu_progress(job, not_started={5: 2, 0: 1, 1: 1, 3: 1, 4: 1, 6: 1, 7: 1})
    findings = analyze(job.run()).findings
    kinds = {(f.kind, f.ranks) for f in findings}
    assert (FindingKind.NOT_ARRIVED, (2,)) in kinds, findings
    assert (FindingKind.STUCK, (5,)) in kinds, findings
    assert _blamed(findings) == {2, 5}, [(f.kind, f.ranks, f.summary) for f in findings]
    stuck = next(f for f in findings if f.kind == FindingKind.STUCK)
    assert "GPU never started it, while rank 4 started it" in stuck.summary
    assert isinstance(stuck.evidence, StuckEvidence)
    assert stuck.evidence.not_started_ranks == (5,) and stuck.evidence.started_ranks == (4,)


def test_collectives_queued_behind_a_stuck_one_are_not_stuck_themselves() -> None:
    # Rank 3 never enters the world all_reduce; the others' CPUs queued two more tp
    # all_reduces behind it, which every tp member issued and no GPU started.
    job = _nccl_job(4)
    job.collective(ranks=[0, 1, 2], complete=False)
    job.stall(3)
    job.collective(group="1", ranks=[0, 1], complete=False)
    job.collective(group="1", ranks=[0, 1], complete=False)
    gpu_progress(job, not_started={0: 2, 1: 2})
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.NOT_ARRIVED, (3,))]


def test_every_gpu_inside_one_collective_blames_no_rank() -> None:
    job = _nccl_job(4)
    job.collective(complete=False)
    gpu_progress(job)
    (first,) = analyze(job.run()).findings
    assert (first.kind, first.ranks, first.pg_ranks) == (FindingKind.STUCK, (), (0, 1, 2, 3))
    assert "every member's GPU started it and none finished" in first.summary
    assert "NCCL, the network between them" in first.summary
    assert isinstance(first.evidence, StuckEvidence)
    assert first.evidence.started_ranks == (0, 1, 2, 3)
    assert first.evidence.last_progress[0].ranks == (0, 1, 2, 3)


def test_two_faults_in_one_collective_are_both_named() -> None:
    # Rank 3 never enters the world all_reduce; rank 2 entered it, but its GPU never started
    # it (stuck on earlier work), while the GPUs of ranks 0 and 1 are inside it.
    job = _nccl_job(4)
    job.collective(ranks=[0, 1, 2], complete=False)
    job.stall(3)
    gpu_progress(job, not_started={2: 1})
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [
        (FindingKind.NOT_ARRIVED, (3,)),
        (FindingKind.STUCK, (2,)),
    ], [f.summary for f in findings]
    assert "its GPU never started it, while ranks 0-1 started it" in findings[1].summary
    assert all(f.advice is not None and f.advice.action is Action.RESTART for f in findings)
    # The same without the GPU's word (flightrec's own dumps): rank 3 alone.
    job = _nccl_job(4)
    job.collective(ranks=[0, 1, 2], complete=False)
    job.stall(3)
    assert [(f.kind, f.ranks) for f in analyze(job.run()).findings] == [
        (FindingKind.NOT_ARRIVED, (3,))
    ]
