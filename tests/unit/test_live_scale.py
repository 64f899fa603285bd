"""The verdict in the log at scale: every rank's progress first, then the summaries of the ranks
it implicates. The verdict must be the one the analysis of every summary gives, whatever the
fault; a damaged progress record costs its rank and one line."""

from __future__ import annotations

import pytest

from flightrec.analysis import analyze
from flightrec.errors import CONTROL
from flightrec.format import flightrec_pb2 as pb
from flightrec.format import progress as progress_module
from flightrec.format.progress import (
    MAX_BYTES,
    ProgressRecord,
    decode_progress,
    encode_progress,
    progress,
    record_of,
)
from flightrec.format.summary import SummaryError, decode, encode, summarize
from flightrec.live import verdict
from flightrec.live.frontier import find_frontier
from flightrec.simulate.faults import Fault
from flightrec.simulate.job import SimConfig, build_rank_dump, plan
from flightrec.simulate.layout import parse_layout
from tests.unit.paths import c_and_python

WORLD = 256

# Every test with the progress records read in C (where built), then in Python.
loops = c_and_python(progress_module, "_progress")


def published(fault: Fault, culprit: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """(summaries, progress records) of a simulated tp=8,pp=4 job, as the ranks publish them."""
    p = plan(SimConfig(parse_layout("tp=8,pp=4", WORLD), entries=64, fault=fault,
                       fault_rank=culprit))  # fmt: skip
    summaries, records = {}, {}
    for rank in range(WORLD):
        if rank in p.dead:
            continue
        dump = build_rank_dump(p, rank)
        summaries[rank] = encode(summarize(dump, 3, f"/dumps/rank{rank}.frdump"))
        records[rank] = encode_progress(progress(dump, 3))
    return summaries, records


def first(report_findings: list[object]) -> tuple[object, ...]:
    f = report_findings[0]
    return (f.kind, f.ranks, f.op, f.seq, f.field)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fault", "culprit"),
    [(Fault.STALL, 85), (Fault.CRASH, 0), (Fault.OP_MISMATCH, 170), (Fault.P2P_DEADLOCK, 255)],
)
def test_the_verdict_from_the_implicated_ranks_is_the_verdict_from_all(
    fault: Fault, culprit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries, records = published(fault, culprit)
    everyone = analyze(verdict.load(summaries, 3, WORLD)[0])
    monkeypatch.setattr(verdict, "FULL_RANKS", 0)
    chosen = verdict.select(records, 3, WORLD)
    assert chosen.frontier is not None and len(chosen.ranks) <= 40, chosen.ranks
    assert culprit in chosen.ranks or culprit not in summaries
    raw = {r: summaries[r] for r in chosen.ranks}
    seen = frozenset(chosen.progress) - set(raw)
    part = analyze(verdict.load(raw, 3, WORLD, seen=seen)[0])
    assert first(part.findings) == first(everyone.findings)
    assert culprit in part.findings[0].ranks
    text = verdict.render(raw, 3, "WATCHDOG_TIMEOUT", WORLD, 0.2, selection=chosen)
    answered = len(summaries)
    assert f"from {answered} of {WORLD} ranks' progress and the summaries of the" in text
    assert f"Where all {answered} answering ranks are (their progress)" in text
    if fault is Fault.CRASH:
        assert f"no answer from rank {culprit}" in text


def test_a_stall_names_the_rank_its_op_and_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    summaries, records = published(Fault.STALL, 85)
    monkeypatch.setattr(verdict, "FULL_RANKS", 0)
    chosen = verdict.select(records, 3, WORLD)
    raw = {r: summaries[r] for r in chosen.ranks}
    text = verdict.render(raw, 3, "WATCHDOG_TIMEOUT", WORLD, 0.2, selection=chosen)
    assert "Rank 85 (node00010, pid 10085, cuda:5) never entered all_reduce #" in text, text
    assert "data/loader.py:88" in text
    # Where everyone is comes from the progress records: all 256 ranks in a few lines.
    where = text.split("answering ranks are (their progress)\n", 1)[1].split("Dumps")[0]
    assert "rank 85 is in no collective or transfer" in where
    assert "wait in reduce_scatter_tensor" in where
    assert "Stack of rank 85" in text and "left no dump" not in text


def message(rank: int, groups: list[tuple[str, int, int]], **wait: object) -> pb.Progress:
    """A hand-made progress record: groups as (name, issued, size)."""
    p = pb.Progress(round=1, rank=rank, world_size=8, wait_peer=-1)
    for name, issued, size in groups:
        p.group.append(name)
        p.issued.append(issued)
        p.pending.append(0)
        p.size.append(size)
    for key, value in wait.items():
        setattr(p, key, value)
    return p


def record(rank: int, groups: list[tuple[str, int, int]], **wait: object) -> ProgressRecord:
    """``message`` as the first pass reads it."""
    return record_of(message(rank, groups, **wait))


def test_the_first_pass_follows_chains_to_their_end() -> None:
    # Ranks 0-3 wait in all_reduce #5 of group "a"; rank 3 issued only 4 of group "a": it
    # waits in a recv from rank 4, which waits on nobody. Ranks 5-7 sit in "b", all done.
    w = {"wait_group": 1, "wait_op": "all_reduce", "wait_seq": 5}
    progress = {r: record(r, [("a", 5, 4)], **w) for r in range(3)}
    recv = {"wait_group": 2, "wait_op": "recv", "wait_seq": 1, "wait_peer": 4,
            "wait_flags": pb.IS_P2P}  # fmt: skip
    progress[3] = record(3, [("a", 4, 4), ("pp", 0, 2)], **recv)
    progress[4] = record(4, [("pp", 0, 2)])
    for r in (5, 6, 7):
        progress[r] = record(r, [("b", 9, 3)])
    f = find_frontier(progress)
    assert f.roots == (4,)
    assert {3, 4} <= set(f.detail)
    assert f.where == (
        "ranks 4-7 are in no collective or transfer",
        "ranks 0-2 wait in all_reduce #5",
        "rank 3 waits in recv #1",
    )


def test_the_first_pass_finds_a_loop_and_a_member_that_never_answered() -> None:
    # 0 sends to 1, 1 sends to 2, 2 sends to 0: nobody receives, a loop.
    progress = {
        r: record(r, [("pp", 0, 3)], wait_group=1, wait_op="send", wait_seq=1,
                  wait_peer=(r + 1) % 3, wait_flags=pb.IS_P2P | pb.SEND)
        for r in range(3)
    }  # fmt: skip
    assert set(find_frontier(progress).roots) == {0, 1, 2}
    # Group "g" has 4 members; rank 3 never answered; 0-2 wait in its all_reduce #2.
    w = {"wait_group": 1, "wait_op": "all_reduce", "wait_seq": 2}
    progress = {r: record(r, [("g", 2, 4)], **w) for r in range(3)}
    f = find_frontier(progress)
    assert f.roots == () and set(f.detail) == {0, 1, 2}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\xff\xff", "unparseable"),
        (b"\x0a" * (MAX_BYTES + 1), "more than"),
        (pb.Progress(rank=6, world_size=8).SerializeToString(), "says it is rank 6"),
        (pb.Progress(rank=5, world_size=9).SerializeToString(), "world has 9 ranks"),
        (message(5, [("a", 1, 4)], wait_group=3).SerializeToString(), "does not list"),
        (message(5, [("a", 1, 4)], wait_peer=99).SerializeToString(), "peer outside"),
        (message(5, [("a", 1, 40)]).SerializeToString(), "larger than the world"),
        (pb.Progress(rank=5, world_size=8, group=["a"]).SerializeToString(), "disagree"),
    ],
)
def test_a_damaged_progress_record_costs_its_rank_and_one_line(data: bytes, words: str) -> None:
    with pytest.raises(SummaryError) as err:
        decode_progress(data, 5, 8)
    line = str(err.value)
    assert line.startswith("rank 5's progress: ") and words in line, line
    assert "\n" not in line and not CONTROL.search(line)
    chosen = verdict.select({5: data, 4: message(4, []).SerializeToString()}, 1, 8)
    assert set(chosen.progress) == {4}
    assert [p.path for p in chosen.problems] == ["rank 5's progress"]


def test_a_progress_record_is_small_and_bounded() -> None:
    _, records = published(Fault.STALL, 85)
    assert max(len(b) for b in records.values()) < 120
    huge = message(1, [(f"group-{i}-" + "n" * 40, i, 2) for i in range(64)])
    data = encode_progress(huge)
    assert len(data) <= MAX_BYTES
    back = decode_progress(data, 1, 8)
    assert back.flags & pb.TRUNCATED and 0 < len(back.group) < 64


@pytest.mark.parametrize(("fault", "culprit"), [(Fault.STALL, 85), (Fault.P2P_DEADLOCK, 255)])
def test_a_rank_missing_from_the_rounds_list_is_read_from_its_summary(
    fault: Fault, culprit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rank that died answering an earlier round, and the ranks after a damaged record, have
    # no record in the round's list: the record made from the dump their summary carries is
    # the one they published, and the first pass decides as it would with theirs.
    summaries, records = published(fault, culprit)
    for rank, data in summaries.items():
        s = decode(data, "")
        assert record_of(progress(s.dump, s.round)) == decode_progress(records[rank], rank, WORLD)
    monkeypatch.setattr(verdict, "FULL_RANKS", 0)
    everyone = verdict.select(records, 3, WORLD)
    gone = {*range(80, 96), culprit}
    listed = {r: v for r, v in records.items() if r not in gone}
    stood_in = verdict.select(listed, 3, WORLD, unlisted={r: summaries[r] for r in gone})
    assert stood_in.ranks == everyone.ranks and stood_in.progress == everyone.progress
    assert stood_in.frontier is not None and everyone.frontier is not None
    assert stood_in.frontier.where == everyone.frontier.where and not stood_in.problems
    # Another rank's summary, or garbage, stands in for nothing: one line each.
    bad = verdict.select(listed, 3, WORLD, unlisted={80: summaries[81], 81: b"\xff" * 9})
    assert 80 not in bad.progress and 81 not in bad.progress
    assert sorted((p.path, p.reason.split(":")[0]) for p in bad.problems) == [
        ("rank 80's summary", "says it is rank 81"),
        ("rank 81's summary", "not a flightrec summary (unparseable)"),
    ], bad.problems
