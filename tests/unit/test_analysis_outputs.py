"""Outputs compared where the op fixes them, and a collective that failed on one rank alone."""

from __future__ import annotations

import pytest

from flightrec.analysis import analyze
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import EntryValues
from tests.unit.factories import Job, healthy


def _fail(job: Job, rank: int, after_ns: int = 2_000_000) -> None:
    """``rank``'s newest entry raised ``after_ns`` after it was issued; it dumped on the error."""
    st = job.ranks[rank]
    e = st.entries[-1]
    fields = {name: getattr(e, name) for name in EntryValues.__dataclass_fields__}
    fields.update(state=pb.FAILED, complete_ns=e.enqueue_ns + after_ns)
    st.entries[-1] = EntryValues(**fields)  # type: ignore[arg-type]
    job.reason[rank] = pb.COLLECTIVE_ERROR


def test_all_gather_output_sized_for_the_wrong_world_blames_that_rank() -> None:
    # Seen on gloo: rank 1's all_gather_into_tensor output has 40 elements, not 4 x 8 = 32;
    # gloo raised on rank 1 alone and the others wait.
    job = healthy(Job())
    job.collective(
        "all_gather_into_tensor",
        shape=(8,),
        out_shape=(32,),
        complete=False,
        override={1: {"out_shape": (40,)}},
    )
    _fail(job, 1)
    findings = analyze(job.run()).findings
    first = findings[0]
    assert (first.kind, first.ranks, first.seq, first.field) == (
        FindingKind.MISMATCH,
        (1,),
        4,
        "output_shape",
    )
    assert "passed an output of [40] to all_gather_into_tensor #4" in first.summary
    assert "ranks 0,2-3 passed an output of [32]" in first.summary
    assert first.evidence.numel == {0: 32, 1: 40, 2: 32, 3: 32}
    assert all(f.kind != FindingKind.STUCK for f in findings)


@pytest.mark.parametrize(
    ("op", "shape", "out", "bad"),
    [
        ("reduce_scatter_tensor", (32,), (8,), (10,)),
        ("all_gather", (8,), (8,), (9,)),
        ("all_reduce", (8,), (8,), (9,)),
    ],
)
def test_output_of_the_wrong_size_is_a_mismatch(
    op: str, shape: tuple[int, ...], out: tuple[int, ...], bad: tuple[int, ...]
) -> None:
    job = healthy(Job())
    job.collective(op, shape=shape, out_shape=out, complete=False, override={2: {"out_shape": bad}})
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (2,), "output_shape")


@pytest.mark.parametrize("op", ["gather", "all_to_all_single", "all_to_all"])
def test_outputs_that_differ_by_design_are_not_compared(op: str) -> None:
    # gather: only the root passes a list; all-to-all: split sizes differ between ranks.
    job = healthy(Job())
    job.collective(op, shape=(8,), out_shape=(8,), override={0: {"out_shape": (32,)}})
    assert analyze(job.run()).findings == []


def test_a_collective_that_failed_at_once_on_one_rank_blames_it() -> None:
    # Nothing recorded differs (a wrong device, a non-contiguous buffer), but rank 3's call
    # raised at once and the others entered and wait: a local error on rank 3.
    job = healthy(Job())
    job.collective(complete=False)
    _fail(job, 3)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.STUCK, (3,), 4)
    assert "failed all_reduce #4 on group 0 [ranks 0-3] on its own" in first.summary
    assert "a local error on rank 3, not the transport" in first.summary
    assert first.evidence.waiting_ranks == (0, 1, 2)


def test_a_rank_that_timed_out_first_is_not_blamed() -> None:
    job = healthy(Job())
    job.collective(complete=False)
    _fail(job, 3, after_ns=29_000_000_000)  # raised after the others had waited 29 s
    first = analyze(job.run()).findings[0]
    # The collective itself is stuck: no rank is blamed, every member is in it.
    assert (first.kind, first.ranks, first.pg_ranks) == (FindingKind.STUCK, (), (0, 1, 2, 3))


def test_two_ranks_without_a_majority_are_told_apart_by_the_op_s_rule() -> None:
    job = healthy(Job(world_size=2))
    job.collective(
        "all_gather_into_tensor",
        shape=(8,),
        out_shape=(16,),
        complete=False,
        override={1: {"out_shape": (20,)}},
    )
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (1,), "output_shape")
    assert "no majority" in first.summary
    assert "gathered output = world size x input" in first.summary


def test_all_to_all_whose_totals_cannot_add_up_blames_the_odd_rank() -> None:
    job = healthy(Job())
    job.collective(
        "all_to_all_single",
        shape=(8,),
        complete=False,
        override={2: {"out_shape": (12,)}},
    )
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (2,), "output_total")
    assert "32 elements sent, 36 received" in first.summary
    assert first.evidence.received == {0: 8, 1: 8, 2: 12, 3: 8}


def test_uneven_all_to_all_splits_that_add_up_are_healthy() -> None:
    job = healthy(Job())
    job.collective(
        "all_to_all_single",
        shape=(8,),
        override={0: {"out_shape": (4,)}, 1: {"out_shape": (12,)}},
    )
    assert analyze(job.run()).findings == []


def test_most_members_failing_at_once_is_not_a_local_error() -> None:
    job = healthy(Job())
    job.collective(complete=False)
    for r in (0, 1, 3):
        _fail(job, r)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.pg_ranks) == (FindingKind.STUCK, (), (0, 1, 2, 3))


def test_a_gather_root_whose_list_does_not_fit_the_group_is_blamed() -> None:
    # Only the root passes a list, so nothing is compared rank to rank; but 3 tensors cannot
    # receive from 4 ranks. gloo rejects it on the root, the others wait.
    job = healthy(Job())
    job.collective("gather", shape=(8,), root=0, complete=False)
    for r, st in job.ranks.items():
        e = st.entries[-1]
        st.entries[-1] = EntryValues(
            **{
                **{k: getattr(e, k) for k in EntryValues.__dataclass_fields__},
                "outputs": [((8,), "float32")] * 3 if r == 0 else [],
            }
        )
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (0,), "output_shape")
    assert "passed an output of [8], [8], [8] to gather #4" in first.summary
    assert "does not fit its input for 4 ranks" in first.summary


def _splits(job: Job, chunks: dict[int, tuple[list[int], list[int]]]) -> None:
    """Per rank, the rows of the newest entry's input and output chunks (one per peer), the
    way the recorder writes all_to_all_single with split sizes."""
    for r, (ins, outs) in chunks.items():
        st = job.ranks[r]
        e = st.entries[-1]
        st.entries[-1] = EntryValues(
            **{
                **{k: getattr(e, k) for k in EntryValues.__dataclass_fields__},
                "inputs": [((n, 2), "float32") for n in ins],
                "outputs": [((n, 2), "float32") for n in outs],
            }
        )


# Rank r sends r + 1 rows to every peer (uneven, as an MoE router's), and receives from
# peer p the p + 1 rows p sends.
_AGREED = {r: ([r + 1] * 4, [1, 2, 3, 4]) for r in range(4)}


def test_all_to_all_split_sizes_that_agree_pair_by_pair_are_healthy() -> None:
    job = healthy(Job())
    job.collective("all_to_all_single", shape=(8, 2))
    _splits(job, _AGREED)
    assert analyze(job.run()).findings == []


def test_a_rank_whose_split_sizes_disagree_with_every_peer_is_blamed() -> None:
    # Rank 2 sends 2/4/3/3 rows where each peer expects 3: the same total, so only the pairs
    # can tell (as with a router that computed its splits from stale counts).
    job = healthy(Job())
    job.collective("all_to_all_single", shape=(8, 2), complete=False)
    chunks = dict(_AGREED)
    chunks[2] = ([2, 4, 3, 3], [1, 2, 3, 4])
    _splits(job, chunks)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (2,), "split_sizes")
    assert "rank 2 sends 2 elements" not in first.summary  # elements, not rows
    assert "rank 2 sends 4 elements to rank 0, which expects 6" in first.summary
    assert [(p.src, p.dst) for p in first.evidence.pairs] == [(2, 0), (2, 1)]


def test_pairs_with_no_rank_in_common_name_every_side() -> None:
    # Rank 0 sends rank 1 one row too many, rank 3 sends rank 2 one too few: the totals add
    # up, no rank is in both pairs, and a pair alone cannot tell sender from receiver.
    job = healthy(Job())
    job.collective("all_to_all_single", shape=(8, 2), complete=False)
    chunks = dict(_AGREED)
    chunks[0] = ([1, 2, 1, 1], [1, 2, 3, 4])
    chunks[3] = ([4, 4, 3, 4], [1, 2, 3, 4])
    _splits(job, chunks)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (
        FindingKind.MISMATCH,
        (0, 1, 2, 3),
        "split_sizes",
    )
    assert "cannot tell which side is wrong" in first.summary
