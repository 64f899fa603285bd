"""Mismatch rules: what counts as a disagreement, who is blamed, and when nobody can be."""

from __future__ import annotations

from flightrec.analysis import analyze
from flightrec.analysis.findings.mismatch import find_mismatches
from flightrec.analysis.matching.matching import match
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import EntryValues
from tests.unit.factories import Job, healthy


def _edit(job: Job, rank: int, index: int, **changes: object) -> None:
    e = job.ranks[rank].entries[index]
    fields = {k: getattr(e, k) for k in EntryValues.__dataclass_fields__}
    job.ranks[rank].entries[index] = EntryValues(**{**fields, **changes})  # type: ignore[arg-type]


def test_root_mismatch_in_broadcast() -> None:
    job = healthy(Job())
    job.collective("broadcast", root=0, complete=False, override={1: {"root": 1}})
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.field, first.ranks) == (FindingKind.MISMATCH, "root", (1,))
    assert "named root 1" in first.summary


def test_gather_root_only_outputs_are_not_a_mismatch() -> None:
    job = healthy(Job())
    job.collective("gather", root=0)
    for r in (1, 2, 3):  # only the root receives the gathered list
        _edit(job, r, -1, outputs=[])
    assert find_mismatches(match(job.run())) == []


def test_scatter_compares_what_every_rank_receives() -> None:
    job = healthy(Job())
    job.collective("scatter", root=0)
    for r in (1, 2, 3):  # only the root passes the list to scatter
        _edit(job, r, -1, inputs=[])
    assert find_mismatches(match(job.run())) == []
    _edit(job, 2, -1, outputs=[((9,), "float32")])
    (finding,) = find_mismatches(match(job.run()))
    assert (finding.field, finding.ranks) == ("shape", (2,))


def test_object_collectives_sizes_differ_by_design() -> None:
    job = healthy(Job())
    job.collective("broadcast_object_list", root=0, override={2: {"shape": (77,)}})
    for r in range(4):
        _edit(job, r, -1, flags=pb.OBJECT_API)
    assert find_mismatches(match(job.run())) == []


def test_even_split_has_no_majority() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={2: {"op": "broadcast"}, 3: {"op": "broadcast"}})
    first = analyze(job.run()).findings[0]
    assert first.ranks == (0, 1, 2, 3) and first.evidence.majority is False
    assert "cannot tell which side is wrong" in first.summary


def test_group_membership_disagreement() -> None:
    job = healthy(Job())
    job.group("7", [0, 1, 2])
    dumps = job.run()
    g = next(g for g in dumps.dumps[2].dump.groups if g.name == "7")
    del g.ranks[:]
    g.ranks.extend([1, 2, 3])
    findings = find_mismatches(match(dumps))
    assert [(f.field, f.ranks, f.process_group) for f in findings] == [("group", (2,), "7")]


def test_history_overwritten_differently_per_rank_still_lines_up() -> None:
    job = healthy(Job(), steps=6)
    job.collective(complete=False, override={1: {"dtype": "float16"}})
    job.ranks[0].entries = job.ranks[0].entries[-2:]  # rank 0's ring kept only two entries
    job.ranks[3].entries = job.ranks[3].entries[-5:]
    first = analyze(job.run()).findings[0]
    assert (first.field, first.ranks, first.seq) == ("dtype", (1,), 7)


def test_a_rank_that_did_not_record_reduce_op_or_root_agrees_with_any() -> None:
    """A rank whose entries came from PyTorch's native recorder (no reduce op, no root) in a
    folder of flightrec dumps: not a mismatch, while a real disagreement still is one."""
    unknown = {"reduce_op": "", "root": -1}
    job = healthy(Job())
    job.collective("broadcast", root=0, override={3: unknown})
    job.collective("all_reduce", reduce_op="AVG", override={3: unknown})
    job.collective("reduce", root=2, reduce_op="MAX", override={3: unknown})
    assert find_mismatches(match(job.run())) == []
    job.collective("all_reduce", complete=False, override={3: unknown, 1: {"reduce_op": "MAX"}})
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.field, first.ranks) == (FindingKind.MISMATCH, "reduce_op", (1,))
    assert [g.ranks for g in first.evidence.values] == [(0, 2), (1,)]


def test_an_unknown_reduce_op_does_not_hide_a_wrong_shape() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={3: {"reduce_op": "", "shape": (8, 4)}})
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.field, first.ranks) == (FindingKind.MISMATCH, "shape", (3,))
