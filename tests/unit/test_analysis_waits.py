"""The wait-for graph: who counts as blocked, and on whom."""

from __future__ import annotations

from flightrec.analysis import analyze
from flightrec.analysis.matching.matching import match
from flightrec.analysis.waitgraph.waits import build_wait_graph, rank_node
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import EntryValues
from tests.unit.factories import Job, healthy


def _set_state(job: Job, rank: int, index: int, state: int) -> None:
    e = job.ranks[rank].entries[index]
    fields = {k: getattr(e, k) for k in EntryValues.__dataclass_fields__}
    job.ranks[rank].entries[index] = EntryValues(**{**fields, "state": state, "complete_ns": 0})  # type: ignore[arg-type]


def test_collective_waits_point_at_the_ranks_that_did_not_arrive() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1], complete=False)
    graph, waits = build_wait_graph(match(job.run()))
    op = ("coll", "0", 4)
    assert sorted(graph.successors(op)) == [rank_node(2), rank_node(3)]
    assert sorted(graph.predecessors(op)) == [rank_node(0), rank_node(1)]
    assert {w.rank for w in waits} == {0, 1}


def test_a_failed_call_the_rank_got_past_is_not_a_wait() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 2], complete=False)  # seq 4 failed on 0-2 (peer timeout)...
    for r in (0, 1, 2):
        _set_state(job, r, -1, pb.FAILED)
    for _ in range(2):  # ...and rank 0-2 went on with a subgroup afterwards
        job.group("s", [0, 1, 2])
        job.collective(group="s")
    _, waits = build_wait_graph(match(job.run()))
    assert waits == []


def test_a_trailing_failed_call_still_holds_the_rank() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 2], complete=False)
    for r in (0, 1, 2):
        _set_state(job, r, -1, pb.FAILED)
    job.stall(3)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks) == ("not_arrived", (3,))


def test_p2p_transfer_both_sides_issued_is_in_progress_not_a_wait() -> None:
    job = healthy(Job())
    job.p2p(0, 1, complete=False)
    _, waits = build_wait_graph(match(job.run()))
    assert waits == []


def test_recv_from_a_rank_without_dump_points_at_it() -> None:
    job = healthy(Job())
    job.p2p(None, 0, peer_of=(3, 0), complete=False)
    first = analyze(job.run(ranks=[0, 1, 2])).findings[0]
    assert (first.kind, first.ranks, first.op) == ("missing_dump", (3,), "recv")


def test_operation_in_flight_in_a_requested_snapshot_is_below_the_timeout() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1], complete=False)  # in flight for 30 s when the dumps are taken
    dumps = job.run()
    for d in dumps.dumps.values():
        d.header.reason = pb.SIGNAL_USR1
        d.header.timeout_s = 60.0
    first = analyze(dumps).findings[0]  # who waits for whom, but not a hang yet
    assert first.kind == "not_arrived" and first.below_timeout is not None
    for d in dumps.dumps.values():
        d.header.timeout_s = 10.0  # older than the job's own hang timeout: a hang
    first = analyze(dumps).findings[0]
    assert first.kind == "not_arrived" and first.below_timeout is None
