"""Clock alignment from the dumps: offsets recovered from simultaneous completions."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from pathlib import Path

import pytest

from flightrec.analysis import analyze_dir
from flightrec.analysis.matching.matching import match
from flightrec.analysis.timing.clocks import estimate_offsets, group_arrivals, local_offsets
from flightrec.format import flightrec_pb2 as pb
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from flightrec.simulate.job import _host_clock
from tests.unit.factories import Job

MS = 1_000_000
STEP_NS = 50 * MS


def timed_job(
    world: int = 4,
    steps: int = 30,
    *,
    late: Mapping[int, float] | None = None,
    late_every: int = 1,
    offset_ms: Mapping[int, float] | None = None,
    drift_ppm: Mapping[int, float] | None = None,
    jitter_ms: float = 1.0,
    slow_exit: Mapping[int, float] | None = None,
    seed: int = 0,
) -> Job:
    """A job of ``steps`` all_reduces played on a true clock, then read on each rank's clock.

    Every rank arrives within ``jitter_ms`` of the step's start; ranks in ``late`` arrive that
    many ms later, at one step in ``late_every``. The collective completes on every member
    0.3 ms (plus tens of microseconds of noise) after the last arrival. Each rank reads time
    on its own clock: ``offset_ms`` ahead of the truth and running ``drift_ppm`` fast.
    ``slow_exit`` delays a rank's recorded completion by that many ms at one step in five
    (descheduled on its way out): outliers the alignment must ignore.
    """
    rng = random.Random(seed)
    job = Job(world_size=world)
    for _ in range(steps):
        job.collective()
    late, offset_ms, drift_ppm = late or {}, offset_ms or {}, drift_ppm or {}
    slow_exit = slow_exit or {}

    def reading(rank: int, true_ns: float) -> int:
        skew = offset_ms.get(rank, 0.0) * MS + true_ns * drift_ppm.get(rank, 0.0) / 1e6
        return int(true_ns + skew)

    for k in range(steps):
        start = 10_000 * MS + k * STEP_NS
        arrive = {
            r: start
            + rng.uniform(0, jitter_ms) * MS
            + (late.get(r, 0.0) * MS if k % late_every == 0 else 0.0)
            for r in range(world)
        }
        done = max(arrive.values()) + 0.3 * MS
        for r, st in job.ranks.items():
            exit_delay = slow_exit.get(r, 0.0) * MS if k % 5 == 2 else 0.0
            complete = done + rng.uniform(0, 0.05) * MS + exit_delay
            st.entries[k] = dataclasses.replace(
                st.entries[k],
                enqueue_ns=reading(r, arrive[r]),
                complete_ns=reading(r, complete),
            )
    for r, st in job.ranks.items():
        st.clock = reading(r, 10_000 * MS + steps * STEP_NS)
    return job


def test_offsets_are_recovered_from_completions() -> None:
    # Rank 3's host booted much earlier: its readings are 250 s ahead, as a monotonic clock
    # of another host would be.
    offsets = {1: 7.0, 2: -3.0, 3: 250_000.0}
    alignment = estimate_offsets(match(timed_job(offset_ms=offsets).run()))
    assert alignment.reference == 0 and alignment.unaligned == ()
    for r, want in offsets.items():
        c = alignment.clocks[r]
        assert c.offset_ns / MS == pytest.approx(want, abs=0.1)
        assert 0 < c.uncertainty_ns < 0.1 * MS
        assert c.samples == 30


def test_offsets_ignore_outlier_completions() -> None:
    # Rank 2 leaves a fifth of its collectives 20 ms late (descheduled): the median does not care.
    job = timed_job(offset_ms={2: 4.0}, slow_exit={2: 20.0})
    c = estimate_offsets(match(job.run())).clocks[2]
    assert c.offset_ns / MS == pytest.approx(4.0, abs=0.1)


def test_hung_collective_is_not_used() -> None:
    job = timed_job(offset_ms={1: 5.0})
    job.collective(ranks=[0, 1, 2], complete=False)  # rank 3 never arrives: nobody completes
    alignment = estimate_offsets(match(job.run()))
    assert alignment.clocks[1].offset_ns / MS == pytest.approx(5.0, abs=0.1)
    assert alignment.clocks[1].samples == 30


def test_rank_without_completions_is_unaligned() -> None:
    job = Job()
    a = job.group("a", [0, 1])
    job.group("b", [2, 3])
    for _ in range(5):
        job.collective(group=a)
    job.collective(group="b", complete=False)
    alignment = estimate_offsets(match(job.run()))
    assert sorted(alignment.clocks) == [0, 1]
    assert alignment.unaligned == (2, 3)
    assert alignment.offset_ns(2) == 0


def test_offsets_chain_through_shared_groups() -> None:
    # No group holds both 0 and 3: 3 is linked through rank 2, which shares a group with 0.
    job = Job()
    a = job.group("a", [0, 1, 2])
    b = job.group("b", [2, 3])
    for _ in range(6):
        job.collective(group=a)
        job.collective(group=b)
    alignment = estimate_offsets(match(job.run()))
    assert alignment.clocks[3].via == 2
    assert alignment.clocks[3].uncertainty_ns > alignment.clocks[2].uncertainty_ns


def test_drift_switches_to_per_collective_alignment() -> None:
    assert local_offsets([5, 6, 5, 7, 6]) == [6.0] * 5  # steady: one median
    wandering = [0, 2 * MS, 4 * MS, 6 * MS, 8 * MS]
    assert local_offsets(wandering) == [float(x) for x in wandering]
    # Rank 1's clock runs 2,000 ppm fast: 3 ms over the job, more than a constant can follow.
    job = timed_job(drift_ppm={1: 2000.0}, jitter_ms=0.2)
    ga = group_arrivals(match(job.run()), "0")
    assert ga is not None
    spread = max(
        abs(ga.arrivals[1][i] - ga.arrivals[0][i]) for i in range(len(ga.seqs))
    )  # aligned arrivals stay within the true jitter, drift or not
    assert spread < 0.5 * MS
    assert estimate_offsets(match(job.run())).clocks[1].drift_ns > 2 * MS


def test_simulated_hosts_offsets_match_their_wall_clock_skew(tmp_path: Path) -> None:
    layout = parse_layout("tp=4,pp=2", 16)
    simulate(SimConfig(layout, entries=120, fault=Fault.NONE, seed=5), tmp_path)
    report = analyze_dir(str(tmp_path))
    alignment = estimate_offsets(report.matched)
    ref_skew = _host_clock(5, layout.host(alignment.reference))[1]
    for r, c in alignment.clocks.items():
        want = _host_clock(5, layout.host(r))[1] - ref_skew
        assert abs(c.offset_ns - want) < 0.01 * MS, r
    assert {report.run.dumps[r].header.reason for r in alignment.clocks} == {pb.CLI_TRIGGER}
