"""Summaries: what a rank publishes through the store when a hang is declared.

The verdict computed from summaries must be the one computed from full dumps (the same passes
run on both); a summary is bounded in size whatever the rank's state; and a summary read from
the store is untrusted: any damage is one ``SummaryError`` line, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flightrec.analysis import AnalysisOptions, RankDump, View, analyze, analyze_dir
from flightrec.analysis.loading.loader import Run
from flightrec.errors import CONTROL, DumpError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format import summary as fs
from flightrec.format.builder import DumpBuilder, EntryValues
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


def from_summaries(summaries: dict[int, fs.Summary]) -> Run:
    dumps = {r: RankDump(f"rank {r}", summary_view(s)) for r, s in summaries.items()}
    world = max(s.world_size for s in summaries.values())
    return Run(dumps, world, (), ())


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
    assert fs.decode(data) == s
    assert s.round == 9 and s.rank == 2 and s.dump_path == path
    assert s.stack[0].function == "save_checkpoint_shard" and "time.sleep" in s.stack[0].code
    assert len(data) < 1200


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
    s = fs.decode(fs.encode(fs.summarize(ddp_rank(), 1, "")))
    entries = s.groups[0].entries
    assert [e.record_id for e in entries] == [0, 0, 1]
    pending = entries[-1].stack
    assert len(pending) == fs.MAX_ENTRY_FRAMES
    assert pending[0].function == "_engine_run_backward"
    assert [f.function for f in pending[1:]] == ["train_step", "main"]
    assert [f.function for f in s.stack if f.file.startswith("/job/")] == ["train_step", "main"]
    view = summary_view(s)
    assert list(view.entries.seq) == [1, 2, 3]  # ring order, by time
    assert view.header.entries_recorded == 1


def test_members_written_as_a_grid_reach_the_summary() -> None:
    """Schema 1.2 writes regular member lists as grids (``ranks`` empty): the summary must
    expand them, or a group whose other members are missing reads as having none."""
    s = fs.summarize(ddp_rank(), 1, "")
    assert ddp_rank().groups[0].ranks[:] == []  # written as a grid
    assert list(fs.decode(fs.encode(s)).groups[0].ranks) == [0, 1, 2, 3]
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
    assert back.rank == 3 and back.world_size == 100_000
    assert len(back.groups) <= fs.MAX_GROUPS
    assert all(len(g.entries) <= fs.MAX_ENTRIES for g in back.groups)
    summary_view(back)  # still makes a consistent dump


def doc_of(data: bytes) -> dict[str, Any]:
    return json.loads(zlib.decompress(data[len(fs.MAGIC) :]))  # type: ignore[no-any-return]


def wire(doc: object) -> bytes:
    return fs.MAGIC + zlib.compress(json.dumps(doc).encode())


def sample_doc() -> dict[str, Any]:
    (path, dump) = first_dumps(SAMPLES / "stalled_rank")[0]
    return doc_of(fs.encode(fs.summarize(dump, 1, path)))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "wrong magic"),
        (b"garbage", "wrong magic"),
        (fs.MAGIC + b"\x00" * 3000, "more than"),
        (fs.MAGIC + zlib.compress(b" " * 1_000_000, 9), "larger than any summary"),
        (fs.MAGIC + b"not zlib at all", "unreadable"),
        (fs.MAGIC + zlib.compress(b"{not json"), "unreadable"),
        (fs.MAGIC + zlib.compress(b"\xff\xfe"), "unreadable"),
        (fs.MAGIC + zlib.compress(b"[" * 20_000), "unreadable"),
        (wire([1, 2]), "not an object"),
        (wire({"world": 4, "rank": 7}), "integer in 0..3"),
        (wire({"world": 2**40, "rank": 0}), "integer in"),
    ],
)
def test_damaged_summaries_cost_one_line(data: bytes, words: str) -> None:
    with pytest.raises(fs.SummaryError) as err:
        fs.decode(data, "rank 5's summary")
    line = str(err.value)
    assert line.startswith("rank 5's summary: ") and words in line, line
    assert "\n" not in line and not CONTROL.search(line)


HOSTILE: list[object] = [
    -1, 2**70, 1.5, "x" * 1000, "\x1b[2J\x1b]0;pwned\x07", None, [], {}, [[[[]]]], True,
]  # fmt: skip


def paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every place in a JSON document that holds a value."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def replaced(doc: Any, path: tuple[object, ...], value: object) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def try_hostile(
    base: Any, chosen: list[Any], who: str, accepted: Callable[[fs.Summary], None]
) -> tuple[int, int]:
    """Every HOSTILE value at every path in ``chosen``: a refusal must be one clean line, and
    what is accepted goes to ``accepted``. Returns (tried, refused)."""
    tried = refused = 0
    for path in chosen:
        for value in HOSTILE:
            tried += 1
            try:
                s = fs.decode(wire(replaced(base, path, value)), who)
            except fs.SummaryError as exc:
                refused += 1
                assert "\n" not in str(exc) and not CONTROL.search(str(exc))
                continue
            accepted(s)
    return tried, refused


def test_every_hostile_value_anywhere_is_refused_or_harmless() -> None:
    base = sample_doc()
    healthy = {r: fs.decode(fs.encode(fs.summarize(d, 1, p))) for r, (p, d) in
               first_dumps(SAMPLES / "stalled_rank").items()}  # fmt: skip

    def accepted(s: fs.Summary) -> None:
        # It must still make a dump the analysis runs on, or one DumpError.
        try:
            view = summary_view(s)
        except DumpError:
            return
        run = from_summaries({**healthy, 0: s})
        run.dumps[0] = RankDump("rank 0", view)
        analyze(run)

    tried, refused = try_hostile(base, paths(base), "rank 0's summary", accepted)
    assert tried > 500 and refused > tried // 2


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
    (x,) = s.exceptions
    assert (x.type, x.message, x.thread, x.is_main) == (
        "ValueError", "bad batch: label 12 out of range", "MainThread", True,
    )  # fmt: skip
    assert [(f.file, f.line) for f in x.stack] == [("/job/data.py", 12), ("/job/train.py", 28)]
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
    assert back.exceptions and back.exceptions[0].type == "ValueError"
    assert len(back.exceptions[0].message) == fs.MAX_TEXT
    assert back.exceptions[0].message.endswith("x…")  # the reader sees it was cut
    assert back.exceptions[0].stack[0].line == 12


def test_hostile_exception_values_are_refused_or_harmless() -> None:
    base = doc_of(fs.encode(fs.summarize(died_rank(), 1, "")))

    def accepted(s: fs.Summary) -> None:
        with contextlib.suppress(DumpError):
            summary_view(s)

    chosen = [p for p in paths(base) if p[0] == "x"]
    tried, refused = try_hostile(base, chosen, "rank 1's summary", accepted)
    assert tried > 50 and refused > tried // 3
