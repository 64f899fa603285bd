"""A rank that left its own routine breaks a wait cycle; hand-built histories."""

from __future__ import annotations

from dataclasses import replace

from flightrec.analysis import analyze
from flightrec.analysis.facts.culprits import RankEvidence
from flightrec.analysis.model import RankDump
from flightrec.analysis.waitgraph.routine import MIN_REPEATS, routine
from tests.unit.factories import Job


def tp_job(steps: int) -> Job:
    """4 ranks, pairs [0,1] and [2,3]: each step a pair all_reduce (line 30), then a world
    all_reduce (line 40)."""
    job = Job()
    job.group("1", [0, 1], "tp0")
    job.group("2", [2, 3], "tp1")
    for _ in range(steps):
        job.collective(group="1", line=30)
        job.collective(group="2", line=30)
        job.collective(line=40)
    return job


def dump_of(job: Job, rank: int) -> RankDump:
    return RankDump(f"<rank {rank}>", job.build(rank))


def test_a_repeated_order_is_kept() -> None:
    r = routine(dump_of(tp_job(4), 2), 2)
    assert r.departure is None and r.kept


def test_too_little_history_says_nothing() -> None:
    r = routine(dump_of(tp_job(1), 2), 2)
    assert r.departure is None and not r.kept


def test_a_skipped_call_is_a_departure() -> None:
    job = tp_job(3)
    job.collective(group="1", line=30)
    job.collective(group="2", line=30, ranks=[3], complete=False)  # rank 2 skips it
    job.collective(line=40, ranks=[0, 1, 2], complete=False)
    d = routine(dump_of(job, 2), 2).departure
    assert d is not None
    assert (d.after, d.expected, d.actual) == (
        "all_reduce at job/train.py:40",
        "all_reduce at job/train.py:30",
        "all_reduce at job/train.py:40",
    )
    # Rank 2 called 30, 40 three times: 40 was followed by 30 twice before the departure.
    assert d.repeats == 2 >= MIN_REPEATS
    assert routine(dump_of(job, 3), 3).kept


def test_a_skipped_collective_blames_the_rank_that_skipped_not_the_cycle() -> None:
    job = tp_job(3)
    job.collective(group="1", line=30)
    job.collective(group="2", line=30, ranks=[3], complete=False)
    job.collective(line=40, ranks=[0, 1, 2], complete=False)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks) == ("not_arrived", (2,))
    assert (first.process_group, first.seq) == ("2", 4)
    assert "left its routine" in first.summary
    assert isinstance(first.evidence, RankEvidence) and first.evidence.cycle


def test_without_history_the_cycle_stays_a_deadlock() -> None:
    job = tp_job(0)
    job.collective(group="2", line=30, ranks=[3], complete=False)
    job.collective(line=40, ranks=[0, 1, 2], complete=False)
    first = analyze(job.run()).findings[0]
    assert first.kind == "deadlock" and set(first.ranks) == {2, 3}


def test_a_send_recv_cycle_stays_a_p2p_deadlock_with_the_departure_noted() -> None:
    job = Job(world_size=2)
    for _ in range(3):
        job.p2p(0, 1, line=50)
        job.p2p(1, 0, line=52)
    # Rank 1 now receives first: each side waits in recv for the other.
    job.p2p(None, 1, peer_of=(0, 1), complete=False, line=50)
    job.p2p(None, 0, peer_of=(1, 0), complete=False, line=52)
    first = analyze(job.run()).findings[0]
    assert first.kind == "p2p_deadlock" and first.ranks == (0, 1)


def test_threads_are_separate_routines() -> None:
    job = tp_job(4)
    st = job.ranks[2]
    # The pair all_reduces come from a second thread, which raced ahead in the last step:
    # merged, the order 30, 40 turns into 40, 30; each thread alone kept its routine.
    st.entries = [replace(e, thread="comm") if e.group == 2 else e for e in st.entries]
    st.entries[-2:] = st.entries[-1:] + st.entries[-2:-1]
    assert [e.thread for e in st.entries[-2:]] == ["MainThread", "comm"]
    assert routine(dump_of(job, 2), 2).departure is None
