"""The tail layout (schema 1.3): the newest entries readable alone, and deeper reads where needed."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from flightrec.analysis import analyze
from flightrec.analysis.loading.loader import AnalysisOptions, load_dir
from flightrec.errors import CorruptDumpError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.read import parse_dump, read_dump
from flightrec.format.schema import FOOTER, MAGIC_PREFIX, TAIL_ENTRIES, dump_filename
from flightrec.format.tail import read_tail
from flightrec.format.view import DumpView
from flightrec.format.write import serialize, write_dump
from flightrec.readers import read_views
from tests.unit.factories import Job, healthy


def ring(entries: int) -> pb.Dump:
    b = DumpBuilder()
    b.header.rank, b.header.world_size = 1, 2
    g = b.group("0", [0, 1], desc="default_pg", backend="gloo", last_seq=entries)
    for i in range(entries):
        b.entry(
            EntryValues(
                record_id=i,
                group=g,
                op="all_reduce",
                seq=i + 1,
                reduce_op="SUM",
                state=pb.COMPLETED,
                enqueue_ns=10**12 + i * 10**6,
                complete_ns=10**12 + i * 10**6 + 500,
                thread="MainThread",
                stack=[("/job/train.py", "step", 20 + i % 3)],
                inputs=[((4, 4), "float32")],
                outputs=[((4, 4), "float32")],
                device="cpu",
            )
        )
    return b.build()


def test_a_tail_layout_file_is_the_same_dump_to_any_protobuf_parser() -> None:
    dump = ring(1000)
    data = serialize(dump)
    assert data.startswith(MAGIC_PREFIX)
    parsed = parse_dump(data)
    older = 1000 - TAIL_ENTRIES
    assert parsed.older_entries == older
    assert data[parsed.tail_start] == 0x22  # the tail section starts with the header (field 4)
    tag, start, tag2, count = struct.unpack("<BQBI", data[-FOOTER:])
    assert (tag, start, tag2, count) == (0x69, parsed.tail_start, 0x75, older)
    for name in ("tail_start", "older_entries"):
        parsed.ClearField(name)  # type: ignore[arg-type]
    assert parsed == dump


def test_the_tail_holds_the_newest_entries_and_says_how_many_it_left_out(tmp_path: Path) -> None:
    path = write_dump(ring(1000), tmp_path, "flightrec-rank00001-1-000-x.frdump")
    tail = read_tail(str(path))
    assert tail is not None
    whole = DumpView.of(read_dump(path))
    assert tail.older == 1000 - TAIL_ENTRIES and whole.older == 0
    assert list(tail.entries.seq) == list(range(1000 - TAIL_ENTRIES + 1, 1001))
    for name, col in tail.entries.columns().items():
        assert list(col) == list(getattr(whole.entries, name))[-TAIL_ENTRIES:], name
    assert tail.meta == whole.meta
    # The fast whole-file reader takes the two entries fields in order.
    (full,) = read_views(path)
    assert full.older == 0 and list(full.entries.seq) == list(range(1, 1001))


def test_a_short_ring_is_all_tail(tmp_path: Path) -> None:
    path = write_dump(ring(10), tmp_path, "flightrec-rank00001-1-000-x.frdump")
    tail = read_tail(str(path))
    assert tail is not None and tail.older == 0 and len(tail.entries.seq) == 10


def test_older_dumps_and_damaged_footers_are_read_whole(tmp_path: Path) -> None:
    dump = ring(600)
    old = tmp_path / "flightrec-rank00001-1-000-old.frdump"
    dump.schema_minor = 2
    old.write_bytes(dump.SerializeToString())  # a 1.2 writer: no tail section
    assert read_tail(str(old)) is None
    (view,) = read_views(old, tail=True)
    assert view.older == 0 and len(view.entries.seq) == 600
    bad = tmp_path / "flightrec-rank00001-1-000-bad.frdump"
    data = bytearray(serialize(ring(600)))
    data[-13:-5] = struct.pack("<Q", len(data) + 5)  # a tail_start beyond the file
    bad.write_bytes(bytes(data))
    assert read_tail(str(bad)) is None
    (view,) = read_views(bad, tail=True)
    assert view.older == 0 and len(view.entries.seq) == 600


def far_behind() -> Job:
    """Ranks 2 and 3 ran hundreds of collectives on their own group since the last one on the
    default group; rank 2 then stalled, so ranks 0, 1 and 3 wait in all_reduce #21 on group 0,
    which leaves the tails of ranks 2 and 3 without any entry of group 0."""
    job = healthy(Job(), steps=20)
    job.group("pair", [2, 3], desc="pair")
    for _ in range(TAIL_ENTRIES + 300):
        job.collective(group="pair")
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    return job


def test_ranks_whose_tail_misses_where_a_peer_is_are_read_whole(tmp_path: Path) -> None:
    far_behind().write(tmp_path)
    run = load_dir(tmp_path, AnalysisOptions(workers=1, tail=True))
    assert all(d.dump.older == 0 for d in run.dumps.values())
    assert len(run.dumps[2]) == 20 + TAIL_ENTRIES + 300
    assert any("read the whole ring of ranks 2-3" in n for n in run.notes)
    tail_first = analyze(run)
    whole = analyze(load_dir(tmp_path, AnalysisOptions(workers=1, tail=False)))
    assert [f.summary for f in tail_first.findings] == [f.summary for f in whole.findings]
    first = tail_first.findings[0]
    assert (first.kind, first.ranks, first.process_group, first.seq) == (
        "not_arrived",
        (2,),
        "0",
        21,
    )


def test_ranks_in_step_are_read_from_their_tail_only(tmp_path: Path) -> None:
    job = Job()
    for _ in range(TAIL_ENTRIES + 100):
        job.collective()
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    job.write(tmp_path)
    run = load_dir(tmp_path, AnalysisOptions(workers=1, tail=True))
    assert {r: d.dump.older for r, d in run.dumps.items()} == {
        0: 101,
        1: 101,
        2: 100,
        3: 101,
    }
    assert not any("whole ring" in n for n in run.notes)
    report = analyze(run)
    assert report.findings[0].ranks == (2,) and report.findings[0].seq == TAIL_ENTRIES + 101
    name = dump_filename(0, 0, "WATCHDOG_TIMEOUT", 1000)
    assert (tmp_path / name).exists()


def test_tables_checked_once_are_trusted_only_as_identical_bytes(tmp_path: Path) -> None:
    good = ring(300)
    first = write_dump(good, tmp_path, "flightrec-rank00001-1-000-a.frdump")
    assert read_views(first, tail=True)[0].older == 300 - TAIL_ENTRIES
    bad = ring(300)
    bad.threads.add(ident=7, name="MainThread", stack=99)  # a stack the table lacks
    path = write_dump(bad, tmp_path, "flightrec-rank00001-1-000-b.frdump")
    assert read_tail(str(path)) is None  # the fast reader declines...
    with pytest.raises(CorruptDumpError, match="missing stack"):
        read_views(path, tail=True)  # ...and the ordinary one names the problem


def test_a_folder_of_a_few_thousand_dumps_or_fewer_is_read_whole(tmp_path: Path) -> None:
    """Reading tails is for the largest jobs: up to ``TAIL_FROM_FILES`` files every ring is
    read whole, so what only older entries show is never missed."""
    from flightrec.analysis.loading import loader

    job = Job()
    for _ in range(TAIL_ENTRIES + 100):
        job.collective()
    job.write(tmp_path)
    assert len(list(tmp_path.glob("*.frdump"))) <= loader.TAIL_FROM_FILES
    assert all(
        d.dump.older == 0 for d in load_dir(tmp_path, AnalysisOptions(workers=1)).dumps.values()
    )
    tails = load_dir(tmp_path, AnalysisOptions(workers=1, tail=True)).dumps.values()
    assert any(d.dump.older > 0 for d in tails)
