"""The analyzer on scripted jobs: the right culprit first, consequences collapsed under it."""

from __future__ import annotations

from flightrec.analysis import analyze
from flightrec.analysis.model import FindingKind
from tests.unit.factories import Job, healthy, late_arrivals


def test_healthy_job_has_no_finding() -> None:
    report = analyze(healthy(Job()).run())
    assert report.findings == []
    assert report.ranks_with_dump == (0, 1, 2, 3)


def test_stalled_rank_is_named_with_where_it_was() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2, "load_batch", 18)
    report = analyze(job.run())
    first = report.findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED
    assert first.ranks == (2,)
    assert (first.process_group, first.seq, first.op) == ("0", 4, "all_reduce")
    assert first.pg_ranks == (0, 1, 2, 3)
    assert "load_batch at job/train.py:18" in first.summary
    assert "Rank 2 (node1, pid 1002, cpu) never entered all_reduce #4" in first.summary
    assert len(report.findings) == 1


def test_verdict_does_not_depend_on_which_dump_is_read_first() -> None:
    job = healthy(Job())
    job.collective(ranks=[1, 2, 3], complete=False)
    job.stall(0)
    assert analyze(job.run()).findings[0].ranks == (0,)
    assert analyze(job.run(ranks=[3, 2, 1, 0])).findings[0].ranks == (0,)


def test_one_stalled_rank_in_tp_pp_dp_job_is_one_root_finding() -> None:
    # 8 ranks: tp pairs (0,1)(2,3)(4,5)(6,7); dp groups (0,2,4,6)(1,3,5,7); pp (0,4)...
    job = Job(world_size=8)
    tp = [job.group(f"tp{i}", [2 * i, 2 * i + 1], "tp") for i in range(4)]
    dp = [job.group(f"dp{i}", [i, i + 2, i + 4, i + 6], "dp") for i in range(2)]
    for i in range(4):
        job.collective(group=tp[i])
    for i in range(2):
        job.collective(group=dp[i])
    # Rank 5 stalls. Its tp peer 4 blocks in tp2; rank 4's dp peers block in dp0 waiting on 4;
    # rank 5's dp peers block in dp1 waiting on 5; tp peers of those block in their tp groups.
    job.collective(group=tp[2], ranks=[4], complete=False)
    job.collective(group=dp[0], ranks=[0, 2, 6], complete=False)
    job.collective(group=dp[1], ranks=[1, 3, 7], complete=False)
    job.stall(5)
    report = analyze(job.run())
    first = report.findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.ranks == (5,)
    # The wait that points at rank 5 most directly: rank 4 in tp2 waits on rank 5 alone.
    assert first.process_group in {"tp2", "dp1"}
    waiting = {r for c in first.consequences for r in c.waiting}
    assert waiting == {0, 1, 2, 3, 4, 6, 7}
    assert {c.process_group for c in first.consequences} == {"tp2", "dp0", "dp1"}
    assert [f.kind for f in report.findings] == [FindingKind.NOT_ARRIVED]


def test_subgroup_hang_names_the_subgroup() -> None:
    job = healthy(Job())
    sub = job.group("1", [0, 1], "pair")
    job.collective(group=sub)
    job.collective(group=sub, ranks=[0], complete=False)
    job.collective(ranks=[2, 3], complete=False)  # the others wait in a global barrier
    job.stall(1)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.ranks == (1,)
    assert first.process_group == "1" and first.pg_ranks == (0, 1) and first.seq == 2


def test_missing_dump_with_peers_waiting_is_the_culprit() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    report = analyze(job.run(ranks=[0, 1, 3]))
    first = report.findings[0]
    assert first.kind == FindingKind.MISSING_DUMP and first.ranks == (2,)
    assert first.seq == 4 and "ranks 0-1,3 wait for it in all_reduce #4" in first.summary
    assert report.ranks_with_dump == (0, 1, 3)


def test_missing_dump_nobody_waits_on_is_still_reported_last() -> None:
    report = analyze(healthy(Job()).run(ranks=[0, 1, 2]))
    assert [(f.kind, f.ranks) for f in report.findings] == [(FindingKind.MISSING_DUMP, (3,))]
    assert "no peer was waiting" in report.findings[0].summary


def test_rank_that_exited_is_a_dead_rank() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.exited(2)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.DEAD_RANK and first.ranks == (2,)
    assert "exited without entering all_reduce #4" in first.summary


def test_op_mismatch_blames_the_minority() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={3: {"op": "broadcast", "root": 0}})
    report = analyze(job.run())
    first = report.findings[0]
    assert first.kind == FindingKind.MISMATCH and first.field == "op"
    assert first.ranks == (3,) and first.seq == 4
    assert "Rank 3 (node1, pid 1003, cpu) called broadcast as collective #4" in first.summary
    assert "where ranks 0-2 called all_reduce (op mismatch)" in first.summary
    assert len(report.findings) == 1  # the stuck collective is its consequence


def test_size_and_dtype_mismatches_name_the_field() -> None:
    job = healthy(Job())
    job.collective(override={1: {"shape": (4, 8)}})
    job.collective(group="0", override={2: {"dtype": "float16"}})
    findings = analyze(job.run()).findings
    # One group: its first disagreement is reported (later ones are usually its echo).
    assert [(f.kind, f.field, f.ranks, f.seq) for f in findings] == [
        (FindingKind.MISMATCH, "shape", (1,), 4)
    ]
    assert findings[0].evidence.later_mismatches == 1


def test_dtype_mismatch() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={0: {"dtype": "bfloat16"}})
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.field, first.ranks) == (FindingKind.MISMATCH, "dtype", (0,))


def test_shape_mismatch_with_equal_numel() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={0: {"shape": (2, 8)}})
    first = analyze(job.run()).findings[0]
    assert (first.field, first.ranks) == ("shape", (0,))


def test_two_rank_mismatch_says_there_is_no_majority() -> None:
    job = healthy(Job(world_size=2))
    job.collective(complete=False, override={1: {"reduce_op": "MAX"}})
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.MISMATCH and first.field == "reduce_op"
    assert first.ranks == (0, 1)
    assert "no majority" in first.summary and first.evidence.majority is False


def test_p2p_deadlock_names_every_rank_on_the_cycle() -> None:
    job = healthy(Job())
    # ranks 0 and 1 both receive first: each waits for the other's send.
    job.p2p(None, 0, peer_of=(1, 0), complete=False)
    job.p2p(None, 1, peer_of=(0, 1), complete=False)
    job.collective(ranks=[2, 3], complete=False)
    report = analyze(job.run())
    first = report.findings[0]
    assert first.kind == FindingKind.P2P_DEADLOCK
    assert first.ranks == (0, 1)
    assert "P2P deadlock" in first.summary


def test_a_deadlock_is_spelled_the_same_way_whatever_the_order_of_its_members() -> None:
    """The cycle starts at its lowest rank and reads the same on every run (the wait-for
    graph's components are sets: their order changes with the process's hash seed)."""
    import random

    from flightrec.analysis.findings.p2p import cycle_finding
    from flightrec.analysis.waitgraph.graph import DiGraph

    graph = DiGraph()
    ops = [("p2p", f"g:{r}->{(r + 1) % 3}") for r in range(3)]
    for r, op in enumerate(ops):
        sender, receiver = (r + 1) % 3, r
        graph.add_node(op, op="recv", seq=1, group="0", sender=sender, receiver=receiver)
        graph.add_edge(("rank", receiver), op)
        graph.add_edge(op, ("rank", sender))
    members = [*ops, *(("rank", r) for r in range(3))]
    summaries = set()
    for seed in range(8):
        random.Random(seed).shuffle(members)
        shuffled = DiGraph()
        shuffled.add_nodes_from(random.Random(seed).sample(list(graph.nodes), len(graph)))
        for n in shuffled.nodes:
            shuffled.nodes[n].update(graph.nodes[n])
        shuffled.add_edges_from(random.Random(seed).sample(graph.edges(), len(graph.edges())))
        summaries.add(cycle_finding(shuffled, members, {}).summary)
    assert len(summaries) == 1, summaries
    assert summaries.pop().startswith("P2P deadlock: ranks 0-2 wait on each other: rank 0 waits")


def test_both_ends_of_one_stuck_transfer_are_named_together() -> None:
    """Rank 0's send and rank 1's receive match (same pair, same number) but neither
    completed (the tags differ, say): no wait edge explains them, yet both wait."""
    job = healthy(Job())
    job.p2p(0, 1, complete=False, line=21)
    job.collective(ranks=[2, 3], complete=False)
    report = analyze(job.run())
    first = report.findings[0]
    assert (first.kind, first.ranks) == (FindingKind.NOT_ARRIVED, (0, 1))
    assert "they wait in the two ends of one transfer, rank 0 in send #1 to rank 1" in first.summary
    assert "rank 1 in recv #1 from rank 0" in first.summary
    states = {r: s.describe() for r, s in report.states.items()}
    assert states[0].startswith("wait in send") and states[1].startswith("wait in recv")


def test_matched_p2p_is_healthy_and_unmatched_is_reported() -> None:
    job = healthy(Job())
    job.p2p(0, 1)
    job.p2p(2, 3)
    assert analyze(job.run()).findings == []
    job.p2p(0, None, peer_of=(0, 1), complete=True)  # a send nobody received, nobody waits
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.P2P_UNMATCHED, (1,))]


def test_blocked_p2p_on_a_stalled_peer_collapses_under_it() -> None:
    job = healthy(Job())
    job.p2p(None, 0, peer_of=(1, 0), complete=False)  # rank 0 waits to receive from rank 1
    job.stall(1)
    first = analyze(job.run(ranks=[0, 1])).findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.ranks == (1,)
    assert first.op == "recv"


def test_collective_order_inversion_is_a_deadlock() -> None:
    job = healthy(Job(world_size=2))
    a = job.group("a", [0, 1])
    b = job.group("b", [0, 1])
    job.collective(group=a, ranks=[0], complete=False)
    job.collective(group=b, ranks=[1], complete=False)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.DEADLOCK and first.ranks == (0, 1)


def test_overwritten_history_is_not_missing() -> None:
    job = healthy(Job(), steps=5)
    for r in job.ranks.values():  # the ring kept only the last two entries on every rank
        r.entries = r.entries[-2:]
    assert analyze(job.run()).findings == []


def test_stuck_collective_everyone_entered() -> None:
    job = healthy(Job())
    job.collective(complete=False)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.STUCK and first.seq == 4
    assert "transport failure" in first.summary and "GPU" not in first.summary
    # No rank is missing or wrong: none is blamed; where each got to is the evidence.
    assert first.ranks == () and first.summary.startswith("The collective itself is stuck")
    assert "last progress: ranks 0-3 completed all_reduce #3 on group 0" in first.summary
    (progress,) = first.evidence.last_progress
    assert progress.ranks == (0, 1, 2, 3) and progress.last_completed == "all_reduce #3 on group 0"


def test_a_collective_stuck_on_every_gpu_says_it_was_issued_and_not_completed_there() -> None:
    job = Job()
    job.device = "cuda"
    healthy(job)
    job.collective(complete=False)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.STUCK and first.seq == 4
    assert "issued by the CPU on every member and not completed on the GPU" in first.summary


def test_desync_without_waits() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 2])  # a completed collective rank 3 never issued
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.DESYNC and first.ranks == (3,)


def test_two_stalled_ranks_share_one_finding() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1], complete=False)
    job.stall(2)
    job.stall(3, "save_checkpoint", 77)
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.NOT_ARRIVED, (2, 3))]
    assert "save_checkpoint" in findings[0].summary


def test_straggler_is_the_rank_that_arrives_last_every_time() -> None:
    job = late_arrivals(Job(), rank=1, steps=8)
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (1,))]
    assert findings[0].evidence.last_arrivals == 8


def test_small_jitter_is_not_a_straggler() -> None:
    job = late_arrivals(Job(), rank=1, steps=8, late_ms=1.0)
    assert analyze(job.run()).findings == []


def test_mismatch_in_the_collective_a_dead_rank_left_leads() -> None:
    # gloo aborts a rank on some mismatches: it leaves no dump, the others wait where it died.
    job = healthy(Job())
    job.collective(ranks=[0, 1, 2], complete=False, override={0: {"dtype": "float64"}})
    findings = analyze(job.run(ranks=[0, 1, 2])).findings
    # The missing dump is the mismatch's consequence: folded into it (issue 31), not a finding
    # of its own.
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.MISMATCH, (0,))]
    assert [(x.kind, x.ranks) for x in findings[0].explains] == [(FindingKind.MISSING_DUMP, (3,))]


def test_skipped_call_is_named_at_the_collective_it_skipped() -> None:
    # Every step calls all_reduce at line 30 then at line 31. Rank 2 skips line 30 once, at
    # seq 7: its calls then pair with its peers' next ones (same sizes, nothing fails there),
    # and the hang shows only at the end, where rank 2 has run out of calls.
    job = Job()
    for _ in range(3):
        job.collective(line=30)
        job.collective(line=31)
    job.collective(ranks=[0, 1, 3], line=30)  # seq 7: rank 2 skips it
    job.collective(line=31)  # others' 8, rank 2's 7
    for _ in range(2):
        job.collective(ranks=[0, 1, 3], line=30)
        job.collective(ranks=[2], line=30)
        job.collective(ranks=[0, 1, 3], line=31)
        job.collective(ranks=[2], line=31)
    job.collective(ranks=[0, 1, 3], line=30, complete=False)  # rank 2 is done and elsewhere
    job.stall(2, "save_checkpoint", 80)
    first = analyze(job.run()).findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.ranks == (2,)
    shift = first.call_shift
    assert shift is not None
    assert (shift.kind, shift.seq) == ("skipped", 7)
    assert "skipped the all_reduce at job/train.py:30 (#7)" in first.summary


def test_rank_specific_call_sites_are_not_a_skip() -> None:
    job = healthy(Job(), steps=4)
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    for e in range(len(job.ranks[0].entries)):  # rank 0 always calls from its own line
        old = job.ranks[0].entries[e]
        job.ranks[0].entries[e] = type(old)(
            **{
                **{k: getattr(old, k) for k in old.__dataclass_fields__},
                "stack": [("/job/r0.py", "f", 5)],
            }
        )
    first = analyze(job.run()).findings[0]
    assert first.call_shift is None


def test_rank_that_arrived_after_the_others_gave_up_is_named() -> None:
    # A later dump (after timeouts fired) shows every rank in the collective, but rank 2
    # entered it 40 s after the others: it is the one that did not arrive in time.
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.ranks[2].clock += 40_000_000_000
    job.collective(ranks=[2], complete=False)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.NOT_ARRIVED, (2,), 4)
    assert "40.0 s after ranks 0-1,3, too late" in first.summary


def test_ordinary_jitter_in_a_stuck_collective_names_nobody_late() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.ranks[2].clock += 200_000_000  # 0.2 s: jitter, not a culprit
    job.collective(ranks=[2], complete=False)
    assert analyze(job.run()).findings[0].kind == FindingKind.STUCK
