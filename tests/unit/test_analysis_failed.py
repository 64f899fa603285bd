"""A collective that ended in an exception is the hang, even where the recorder marked it
retired (torch's gloo recorder records DDP's bucket all-reduces with no completion time, and
"retires" a failed one like a finished one): the ranks gloo's own timeout killed in it waited
for the rank that never issued it."""

from __future__ import annotations

from flightrec.analysis import analyze
from flightrec.analysis.matching.matching import match
from flightrec.format import flightrec_pb2 as pb
from tests.unit.factories import Job, retired

BACKWARD = 30
"""The training script's ``loss.backward()`` line, where DDP's reducer all-reduces."""


def ddp_job(steps: int = 5, buckets: int = 1) -> Job:
    """``steps`` DDP steps of ``buckets`` gradient all-reduces each, as merged from PyTorch's
    gloo recorder (retired, no completion time), issued from the ``backward()`` line."""
    job = Job()
    for _ in range(steps * buckets):
        job.collective(line=BACKWARD, function="main", flags=pb.DDP_BUCKET)
    for r in range(4):
        retired(job, r, steps * buckets)
    return job


def torch_timeout_first(job: Job, buckets: int = 1, stalled: int = 2) -> Job:
    """Rank ``stalled`` stalls before its backward; the others issue the next backward's
    buckets and die of gloo's timeout raised out of ``backward()``, before flightrec's own."""
    others = [r for r in range(4) if r != stalled]
    for _ in range(buckets):
        job.collective(ranks=others, line=BACKWARD, function="main", flags=pb.DDP_BUCKET)
    for r in others:
        retired(job, r, buckets)
        job.died_of(r, function="main", line=BACKWARD)
    job.stall(stalled)
    job.reason[stalled] = pb.PEER_REQUEST
    return job


def test_a_collective_torchs_timeout_ended_names_the_rank_that_never_arrived() -> None:
    report = analyze(torch_timeout_first(ddp_job()).run())
    first = report.findings[0]
    assert (first.kind, first.ranks, first.seq) == ("not_arrived", (2,), 6), report.findings
    assert "never entered DDP gradient-bucket all_reduce #6" in first.summary, first.summary
    assert "load_batch at job/train.py:18" in first.summary, first.summary
    (waited,) = first.consequences
    assert waited.waiting == (0, 1, 3) and waited.ended == (0, 1, 3)
    folded = [f for f in first.explains if f.kind == "dead_rank"]
    assert folded and set(folded[0].ranks) == {0, 1, 3}, first.explains
    assert len(report.findings) == 1, report.findings
    assert report.states[0].describe().startswith("waited in DDP gradient-bucket all_reduce")


def test_it_is_the_first_bucket_the_rank_never_issued() -> None:
    """Three buckets per backward: the others issued all three before they died; rank 2
    issued none of them, so it never entered the first."""
    report = analyze(torch_timeout_first(ddp_job(buckets=3), buckets=3).run())
    first = report.findings[0]
    assert (first.kind, first.ranks, first.seq) == ("not_arrived", (2,), 16), report.findings


def test_the_failed_entries_read_failed_and_the_finished_ones_finished() -> None:
    run = torch_timeout_first(ddp_job(buckets=3), buckets=3).run()
    m = match(run)
    states = run.dumps[0].dump.entries.state
    assert [s == pb.FAILED for s in states] == [False] * 15 + [True] * 3
    assert m.incomplete[0] == (15, 16, 17) and m.incomplete[2] == ()
    match(run)  # a second pass marks nothing more
    assert list(states).count(pb.FAILED) == 3


def test_an_exception_raised_elsewhere_leaves_the_collectives_alone() -> None:
    """Rank 0 died of an exception in its own code after its last all-reduce finished: it
    is the cause, not a rank that waited."""
    job = ddp_job()
    job.collective(ranks=[1, 2, 3], line=BACKWARD, function="main", flags=pb.DDP_BUCKET)
    job.died_of(0, "ValueError", "loss is NaN", function="compute_loss", line=57)
    run = job.run()
    match(run)
    assert pb.FAILED not in run.dumps[0].dump.entries.state


def test_without_the_exception_nothing_is_assumed() -> None:
    """The same counters without an exception (the ranks dumped alive, their collectives
    retired): nothing says the collective failed."""
    job = ddp_job()
    job.collective(ranks=[0, 1, 3], line=BACKWARD, function="main", flags=pb.DDP_BUCKET)
    for r in (0, 1, 3):
        retired(job, r)
    run = job.run()
    match(run)
    assert all(pb.FAILED not in d.dump.entries.state for d in run.dumps.values())
