"""Summaries: what a rank publishes through the store when a hang is declared.

The verdict computed from summaries must be the one computed from full dumps (the same passes
run on both); a summary is bounded in size whatever the rank's state; and a summary read from
the store is untrusted: any damage is one ``SummaryError`` line, never a traceback.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flightrec.analysis import AnalysisOptions, RankDump, View, analyze, analyze_dir
from flightrec.analysis.loading.loader import Run
from flightrec.errors import CONTROL
from flightrec.format import flightrec_pb2 as pb
from flightrec.format import summary as fs
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.members import members_of
from flightrec.format.read import read_dump
from flightrec.readers.summary import summary_view

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SCENARIOS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and any(p.glob("*.frdump")))


def first_dumps(folder: Path) -> dict[int, tuple[str, pb.Dump]]:
    """Each rank's first dump: what it built when the hang was declared."""
    out: dict[int, tuple[str, pb.Dump]] = {}
    for f in sorted(folder.glob("*.frdump")):
        d = read_dump(f)
        out.setdefault(d.header.rank, (str(f), d))
    return out


def from_summaries(summaries: dict[int, pb.Summary] | dict[int, fs.Summary]) -> Run:
    dumps = {r: RankDump(f"rank {r}", summary_view(s)) for r, s in summaries.items()}
    world = max(summary_view(s).header.world_size for s in summaries.values())
    return Run(dumps, world, (), ())


def text(msg: pb.Summary, index: int) -> str:
    return msg.dump.strings[index]


def frames(msg: pb.Summary, stack: int) -> list[tuple[str, str, int]]:
    d = msg.dump
    return [
        (d.strings[d.frames[f].file], d.strings[d.frames[f].name], d.frames[f].line)
        for f in d.stacks[stack].frames
    ]


def verdict(findings: list[Any]) -> list[tuple[object, ...]]:
    return [(f.kind, f.ranks, f.op, f.seq, f.field) for f in findings[:1]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_verdict_from_summaries_is_the_verdict_from_dumps(scenario: str) -> None:
    folder = SAMPLES / scenario
    summaries = {
        r: fs.decode(fs.encode(fs.summarize(d, 5, path)))
        for r, (path, d) in first_dumps(folder).items()
    }
    got = verdict(analyze(from_summaries(summaries)).findings)
    want = verdict(analyze_dir(str(folder), AnalysisOptions(View.EARLIEST, workers=1)).findings)
    if scenario == "crashed_rank":
        # The dead rank's black box is a file on its host; through the store it is missing.
        assert got == [("missing_dump", (1,), "all_reduce", 4, None)]
    else:
        assert got == want


def test_a_summary_round_trips_and_names_the_line() -> None:
    (path, dump) = first_dumps(SAMPLES / "stalled_rank")[2]
    s = fs.summarize(dump, 9, path)
    data = fs.encode(s)
    back = fs.decode(data)
    assert back.dump == fs.to_dump(s)  # the one message, as built
    assert back.round == 9 and back.dump.header.rank == 2 and back.dump_path == path
    assert s.stack[0].function == "save_checkpoint_shard" and "time.sleep" in s.stack[0].code
    (main,) = back.dump.threads
    top = back.dump.frames[back.dump.stacks[main.stack].frames[0]]
    assert text(back, top.name) == "save_checkpoint_shard" and "time.sleep" in text(back, top.code)
    assert len(data) < 2048


def ddp_rank() -> pb.Dump:
    """A DDP rank: entries only PyTorch's recorder saw (record id 0, merged by time), then a
    gradient-bucket all_reduce six frames below ``loss.backward()``, pending."""
    torch_side = [
        ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", "_engine_run_backward", 9),
        ("/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", "backward", 8),
        ("/venv/lib/python3.11/site-packages/torch/_tensor.py", "backward", 7),
        ("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "_call_impl", 6),
        ("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "_wrapped", 5),
    ]
    user = [("/job/train.py", "train_step", 22), ("/job/train.py", "main", 40)]
    b = DumpBuilder()
    b.header.rank, b.header.world_size = 1, 4
    g = b.group("0", [0, 1, 2, 3], last_seq=3)
    b.entry(EntryValues(0, g, "broadcast", seq=1, enqueue_ns=100, state=pb.COMPLETED))
    b.entry(EntryValues(0, g, "all_reduce", seq=2, enqueue_ns=200, state=pb.COMPLETED))
    b.entry(
        EntryValues(
            1, g, "all_reduce", seq=3, enqueue_ns=300, state=pb.STARTED,
            stack=[*torch_side, *user], inputs=[((40,), "float32")],
        )
    )  # fmt: skip
    b.thread(1, "MainThread", [*torch_side * 2, *user], is_main=True, holds_recorder=True)
    return b.build()


def test_entries_only_torch_saw_and_deep_torch_stacks_keep_the_users_line() -> None:
    s = fs.summarize(ddp_rank(), 1, "")
    entries = s.groups[0].entries
    assert [e.record_id for e in entries] == [0, 0, 1]
    pending = entries[-1].stack
    assert len(pending) == fs.MAX_ENTRY_FRAMES
    assert pending[0].function == "_engine_run_backward"
    assert [f.function for f in pending[1:]] == ["train_step", "main"]
    assert [f.function for f in s.stack if f.file.startswith("/job/")] == ["train_step", "main"]
    view = summary_view(fs.decode(fs.encode(s)))
    assert list(view.entries.seq) == [1, 2, 3]  # ring order, by time
    assert view.header.entries_recorded == 1


def test_members_written_as_a_grid_reach_the_summary() -> None:
    """Schema 1.2 writes regular member lists as grids (``ranks`` empty): the summary must
    expand them, or a group whose other members are missing reads as having none."""
    s = fs.summarize(ddp_rank(), 1, "")
    assert ddp_rank().groups[0].ranks[:] == []  # written as a grid
    assert list(members_of(fs.decode(fs.encode(s)).dump.groups[0])) == [0, 1, 2, 3]
    run = from_summaries({1: s})
    first = analyze(run).findings[0]
    assert first.kind.value == "missing_dump" and first.ranks == (0, 2, 3)
    assert "group 0 [ranks 0-3]" in first.summary


def monster() -> pb.Dump:
    """A rank with everything at its largest: 40 groups, long names, deep stacks, big tensors."""
    b = DumpBuilder()
    b.header.rank, b.header.world_size = 3, 100_000
    b.header.hostname = "h" * 5000
    deep = [(f"/very/long/path/{'x' * 300}/{i}.py", "f" * 300, i + 1) for i in range(200)]
    rid = 0
    for g in range(40):
        members = [(i * 7919) % 100_000 for i in range(5000)]  # neither short nor a range
        index = b.group(f"group-{g}-{'n' * 500}", members, last_seq=10**12, p2p=[(1, 2, 3)] * 50)
        for seq in range(30):
            rid += 1
            b.entry(
                EntryValues(
                    rid,
                    index,
                    "all_reduce" * 40,
                    seq=seq + 1,
                    state=pb.ENQUEUED,
                    stack=deep[seq:],
                    inputs=[((1,) * 40, "float32")] * 20,
                )
            )
    b.thread(1, "MainThread", deep, is_main=True)
    return b.build()


def test_a_summary_is_bounded_whatever_the_rank_holds() -> None:
    s = fs.summarize(monster(), 2**40, "/" + "d" * 10_000)
    data = fs.encode(s)
    assert len(data) <= fs.MAX_BYTES
    back = fs.decode(data)
    assert back.dump.header.rank == 3 and back.dump.header.world_size == 100_000
    assert len(back.dump.groups) <= fs.MAX_GROUPS
    assert len(back.dump.entries.seq) <= fs.MAX_GROUPS * fs.MAX_ENTRIES
    summary_view(back)  # still makes a consistent dump


def sample() -> pb.Summary:
    (path, dump) = first_dumps(SAMPLES / "stalled_rank")[0]
    return fs.decode(fs.encode(fs.summarize(dump, 1, path)))


def wire(change: Callable[[pb.Summary], object]) -> bytes:
    msg = sample()
    change(msg)
    return msg.SerializeToString()


def _entry_op(m: pb.Summary) -> None:
    m.dump.entries.op[0] = 10_000


def _state(m: pb.Summary) -> None:
    m.dump.entries.state[0] = 77  # type: ignore[call-overload]


def _peer(m: pb.Summary) -> None:
    m.dump.entries.peer[0] = 10**6


def _members(m: pb.Summary) -> None:
    m.dump.groups[0].ClearField("rank_grid")
    m.dump.groups[0].ranks.extend([0, 1, 9])


def _columns(m: pb.Summary) -> None:
    m.dump.entries.seq.append(1)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "wrong magic"),
        (b"garbage", "unparseable"),
        (b"\x0a" + b"\xff" * 4000, "more than"),
        (pb.Summary(magic="flightrec.dump").SerializeToString(), "wrong magic"),
        (wire(lambda m: setattr(m.dump.header, "rank", 4)), "rank 4 of world size 4 is no rank"),
        (wire(lambda m: setattr(m.dump.header, "world_size", 2**40 % 2**31)), "no rank"),
        (wire(lambda m: setattr(m.dump.header, "source", "flightrec")), "not 'flightrec-summary'"),
        (wire(lambda m: setattr(m.dump.header, "reason", 99)), "unknown dump reason"),
        (wire(lambda m: setattr(m.dump.header, "timeout_s", float("nan"))), "timeout"),
        (wire(_entry_op), "points outside its table"),
        (wire(_state), "unknown state"),
        (wire(_peer), "peer lies outside"),
        (wire(_members), "ranks outside the world"),
        (wire(_columns), "entry column"),
        (wire(lambda m: setattr(m, "dump_path", "/" * 600)), "longer than"),
    ],
)
def test_damaged_summaries_cost_one_line(data: bytes, words: str) -> None:
    with pytest.raises(fs.SummaryError) as err:
        fs.decode(data, "rank 5's summary")
    line = str(err.value)
    assert line.startswith("rank 5's summary: ") and words in line, line
    assert "\n" not in line and not CONTROL.search(line)


def try_hostile(
    base: bytes, tries: int, who: str, accepted: Callable[[pb.Summary], None], seed: int
) -> int:
    """Random damage to ``base`` (bytes flipped, cut, repeated): a refusal must be one clean
    line, and what is accepted goes to ``accepted``. Returns how many were refused."""
    rng = random.Random(seed)
    refused = 0
    for _ in range(tries):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            if rng.random() < 0.8:
                data[at] = rng.randrange(256)
            else:
                data[at : at + 4] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 9)))
        try:
            s = fs.decode(bytes(data), who)
        except fs.SummaryError as exc:
            refused += 1
            assert "\n" not in str(exc) and not CONTROL.search(str(exc))
            assert str(exc).startswith(f"{who}: ")
            continue
        accepted(s)
    return refused


def test_every_hostile_value_anywhere_is_refused_or_harmless() -> None:
    base = sample().SerializeToString()
    healthy = {r: fs.decode(fs.encode(fs.summarize(d, 1, p))) for r, (p, d) in
               first_dumps(SAMPLES / "stalled_rank").items()}  # fmt: skip

    def accepted(s: pb.Summary) -> None:
        # The analysis runs on whatever got through, and the text is printable.
        run = from_summaries({**healthy, 0: s})
        analyze(run)

    refused = try_hostile(base, 600, "rank 0's summary", accepted, seed=1)
    assert refused > 100


def died_rank(message: str = "bad batch: label 12 out of range") -> pb.Dump:
    """Rank 1, which died of a ValueError its data pipeline raised after all_reduce #5."""
    b = DumpBuilder()
    b.header.rank, b.header.world_size, b.header.reason = 1, 4, pb.PROCESS_EXIT
    g = b.group("0", [0, 1, 2, 3], last_seq=5)
    for seq in range(1, 6):
        b.entry(
            EntryValues(seq, g, "all_reduce", seq=seq, enqueue_ns=seq * 100, complete_ns=seq * 100 + 50,
                        state=pb.COMPLETED, stack=[("/job/train.py", "main", 30)])
        )  # fmt: skip
    traceback = [("/job/data.py", "next_batch", 12), ("/job/train.py", "main", 28)]
    b.exception("ValueError", message, traceback, thread="MainThread", is_main=True,
                wall_time_ns=123, via="sys.excepthook")  # fmt: skip
    b.thread(1, "MainThread", traceback, is_main=True)
    return b.build()


def test_a_rank_that_died_carries_its_exception_to_the_verdict() -> None:
    s = fs.decode(fs.encode(fs.summarize(died_rank(), 0, "/dumps/rank1.frdump")))
    (x,) = s.dump.exceptions
    assert (x.type, x.message, x.thread, x.is_main) == (
        "ValueError", "bad batch: label 12 out of range", "MainThread", True,
    )  # fmt: skip
    assert [(f, n) for f, _, n in frames(s, x.stack)] == [
        ("/job/data.py", 12), ("/job/train.py", 28),
    ]  # fmt: skip
    # The others wait in all_reduce #6; the analysis of the summaries names the crash.
    others = {}
    for rank in (0, 2, 3):
        b = DumpBuilder()
        b.header.rank, b.header.world_size, b.header.reason = rank, 4, pb.SIGNAL_TERM
        g = b.group("0", [0, 1, 2, 3], last_seq=6)
        b.entry(EntryValues(6, g, "all_reduce", seq=6, enqueue_ns=700, state=pb.STARTED,
                            stack=[("/job/train.py", "main", 30)]))  # fmt: skip
        b.thread(1, "MainThread", [("/job/train.py", "main", 30)], is_main=True)
        others[rank] = fs.decode(fs.encode(fs.summarize(b.build(), 3, "")))
    report = analyze(from_summaries({**others, 1: s}))
    top = report.findings[0]
    assert (top.kind, top.ranks) == ("dead_rank", (1,))
    assert top.exception is not None and top.exception.type == "ValueError"
    assert top.exception.traceback[0].file == "/job/data.py"


def test_the_exception_survives_every_trimming_step() -> None:
    dump = died_rank("x" * 5000)
    deep = monster()
    dump.groups.extend(deep.groups)  # a rank that also holds the most a summary may
    s = fs.summarize(dump, 1, "/" + "d" * 10_000)
    back = fs.decode(fs.encode(s))
    (x,) = back.dump.exceptions
    assert x.type == "ValueError"
    assert len(x.message) == fs.MAX_TEXT
    assert x.message.endswith("x…")  # the reader sees it was cut
    assert frames(back, x.stack)[0][2] == 12


def test_hostile_exception_values_are_refused_or_harmless() -> None:
    base = fs.encode(fs.summarize(died_rank(), 1, ""))

    def accepted(s: pb.Summary) -> None:
        summary_view(s)

    refused = try_hostile(base, 300, "rank 1's summary", accepted, seed=2)
    assert refused > 50
