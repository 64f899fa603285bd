"""Slow, not stuck: a slow worker and the ranks it holds up, a slow pipeline stage, spread
imbalance, and healthy pipelines, on simulated jobs whose timing is played out, in flightrec
and in PyTorch's native form (with and without completion times, rings wrapped)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from flightrec.analysis import analyze, analyze_dir
from flightrec.analysis.facts.lateness import StragglerEvidence
from flightrec.analysis.facts.spread import ImbalanceEvidence
from flightrec.analysis.findings.slow_stage import SlowStageEvidence
from flightrec.analysis.matching.matching import match
from flightrec.analysis.model import Action, FindingKind
from flightrec.analysis.timing.stages import find_stages
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.activity import Gap, gaps, own_time, step_period
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from tests.unit.factories import Job

MS = 1_000_000
_ASYNC_SEND = pb.ASYNC_OP | pb.IS_P2P | pb.SEND


# -- time outside communication ----------------------------------------------------------------
def test_own_time_runs_from_the_release_to_the_next_entry() -> None:
    # A collective entered at 0 completes at 30; the next entered at 40: 10 own, 30 blocked.
    assert gaps([100, 140], [130, 150], [0, 0]) == [Gap(10, 30, 0)]
    # Nothing completed in between (a send still in flight): all of it is own time.
    assert gaps([100, 140], [160, 170], [0, 0]) == [Gap(40, 0, -1)]
    # No enqueue time: nothing measured.
    assert gaps([0, 140], [130, 150], [0, 0]) == [None]


def test_asynchronous_sends_release_only_a_rank_that_waited_for_them() -> None:
    # A pipeline stage posts a send and computes on; the send completes during its compute.
    assert gaps([100 * MS, 140 * MS], [105 * MS, 150 * MS], [_ASYNC_SEND, 0]) == [
        Gap(40 * MS, 0, -1)
    ]
    # It waits for its sends before its backward pass: the next entry follows at once.
    got = gaps([100 * MS, 140 * MS], [int(139.5 * MS), 150 * MS], [_ASYNC_SEND, 0])
    assert got == [Gap(MS // 2, int(39.5 * MS), 0)]


def test_a_batch_is_released_by_its_receive() -> None:
    # A receive and a send issued together (batch_isend_irecv); the receive completes at 20,
    # the rank computes 4 and enters its next operation at 24.
    flags = [pb.ASYNC_OP | pb.IS_P2P, _ASYNC_SEND, 0]
    got = gaps([100, 101, 124], [120, 150, 130], flags)
    assert got[1] == Gap(4, 19, 0)
    assert own_time([100, 101, 124], [120, 150, 130], flags) == (5, 24)


def test_a_later_entry_that_completes_at_once_releases_nothing_before_it() -> None:
    # Completion times inferred from arrivals: the last arriver completes when it enters.
    assert gaps([100, 140, 190], [110, 140, 195], [0, 0, 0])[0] == Gap(30, 10, 0)


def test_step_period_is_the_smallest_repeat() -> None:
    step = [1, 2, 2, 3, 1, 2, 2, 4, 5]
    assert step_period(step * 6) == len(step)
    assert step_period((step * 6)[4:]) == len(step)  # a ring that starts mid-step
    assert step_period(list(range(40))) is None
    noisy = step * 12
    noisy[30] = 9  # one odd entry in 108
    assert step_period(noisy) == len(step)


# -- simulated pipelines -----------------------------------------------------------------------
def _simulate(
    tmp_path: Path,
    fault: Fault,
    rank: int = 5,
    *,
    form: str = "flightrec",
    completion: bool = True,
    seed: int = 0,
    entries: int = 700,
    layout: str = "tp=2,pp=4",
) -> Path:
    """A 16-rank job (tp=2, pp=4, dp=2 by default) whose rings wrapped (700 entries of steps
    of 38 to 40 operations)."""
    shape = parse_layout(layout, 16)
    cfg = SimConfig(shape, entries, fault, rank, seed=seed, played=True, completion=completion)
    out = tmp_path / f"{fault.value}-{form}-{completion}-{seed}"
    simulate(cfg, out, form=form)
    return out


def test_stages_are_read_from_the_pipelines(tmp_path: Path) -> None:
    out = _simulate(tmp_path, Fault.NONE)
    stages = find_stages(analyze_dir(str(out)).matched)
    # tp=2, pp=4, dp=2: four pipelines (one per replica and tensor-parallel index) of 4.
    assert stages.count == 4 and len(stages.pipelines) == 4
    assert stages.pipelines[0] == (0, 2, 4, 6)
    assert stages.cohort(1) == (2, 3, 10, 11)


def test_a_job_without_pipelines_has_one_stage() -> None:
    job = Job()
    job.collective()
    stages = find_stages(match(job.run()))
    assert stages.count == 1 and stages.pipelines == ()


def test_slow_worker_is_named_and_the_ranks_it_held_up_are_folded(tmp_path: Path) -> None:
    # tp=2, pp=2, dp=4: rank 5 is stage 0 of replica 1 (ranks 4-7).
    out = _simulate(tmp_path, Fault.SLOW_WORKER, rank=5, layout="tp=2,pp=2")
    report = analyze_dir(str(out))
    (f,) = report.findings
    assert (f.kind, f.ranks) == (FindingKind.STRAGGLER, (5,))
    ev = f.evidence
    assert isinstance(ev, StragglerEvidence) and ev.slow_worker
    assert (ev.stage, ev.stages) == (0, 2)
    assert ev.own_time is not None and ev.own_time.share > 1.5 * ev.own_time.others_share
    assert "is a slow worker (stage 0 of 2)" in f.summary
    # The rest of its replica arrives late at the data-parallel collectives: held up by it.
    assert set(ev.held_up) == {4, 6, 7}
    folded = {r for x in f.explains for r in x.ranks}
    assert folded == set(ev.held_up)
    assert all(x.kind == FindingKind.STRAGGLER for x in f.explains)
    assert f.advice is not None and f.advice.action is Action.RESTART


def test_slow_stage_names_all_its_ranks(tmp_path: Path) -> None:
    report = analyze_dir(str(_simulate(tmp_path, Fault.SLOW_STAGE, rank=6)))
    (f,) = report.findings
    assert (f.kind, f.ranks) == (FindingKind.SLOW_STAGE, (6, 7, 14, 15))
    ev = f.evidence
    assert isinstance(ev, SlowStageEvidence)
    assert (ev.stage, ev.stages) == (3, 4)
    assert ev.own_share > 1.3 * ev.others_own_share
    assert ev.ms_per_step is not None and ev.others_ms_per_step is not None
    assert "Stage 3 of 4 (the last stage) is slower than the others" in f.summary
    assert f.advice is not None and f.advice.action is Action.FIX_CODE


def test_spread_imbalance_blames_no_rank(tmp_path: Path) -> None:
    report = analyze_dir(str(_simulate(tmp_path, Fault.SPREAD_IMBALANCE, layout="tp=2,pp=2")))
    (f,) = report.findings
    assert (f.kind, f.ranks) == (FindingKind.IMBALANCE, ())
    assert isinstance(f.evidence, ImbalanceEvidence)
    assert f.evidence.lost_share >= 0.1 and f.evidence.most_often_last <= 0.75
    assert "No culprit" in f.summary and "spread imbalance" in f.summary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_pipelines_have_no_finding(tmp_path: Path, seed: int) -> None:
    out = _simulate(tmp_path, Fault.NONE, seed=seed)
    assert analyze_dir(str(out)).findings == []


@pytest.mark.parametrize("completion", [True, False])
def test_native_dumps_with_wrapped_rings(tmp_path: Path, completion: bool) -> None:
    # PyTorch's recorder numbers a ring's sends and receives from its oldest entry; rings of
    # neighbouring stages wrapped at different points. With or without completion times.
    healthy = _simulate(tmp_path / "h", Fault.NONE, form="native", completion=completion)
    assert analyze_dir(str(healthy)).findings == []
    slow = _simulate(tmp_path / "s", Fault.SLOW_WORKER, form="native", completion=completion)
    findings = analyze_dir(str(slow)).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (5,))]


# -- per-group judgment --------------------------------------------------------------------------
def _played(world: int, steps: int, late_in_pair: int, seed: int = 0) -> Job:
    """Each step: an all_reduce of the pair [0, 1], at which ``late_in_pair`` arrives 40 ms
    late, then two world all_reduces at which nobody is late. Played on one true clock."""
    rng = random.Random(seed)
    job = Job(world_size=world)
    job.group("5", [0, 1], desc="dp")
    plan: list[tuple[str, list[int], int]] = []
    for _ in range(steps):
        plan.append(("5", [0, 1], late_in_pair))
        plan += [("0", list(range(world)), -1)] * 2
    t = {r: 10_000 * MS for r in range(world)}
    for group, ranks, late in plan:
        job.collective(group=group)
        arrive = {r: t[r] + rng.uniform(0, 1) * MS + (40 * MS if r == late else 0) for r in ranks}
        done = max(arrive.values()) + 0.3 * MS
        for r in ranks:
            st = job.ranks[r]
            e = st.entries[-1]
            st.entries[-1] = dataclasses.replace(
                e, enqueue_ns=int(arrive[r]), complete_ns=int(done)
            )
            t[r] = int(done) + 5 * MS
    for st in job.ranks.values():
        st.clock = max(t.values())
    return job


def test_a_rank_late_at_every_collective_of_one_group_is_late_there() -> None:
    # Rank 1 is last at every collective of its pair and at none of the world's: over all its
    # collectives that is one in three, which pooled judgment missed.
    findings = analyze(_played(4, 12, late_in_pair=1).run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (1,))]
    ev = findings[0].evidence
    assert isinstance(ev, StragglerEvidence) and ev.late_groups == ("5",)
    assert "of the 12 recent collectives of group 5 (dp)" in findings[0].summary
