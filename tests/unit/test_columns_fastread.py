"""The fast reader (``flightrec.format.wire``) gives exactly what the ordinary reader gives.

Compared on simulated dumps (every column, group and table), on dumps with wide values (peers
beyond 63, seqs beyond 127, times), and on damaged bytes: where the ordinary reader refuses a
file, the fast one must decline it (None), never accept it; where the ordinary reader accepts
it, the fast one declines or agrees. Every test runs twice: with the reader's loops in C
(``_wire``, where built) and in Python; and the two loops are compared on arbitrary bytes.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec.analysis.model import RankDump
from flightrec.errors import DumpError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format import wire
from flightrec.format.read import parse_dump
from flightrec.format.schema import ENTRY_COLUMNS
from flightrec.format.view import DumpView, EntriesView, compact_members, intern_ranks, narrow
from flightrec.format.wire import read_compact
from flightrec.format.write import _field, _varint
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from tests.unit.paths import c_and_python

C_LOOPS = wire._wire


# Every test with the reader's loops in C (where built), then in Python.
loops = c_and_python(wire, "_wire")


def fast_read(data: bytes, path: str) -> RankDump | None:
    """``format.wire``'s view as the loader wraps it (None where the wire reader declines)."""
    view = read_compact(data, path)
    return None if view is None else RankDump(path, view)


def _same(fast: RankDump, slow: RankDump) -> None:
    assert fast.dump.meta == slow.dump.meta
    assert fast.dump.groups == slow.dump.groups
    assert set(fast.columns) == set(slow.columns)
    for name, values in slow.columns.items():
        assert list(fast.columns[name]) == list(values), name


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("job")
    # 512 ranks: peers and members beyond one byte; 300 entries: seqs beyond 127.
    simulate(SimConfig(parse_layout("tp=8,pp=4", 512), 300, Fault.P2P_DEADLOCK, 77), folder)
    return sorted(p for p in folder.iterdir() if p.suffix == ".frdump")


def test_fast_reader_equals_the_ordinary_reader(job: list[Path]) -> None:
    for path in job[::37]:
        data = path.read_bytes()
        fast = fast_read(data, str(path))
        assert fast is not None, path
        _same(fast, RankDump(str(path), parse_dump(data, path)))
        # and it survives the trip from a loader worker
        _same(pickle.loads(pickle.dumps(fast)), RankDump(str(path), parse_dump(data, path)))


def test_world_group_is_shared_and_pickles_as_a_range(job: list[Path]) -> None:
    dumps = [fast_read(p.read_bytes(), str(p)) for p in job[:3]]
    worlds = [d.dump.groups[0].ranks for d in dumps if d is not None]
    assert len(worlds) == 3 and worlds[0] is worlds[1] is worlds[2]
    assert list(worlds[0]) == list(range(512))
    assert len(pickle.dumps(dumps[0].dump.groups[0])) < 400  # not 512 numbers


def test_entry_columns_are_handed_over_packed_in_one_bytes_object(job: list[Path]) -> None:
    d = fast_read(job[1].read_bytes(), str(job[1]))
    assert d is not None
    e = d.dump.entries
    # Columns of every width (times need 8 bytes, states one), in one object.
    assert {a.itemsize for a in e.columns().values()} >= {1, 8}
    codes, length, data = e.packed()
    again = EntriesView.unpack(codes, length, data)
    assert {k: (a.typecode, list(a)) for k, a in again.columns().items()} == {
        k: (a.typecode, list(a)) for k, a in e.columns().items()
    }
    back = pickle.loads(pickle.dumps(d))
    assert back.columns["enqueue_ns"] == e.enqueue_ns and back.columns["state"] == e.state
    assert isinstance(back.__getstate__()[3][2], bytes)
    with pytest.raises(ValueError, match="types and length"):
        EntriesView.unpack(codes, length + 1, data)
    with pytest.raises(ValueError, match="one type code per column"):
        EntriesView.unpack(codes[:-1], length, data)


def test_compact_members_and_narrow() -> None:
    assert compact_members([5, 37, 69, 101]) == range(5, 102, 32)
    assert compact_members([3, 2, 1]) == range(3, 0, -1)
    assert compact_members([0, 1, 3]) == (0, 1, 3)
    assert compact_members([4]) == (4,)
    assert intern_ranks(range(1000)) is intern_ranks(tuple(range(1000)))
    assert narrow([0, 255]).typecode == "B"
    assert narrow([0, 256]).typecode == "H"
    assert narrow([-1, 5]).typecode == "b"
    assert narrow([-1, 40000]).typecode == "i"
    assert narrow([0, 1 << 40]).typecode == "Q"
    assert narrow([-(1 << 40), 0]).typecode == "q"


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # (the same each example)
)
@given(
    at=st.integers(min_value=0, max_value=1 << 20),
    chunk=st.binary(min_size=1, max_size=8),
    truncate=st.booleans(),
)
def test_damaged_bytes_are_never_accepted_by_the_fast_reader_alone(
    job: list[Path], at: int, chunk: bytes, truncate: bool
) -> None:
    data = job[5].read_bytes()
    at %= len(data)
    damaged = data[:at] if truncate else data[:at] + chunk + data[at + len(chunk) :]
    try:
        slow: RankDump | None = RankDump("x", parse_dump(damaged, "x"))
    except DumpError:
        slow = None
    fast = fast_read(damaged, "x")
    if slow is None:
        assert fast is None
    elif fast is not None:
        _same(fast, slow)


def test_indices_beyond_their_tables_are_declined(job: list[Path]) -> None:
    dump = parse_dump(job[5].read_bytes(), job[5])
    no_groups = pb.Dump()
    no_groups.CopyFrom(dump)
    no_groups.ClearField("groups")  # every entry's group index now points nowhere
    few_strings = pb.Dump()
    few_strings.CopyFrom(dump)
    del few_strings.strings[max(few_strings.entries.op) :]  # the newest op names are gone
    for damaged in (no_groups, few_strings):
        data = damaged.SerializeToString()
        with pytest.raises(DumpError):
            parse_dump(data, "x")
        assert fast_read(data, "x") is None


def test_member_grids_are_expanded_once_per_distinct_group_by_both_readers(
    job: list[Path],
) -> None:
    # Schema 1.2: the simulated groups are grids; neither reader expands one per rank.
    slow = [DumpView.of(parse_dump(p.read_bytes(), p)) for p in job[:3]]
    fast = [read_compact(p.read_bytes(), str(p)) for p in job[:3]]
    for views in (slow, [v for v in fast if v is not None]):
        assert len(views) == 3
        world = views[0].groups[0].ranks
        assert all(v.groups[0].ranks is world for v in views)  # one shared copy
        assert list(world) == list(range(512))
    assert fast[0] is not None and slow[0].groups[0].ranks is fast[0].groups[0].ranks


def test_ranks_with_identical_groups_share_one_view_checked_against_their_world_size(
    job: list[Path],
) -> None:
    first, second = (fast_read(p.read_bytes(), str(p)) for p in job[:2])
    assert first is not None and second is not None
    assert first.dump.groups[0] is second.dump.groups[0]  # the world group, read once
    # The same group bytes in a job too small for them: checked again, and declined.
    smaller = parse_dump(job[0].read_bytes(), job[0])
    smaller.header.world_size = 256
    data = smaller.SerializeToString()
    with pytest.raises(DumpError, match="beyond world size"):
        parse_dump(data, "x")
    assert fast_read(data, "x") is None


_VARINTS = st.lists(
    st.one_of(
        st.integers(min_value=0, max_value=127),
        st.integers(min_value=0, max_value=(1 << 64) - 1),
        st.integers(min_value=-(1 << 63), max_value=-1).map(lambda v: v + (1 << 64)),
    ),
    max_size=40,
).map(lambda vs: b"".join(_varint(v) for v in vs))


# Comparing the two loops on arbitrary bytes: the same examples every run (the ``loops``
# fixture does not change between them).
_ALIKE = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_ALIKE
@given(payload=st.one_of(st.binary(max_size=60), _VARINTS), cut=st.integers(0, 3))
def test_the_c_loops_return_what_the_python_loops_return(
    loops: str, payload: bytes, cut: int
) -> None:
    if loops == "python":
        return  # (compares the two; runs once)
    assert C_LOOPS is not None
    # walk: the same fields, or both refuse.
    for buf in (payload, _field(3, payload) + payload[: len(payload) - cut]):
        try:
            want: object = wire._walk_fields_py(buf, 0, len(buf))
        except ValueError:
            want = ValueError
        try:
            got: object = C_LOOPS.walk(buf, 0, len(buf))
        except ValueError:
            got = ValueError
        assert got == want, buf
    # column: where C decodes a column, the Python path (protobuf) decodes it alike.
    huge = {"strings": 1 << 62, "groups": 1 << 62, "stacks": 1 << 62, "tensor_specs": 1 << 62}
    for number, name in enumerate(ENTRY_COLUMNS, 1):
        data = _field(number, payload)
        start = len(data) - len(payload)
        try:
            c = C_LOOPS.column(data, start, len(data), wire._KIND[name])
        except ValueError:
            continue  # declined: the ordinary reader decides
        if c is None:
            continue  # values protobuf would truncate: decoded by the Python path
        python = wire._columns_py(data, {name: [(start, len(data), 0)]}, huge)[name]
        assert (c[0].typecode, list(c[0])) == (python.typecode, list(python)), name
        assert c[1] == max(python, default=0), name


def _both(fn: Callable[[], object]) -> tuple[object, object]:
    """``fn()`` with the reader's loops in C, then in Python (ValueError where one refuses)."""
    results = []
    for loops in (C_LOOPS, None):
        saved, wire._wire = wire._wire, loops
        try:
            results.append(fn())
        except ValueError:
            results.append(ValueError)
        finally:
            wire._wire = saved
    return results[0], results[1]


_TOP = st.sampled_from(
    [wire._ENTRIES, wire._GROUPS, *wire._TABLE_NUMBERS, 1, 2, 3, 9, 200]  # (magic, versions)
)


@_ALIKE
@given(
    fields=st.lists(st.tuples(_TOP, st.binary(max_size=12), st.booleans()), max_size=12),
    junk=st.binary(max_size=3),
)
def test_c_and_python_part_a_dumps_fields_alike(
    loops: str, fields: list[tuple[int, bytes, bool]], junk: bytes
) -> None:
    if loops == "python" or C_LOOPS is None:
        return  # (compares the two; runs once)
    # Length-delimited fields, or varints where ``as_varint`` says so (refused for entries).
    data = b"".join(
        _varint(number << 3) + _varint(len(value)) if as_varint else _field(number, value)
        for number, value, as_varint in fields
    )
    for buf in (data, data + junk):
        c, python = _both(lambda buf=buf: wire.split_dump(buf))
        assert c == python, buf


_COLUMN_VALUES = st.lists(
    st.one_of(st.integers(0, 127), st.integers(0, 70_000), st.integers(0, (1 << 64) - 1)),
    min_size=1,
    max_size=6,
)


@_ALIKE
@given(
    values=st.lists(_COLUMN_VALUES, min_size=len(ENTRY_COLUMNS), max_size=len(ENTRY_COLUMNS)),
    parts=st.integers(1, 2),
    drop=st.integers(-1, len(ENTRY_COLUMNS) - 1),
    bound=st.sampled_from([3, 200, 1 << 40]),
)
def test_c_and_python_decode_entry_columns_alike(
    loops: str, values: list[list[int]], parts: int, drop: int, bound: int
) -> None:
    if loops == "python" or C_LOOPS is None:
        return  # (compares the two; runs once)
    ranges, data = [], b""
    for _ in range(parts):  # (the 1.3 tail layout read whole: two entries fields)
        body = b"".join(
            _field(number, b"".join(_varint(v) for v in column))
            for k, (number, column) in enumerate(zip(wire._NUMBERS, values, strict=True))
            if k != drop  # a missing column: both refuse
        )
        start = len(data) + len(_field(4, body)) - len(body)
        data += _field(4, body)
        ranges.append((start, len(data)))
    sizes = {"strings": bound, "groups": bound, "stacks": bound, "tensor_specs": bound}
    c, python = _both(lambda: wire._columns(data, ranges, sizes))
    if isinstance(c, dict) and isinstance(python, dict):
        assert [(a.typecode, list(a)) for a in c.values()] == [
            (a.typecode, list(a)) for a in python.values()
        ]
    else:
        assert c == python


def test_ranks_with_equal_tables_share_their_lookups_and_others_do_not(job: list[Path]) -> None:
    dumps = [fast_read(p.read_bytes(), str(p)) for p in job[:64]]
    assert all(d is not None for d in dumps)
    by_tables: dict[bytes | None, list[RankDump]] = {}
    for d in dumps:
        assert d is not None
        by_tables.setdefault(d.dump.tables, []).append(d)
    alike = next(ds for ds in by_tables.values() if len(ds) > 1)
    assert alike[0]._frame_cache is alike[1]._frame_cache
    other = next(ds[0] for t, ds in by_tables.items() if t != alike[0].dump.tables)
    assert other._frame_cache is not alike[0]._frame_cache
    # Shared again where a loader worker hands them over, and each still reads its own tables.
    back = [pickle.loads(pickle.dumps(d)) for d in (alike[0], alike[1], other)]
    assert back[0]._stack_cache is back[1]._stack_cache is not back[2]._stack_cache
    for d, b in zip((alike[0], alike[1], other), back, strict=True):
        for i in range(len(d)):
            assert b.record(i) == d.record(i)
    # A dump parsed the ordinary way keeps lookups of its own.
    assert RankDump("x", parse_dump(job[0].read_bytes(), "x"))._frame_cache is not (
        alike[0]._frame_cache
    )
