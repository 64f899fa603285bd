"""Dump files: magic, versions, atomic writes, and one clear error per bad file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flightrec.errors import (
    CorruptDumpError,
    DumpError,
    NotADumpError,
    UnsupportedVersionError,
)
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.members import Grid, expand, grid_of, members_of, set_members
from flightrec.format.read import has_magic, parse_dump, read_dump, validate
from flightrec.format.schema import MAGIC_PREFIX, dump_filename
from flightrec.format.view import DumpView
from flightrec.format.wire import read_compact
from flightrec.format.write import write_dump
from flightrec.readers import read_views


def small_dump(rank: int = 1, entries: int = 3) -> pb.Dump:
    b = DumpBuilder()
    b.header.rank = rank
    b.header.world_size = 4
    g = b.group("0", [0, 1, 2, 3], desc="default_pg", backend="gloo", last_seq=entries)
    for i in range(entries):
        b.entry(
            EntryValues(
                record_id=i,
                group=g,
                op="all_reduce",
                seq=i + 1,
                reduce_op="SUM",
                state=pb.COMPLETED,
                enqueue_ns=1000 * i,
                complete_ns=1000 * i + 500,
                stack=[("train.py", "step", 22), ("train.py", "main", 40)],
                inputs=[((4, 4), "float32")],
                outputs=[((4, 4), "float32")],
            )
        )
    b.thread(7, "MainThread", [("train.py", "load_batch", 18)], is_main=True)
    return b.build()


def test_round_trip_keeps_interned_tables(tmp_path: Path) -> None:
    path = write_dump(small_dump(), tmp_path, dump_filename(1, 0, "api_call", 42))
    dump = read_dump(path)
    assert path.name == "flightrec-rank00001-42-000-api_call.frdump"
    assert list(dump.entries.seq) == [1, 2, 3]
    # three entries share one stack and one tensor signature
    # (stacks: the empty sentinel, the entries' stack, the thread's stack at dump time)
    assert len(set(dump.entries.stack)) == 1 and len(dump.stacks) == 3
    assert len(set(dump.entries.inputs)) == 1 and len(dump.tensor_specs) == 2
    frame = dump.frames[dump.stacks[dump.entries.stack[0]].frames[0]]
    assert (dump.strings[frame.file], dump.strings[frame.name], frame.line) == (
        "train.py",
        "step",
        22,
    )


def test_file_starts_with_magic(tmp_path: Path) -> None:
    path = write_dump(small_dump(), tmp_path, "x.frdump")
    assert path.read_bytes().startswith(MAGIC_PREFIX)
    assert has_magic(path)
    (tmp_path / "notes.txt").write_text("hello")
    assert not has_magic(tmp_path / "notes.txt")


def test_write_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    write_dump(small_dump(), tmp_path, "a.frdump")
    write_dump(small_dump(rank=2), tmp_path, "b.frdump")
    assert sorted(os.listdir(tmp_path)) == ["a.frdump", "b.frdump"]


def test_unwritable_directory_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        write_dump(small_dump(), blocker / "sub", "a.frdump")


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (b"", NotADumpError, "empty file"),
        (b"hello world", NotADumpError, "not a flightrec dump"),
        (None, CorruptDumpError, "truncated"),
    ],
)
def test_bad_bytes_get_one_clear_line(
    tmp_path: Path, data: bytes | None, error: type[DumpError], words: str
) -> None:
    if data is None:
        data = small_dump().SerializeToString()[:-7]
    path = tmp_path / "bad.frdump"
    path.write_bytes(data)
    with pytest.raises(error) as info:
        read_dump(path)
    message = str(info.value)
    assert str(path) in message and words in message and "\n" not in message


def test_unknown_major_version_is_refused_in_plain_words() -> None:
    dump = small_dump()
    dump.schema_major, dump.schema_minor = 2, 0
    with pytest.raises(UnsupportedVersionError, match=r"schema 2\.0.*reads schema 1\.x"):
        parse_dump(dump.SerializeToString(), "future.frdump")


def test_newer_minor_version_is_accepted() -> None:
    dump = small_dump()
    dump.schema_minor = 9
    assert parse_dump(dump.SerializeToString()).schema_minor == 9


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: d.entries.seq.append(9), "column seq has 4 values"),
        (lambda d: d.entries.op.__setitem__(0, 999), "column op points outside"),
        (lambda d: d.entries.group.__setitem__(1, 5), "column group points outside"),
        (lambda d: d.stacks[1].frames.append(77), "a stack points outside"),
        (lambda d: d.threads[0].__setattr__("stack", 50), "missing stack"),
        (lambda d: d.header.__setattr__("rank", 9), "does not fit world size"),
    ],
)
def test_inconsistent_dump_is_corrupt(damage: object, words: str) -> None:
    dump = small_dump()
    damage(dump)  # type: ignore[operator]
    with pytest.raises(CorruptDumpError, match=words):
        parse_dump(dump.SerializeToString(), "damaged.frdump")


@pytest.mark.parametrize(
    ("column", "table"),
    [("op", "strings"), ("reduce_op", "strings"), ("thread", "strings"), ("device", "strings"),
     ("group", "groups"), ("stack", "stacks"), ("inputs", "tensor_specs"),
     ("outputs", "tensor_specs")],
)  # fmt: skip
def test_one_byte_index_columns_are_checked_at_their_tables_bound(column: str, table: str) -> None:
    # A view's index columns are one-byte arrays, checked by deleting the values in range.
    view = DumpView.of(small_dump())
    values = getattr(view.entries, column)
    assert values.typecode == "B"
    bound = len(getattr(view, table))
    values[-1] = bound - 1
    validate(view, "view.frdump")  # type: ignore[arg-type]  # reads like pb.Dump
    for bad in (bound, 255):
        values[-1] = bad
        with pytest.raises(CorruptDumpError, match=f"view.frdump.*column {column} points outside"):
            validate(view, "view.frdump")  # type: ignore[arg-type]


def test_oversized_file_is_refused_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.frdump"
    path.write_bytes(MAGIC_PREFIX + b"\0" * 4096)
    with pytest.raises(CorruptDumpError, match="larger than any dump"):
        read_dump(path, max_bytes=1024)


# Group membership in a size that does not grow with the job (schema 1.2, RankGrid).

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def grid_dump(ranks: range | list[int], world: int) -> pb.Dump:
    b = DumpBuilder()
    b.header.rank, b.header.world_size = 0, world
    b.group("0", ranks, desc="default_pg")
    return b.build()


def test_regular_groups_are_written_as_a_grid_of_constant_size() -> None:
    sizes = {}
    for world in (1024, 131_072):
        dump = grid_dump(range(world), world)
        (g,) = dump.groups
        assert g.HasField("rank_grid") and not g.ranks
        assert members_of(g) == range(world)
        sizes[world] = dump.ByteSize()
    assert sizes[131_072] - sizes[1024] <= 4  # a few bytes of varint, not 130,048 ranks


@pytest.mark.parametrize(
    ("ranks", "grid"),
    [
        (range(4), Grid(0, (4,), (1,))),  # a contiguous block
        ([3, 11, 19, 27], Grid(3, (4,), (8,))),  # a strided slice (a mesh dimension)
        ([0, 1, 2, 3, 16, 17, 18, 19], Grid(0, (2, 4), (16, 1))),  # two mesh dims flattened
        ([0, 2, 1, 3], Grid(0, (2, 2), (1, 2))),  # a transposed 2x2 mesh
    ],
)
def test_grids_round_trip_in_group_rank_order(ranks: range | list[int], grid: Grid) -> None:
    assert grid_of(ranks) == grid
    (g,) = parse_dump(grid_dump(ranks, 64).SerializeToString()).groups
    assert not g.ranks and list(expand(grid)) == list(ranks) == list(members_of(g))


@pytest.mark.parametrize("ranks", [[2], [0, 1, 5], [3, 2, 1], [0, 1, 0, 1], []])
def test_irregular_groups_keep_their_explicit_list(ranks: list[int]) -> None:
    (g,) = grid_dump(ranks, 8).groups
    assert not g.HasField("rank_grid") and list(g.ranks) == ranks == list(members_of(g))


@pytest.mark.parametrize("scenario", ["stalled_rank", "subgroup_hang"])
def test_schema_1_1_dumps_are_read_unchanged(scenario: str) -> None:
    for path in sorted((SAMPLES / scenario).glob("*.frdump")):
        data = path.read_bytes()
        old = parse_dump(data, path)
        assert (old.schema_major, old.schema_minor) == (1, 1)
        assert all(g.ranks and not g.HasField("rank_grid") for g in old.groups)
        # Both readers see the explicit lists as they are...
        fast = read_compact(data, str(path))
        assert fast is not None
        for g, slow, quick in zip(old.groups, DumpView.of(old).groups, fast.groups, strict=True):
            assert list(slow.ranks) == list(quick.ranks) == list(g.ranks)
        # ...and as the same members when the groups are rewritten as grids (1.2).
        new = pb.Dump()
        new.CopyFrom(old)
        new.schema_minor = 2
        for g in new.groups:
            ranks = list(g.ranks)
            g.ClearField("ranks")
            set_members(g, ranks)
        assert all(g.HasField("rank_grid") for g in new.groups)
        newer = read_compact(new.SerializeToString(), str(path))
        assert newer is not None
        assert [list(g.ranks) for g in newer.groups] == [list(g.ranks) for g in fast.groups]


def _grid(start: int, shape: list[int], stride: list[int]) -> object:
    def damage(d: pb.Dump) -> None:
        grid = d.groups[0].rank_grid
        grid.Clear()
        grid.start = start
        grid.shape.extend(shape)
        grid.stride.extend(stride)

    return damage


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: d.groups[0].ranks.append(1), "lists its members twice"),
        (lambda d: d.groups[0].rank_grid.Clear(), "grid has 0 sizes"),
        (_grid(0, [4, 2], [1]), "grid has 2 sizes and 1 strides"),
        (_grid(0, [4], [0]), "zero size or stride"),
        (_grid(0, [0], [1]), "zero size or stride"),
        (_grid(0, [2] * 9, [1] * 9), "9 dimensions"),
        (_grid(1 << 31, [2], [1]), "beyond any job"),
        (_grid(0, [1 << 20, 1 << 20], [1, 1]), "beyond any job"),
        (_grid(0, [2, 2], [1 << 31, 1]), "beyond any job"),
        (_grid(2, [2], [1]), "reaches rank 3, beyond world size 3"),
        (_grid(0, [2, 2], [1, 1]), "beyond world size 3"),
    ],
)
def test_a_damaged_grid_is_corrupt_in_one_line(damage: object, words: str, tmp_path: Path) -> None:
    dump = grid_dump(range(3), 3)
    damage(dump)  # type: ignore[operator]
    path = write_dump(dump, tmp_path, "flightrec-rank00000-1-000-api_call.frdump")
    with pytest.raises(CorruptDumpError, match=words) as info:
        read_dump(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    # The wire reader declines it (never builds members from it), and read_views says why.
    assert read_compact(path.read_bytes(), str(path)) is None
    with pytest.raises(CorruptDumpError, match=words):
        read_views(path)
