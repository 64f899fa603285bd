"""The simulator writes internally consistent dumps, and its faults block the ranks they should."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.format.read import read_dump
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from flightrec.simulate.job import build_rank_dump, plan
from flightrec.simulate.layout import GroupKind


def test_layout_groups_agree_on_every_member() -> None:
    layout = parse_layout("tp=4,pp=2", 32)
    assert layout.dp == 4
    for rank in range(layout.world):
        for group in layout.groups_of(rank):
            assert rank in group.ranks
            for member in group.ranks:
                assert layout.group_of(member, group.kind) == group


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        parse_layout("tp=3", 8)
    with pytest.raises(ValueError, match="bad layout part"):
        parse_layout("tp=two", 8)


def test_stall_blocks_exactly_the_ranks_that_need_the_culprit() -> None:
    layout = parse_layout("tp=2,pp=2", 8)
    p = plan(SimConfig(layout, entries=200, fault=Fault.STALL, fault_rank=1))
    culprit = p.outcomes[1]
    assert not culprit.blocked
    # the tp peer of rank 1 waits inside the collective rank 1 never entered
    assert p.outcomes[0].blocked and p.outcomes[0].completed == culprit.completed
    # nobody gets through the world all-reduce at the end of the step
    step_ops = len(p.program(5))
    assert all(o.completed < step_ops for o in p.outcomes)


def test_p2p_deadlock_needs_pipeline_stages() -> None:
    with pytest.raises(ValueError, match="pp >= 2"):
        plan(SimConfig(parse_layout("tp=2", 8), fault=Fault.P2P_DEADLOCK))


def test_p2p_deadlock_blocks_both_ends_in_receives() -> None:
    layout = parse_layout("tp=2,pp=2", 8)
    p = plan(SimConfig(layout, entries=200, fault=Fault.P2P_DEADLOCK, fault_rank=0))
    assert p.expected == {"kind": "p2p_deadlock", "ranks": [0, 2]}
    for rank in (0, 2):
        outcome = p.outcomes[rank]
        op = p.program(rank)[outcome.completed]
        assert outcome.blocked and op.is_p2p and not op.send


def _dumps(folder: Path) -> dict[int, pb.Dump]:
    return {d.header.rank: d for d in map(read_dump, sorted(folder.iterdir()))}


def test_healthy_dumps_are_consistent_across_ranks(tmp_path: Path) -> None:
    layout = parse_layout("tp=2,pp=2", 8)
    assert simulate(SimConfig(layout, entries=300, fault=Fault.NONE), tmp_path) == {}
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == list(range(8))
    last_seq: dict[str, set[int]] = {}
    sends: dict[tuple[int, int], int] = {}
    recvs: dict[tuple[int, int], int] = {}
    for rank, dump in dumps.items():
        assert len(dump.entries.record_id) == 300
        assert set(dump.entries.state) == {pb.COMPLETED}
        for g in dump.groups:
            # Every group of a tp/pp/dp layout is strided: written as a grid, never listed.
            assert g.HasField("rank_grid") and not g.ranks
            assert rank in members_of(g)
            if not g.p2p:
                last_seq.setdefault(g.name, set()).add(g.last_seq)
            for c in g.p2p:
                sends[(rank, c.peer)] = c.sends
                recvs[(c.peer, rank)] = c.recvs
    assert all(len(values) == 1 for values in last_seq.values()), last_seq
    assert sends == recvs  # every send issued has its receive issued
    # the ring wrapped, and says so
    assert any(g.dropped for d in dumps.values() for g in d.groups)


def test_entries_of_one_collective_complete_together_on_every_member(tmp_path: Path) -> None:
    layout = parse_layout("tp=2,pp=2", 8)
    simulate(SimConfig(layout, entries=100, fault=Fault.NONE), tmp_path)
    true_complete: dict[tuple[str, int], set[int]] = {}
    for dump in _dumps(tmp_path).values():
        h, e = dump.header, dump.entries
        offset = h.wall_time_ns - h.mono_time_ns  # wall = mono + offset (up to host skew)
        for i in range(len(e.seq)):
            if e.seq[i]:
                key = (dump.groups[e.group[i]].name, e.seq[i])
                true_complete.setdefault(key, set()).add((e.complete_ns[i] + offset) // 10**7)
    # host skew is a few ms: completions of one collective agree to within 10 ms buckets (+1)
    assert all(max(v) - min(v) <= 1 for v in true_complete.values())


def test_straggler_arrives_last(tmp_path: Path) -> None:
    layout = parse_layout("tp=2", 4)
    p = plan(SimConfig(layout, entries=50, fault=Fault.STRAGGLER, fault_rank=3))
    late = build_rank_dump(p, 3).entries
    early = build_rank_dump(p, 2).entries
    assert p.expected == {"kind": "straggler", "ranks": [3]}
    # same host clock (both on host 0): the straggler enqueues after its tp peer every time
    assert all(a > b for a, b in zip(late.enqueue_ns, early.enqueue_ns, strict=True))


@pytest.mark.parametrize("fault", [Fault.OP_MISMATCH, Fault.SIZE_MISMATCH, Fault.DTYPE_MISMATCH])
def test_mismatch_shows_only_on_the_culprit(tmp_path: Path, fault: Fault) -> None:
    layout = parse_layout("tp=2", 8)  # dp = 4: the mismatch goes on a dp reduce-scatter
    expected = simulate(SimConfig(layout, entries=100, fault=fault, fault_rank=5), tmp_path)
    assert expected["ranks"] == [5] and expected["kind"] == "mismatch"
    dumps = _dumps(tmp_path)
    group = layout.group_of(5, GroupKind.DP)
    signatures = {}
    for rank in group.ranks:
        d = dumps[rank]
        e = d.entries
        i = max(j for j in range(len(e.seq)) if d.groups[e.group[j]].name == group.name)
        assert e.seq[i] == expected["seq"] and e.state[i] == pb.STARTED
        spec = d.tensor_specs[e.inputs[i]]
        signatures[rank] = (d.strings[e.op[i]], tuple(spec.dims), d.strings[spec.dtype[0]])
    assert len({s for r, s in signatures.items() if r != 5}) == 1
    assert signatures[5] != signatures[group.ranks[0] if group.ranks[0] != 5 else group.ranks[1]]


def test_crashed_rank_leaves_no_dump(tmp_path: Path) -> None:
    expected = simulate(
        SimConfig(parse_layout("tp=2,pp=2", 8), entries=100, fault=Fault.CRASH, fault_rank=6),
        tmp_path,
    )
    assert expected["kind"] == "missing_dump"
    assert sorted(_dumps(tmp_path)) == [0, 1, 2, 3, 4, 5, 7]


def test_full_ring_dump_stays_small(tmp_path: Path) -> None:
    simulate(SimConfig(parse_layout("tp=8,pp=4", 64), entries=2000, fault=Fault.STALL), tmp_path)
    assert max(f.stat().st_size for f in tmp_path.iterdir()) <= 150_000
