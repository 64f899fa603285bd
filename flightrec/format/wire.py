"""Read a flightrec dump file straight into the compact in-memory form, at scale.

The second reader of flightrec dumps, kept because it pays: ``flightrec.format.read``
parses a file into ``pb.Dump`` and ``DumpView.of`` then copies every column out of it value
by value. This reader walks the file's top-level wire format instead (a few dozen fields), and:

* takes the entry columns whose values are all below 128 (interned indices, states, flags:
  most of them) directly from their packed bytes, which then *are* a one-byte array;
  only the other columns go through the protobuf parser;
* takes a group's members from its ``RankGrid`` (schema 1.2: a few bytes, read as a
  ``range``) where it has one, and keys an explicit member list (older dumps, irregular
  groups) by its packed bytes, so a list seen before (a 1.1 world group, in every file) is
  shared, never decoded again, and an arithmetic one is held as a ``range``;
* reads each group on its own, checked by ``flightrec.format.read.check_group``, and shares
  the view of a group whose bytes it has seen before (``_group``);
* has the rest of the dump (header, tables, threads) parsed and validated by
  ``flightrec.format.read.parse_dump``, the one validator, and checks the entry columns as it does.

What it saves, measured (CPU per file, serial, both readers interleaved on the same files):
1,024 simulated ranks x 2,000 entries (tp=8, pp=8): 1.17 ms per file here against 3.50 ms
for ``DumpView.of(read_dump(path))``, 3.0x; the load is most of ``flightrec analyze``'s time
at scale. Reproduce: ``python benchmarks/bench_scale.py --ranks 1024 --layout tp=8,pp=8
--simulate-only --readers``.

Its loops (walking a message's fields, parting a dump's top-level fields, decoding the
packed entry columns) run in C where the optional extension ``flightrec.format._wire`` is
built (``pip install`` builds it), with the same results as the Python loops here
(tests/unit/test_columns_fastread.py runs every test both ways and compares the two on
arbitrary bytes). Reading a 2,000-entry ring's tail (``tail.read_tail``, 16,384-rank job)
takes 0.19 ms of CPU with them against 0.40 ms without.

Anything unusual (damage, unpacked or split columns, a file written by a future schema)
returns None and the caller reads the file the ordinary way, which reports damage precisely.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from flightrec.errors import DumpError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.format.read import check_group, parse_dump
from flightrec.format.schema import ENTRY_COLUMNS, MAGIC_PREFIX
from flightrec.format.view import (
    DumpView,
    EntriesView,
    GroupView,
    compact_members,
    intern_ranks,
    narrow,
)

try:
    from flightrec.format import _wire
except ImportError:  # not built (no compiler): the Python loops below, same results
    _wire = None  # type: ignore[assignment]

_GROUPS = pb.Dump.DESCRIPTOR.fields_by_name["groups"].number
_ENTRIES = pb.Dump.DESCRIPTOR.fields_by_name["entries"].number
_RANKS = pb.ProcessGroup.DESCRIPTOR.fields_by_name["ranks"].number
_COLUMN_OF = {f.number: f.name for f in pb.Entries.DESCRIPTOR.fields}
_ZIGZAG = {f.name for f in pb.Entries.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_SINT32}
# Index columns and the table each one points into (as ``flightrec.format.read.validate`` checks them).
_BOUNDED = {
    "op": "strings",
    "reduce_op": "strings",
    "thread": "strings",
    "device": "strings",
    "group": "groups",
    "stack": "stacks",
    "inputs": "tensor_specs",
    "outputs": "tensor_specs",
}
_LOW7 = bytes(range(128))
_BELOW = [bytes(range(bound)) for bound in range(128)]
_WIDE = {f.name for f in pb.Entries.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_INT64}
# Each column's kind as ``_wire.column`` takes it (the order of its enum).
_KIND = {
    f.name: (
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_ENUM,
    ).index(f.type)
    for f in pb.Entries.DESCRIPTOR.fields
}
# The entry columns' field numbers and kinds, in ``ENTRY_COLUMNS`` order (``_wire.columns``).
_NUMBERS = tuple(pb.Entries.DESCRIPTOR.fields_by_name[name].number for name in ENTRY_COLUMNS)
_KINDS = tuple(_KIND[name] for name in ENTRY_COLUMNS)
# One-byte zigzag values (sint32 below 64 in magnitude) to their two's-complement byte.
_UNZIGZAG = bytes(((z >> 1) ^ -(z & 1)) & 0xFF for z in range(128)) + bytes(128)
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5

# Member lists by their packed bytes, per process (loader workers each keep their own).
_MEMBERS_BY_BYTES: dict[bytes, Sequence[int]] = {}
# The interned tables and what points into them (strings, frames, stacks, tensor signatures,
# threads, exceptions), as bytes; a dump whose tables are bytes seen before needs only the
# checks that depend on the rest. Per process, bounded: one job has a handful of variants.
_TABLE_FIELDS = frozenset(
    pb.Dump.DESCRIPTOR.fields_by_name[name].number
    for name in ("strings", "frames", "stacks", "tensor_specs", "threads", "exceptions")
)
_CHECKED_TABLES: set[bytes] = set()
_MAX_CHECKED = 4096
# Fields read apart from the rest of the dump: the entry columns and the groups.
_APART = frozenset({_ENTRIES, _GROUPS})
# Group views by (world size, the group's bytes), per process (see ``_group``).
_GROUP_VIEWS: dict[tuple[int, bytes], GroupView] = {}
_MAX_GROUP_VIEWS = 1 << 14


class _Odd(ValueError):
    """The bytes are not in the layout this reader handles; read the file the ordinary way."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    value, shift = b & 0x7F, 7
    while True:
        i += 1
        b = buf[i]
        if shift == 63 and b & 0x7F > 1:
            raise _Odd  # beyond 64 bits
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
        if shift > 63:
            raise _Odd


def _walk_fields_py(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """``walk_fields`` in Python (``_wire.walk`` in C returns the same)."""
    out: list[tuple[int, int, int, int, int]] = []
    i = start
    if start < 0 or end > len(buf) or start > end:
        raise _Odd
    try:
        while i < end:
            at = i
            tag = buf[i]  # one-byte tags and lengths (nearly all of them) without a call
            i += 1
            if tag >= 0x80:
                tag, i = _varint(buf, at)
            wire = tag & 7
            if wire == _WIRE_LEN:
                size = buf[i]
                i += 1
                if size >= 0x80:
                    size, i = _varint(buf, i - 1)
                j = i + size
            elif wire == _WIRE_VARINT:
                _, j = _varint(buf, i)
            elif wire in (_WIRE_I64, _WIRE_I32):
                j = i + (8 if wire == _WIRE_I64 else 4)
            else:
                raise _Odd
            if j > end:
                raise _Odd
            out.append((tag >> 3, wire, i, j, at))
            i = j
    except IndexError:
        raise _Odd from None
    return out


def walk_fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """(field number, wire type, start, end, tag start) of each field in ``buf[start:end]``.

    Raises ``ValueError`` (its subclass ``_Odd`` in Python) for bytes that are not a plain
    message: an unknown wire type, a varint beyond 64 bits, a field that runs past ``end``.

    ``start``/``end`` delimit the value's bytes (for length-delimited fields, its payload);
    the field's encoding as a whole is ``buf[tag start:end]``. In C where ``_wire`` is built.
    """
    if _wire is not None:
        return _wire.walk(buf, start, end)
    return _walk_fields_py(buf, start, end)


_TABLE_NUMBERS = tuple(sorted(_TABLE_FIELDS))


def _split_py(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bytes, bytes]:
    """``split_dump`` in Python (``_wire.split`` in C returns the same)."""
    top = _walk_fields_py(data, 0, len(data))
    if any(wire != _WIRE_LEN for n, wire, *_ in top if n in _APART):
        raise _Odd
    entries = [(a, b) for number, _, a, b, _ in top if number == _ENTRIES]
    groups = [(a, b) for number, _, a, b, _ in top if number == _GROUPS]
    rest = b"".join(data[at:b] for number, _, _, b, at in top if number not in _APART)
    tables = b"".join(data[at:b] for number, _, _, b, at in top if number in _TABLE_FIELDS)
    return entries, groups, rest, tables


def split_dump(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bytes, bytes]:
    """A dump's top-level fields, parted: the value bounds of each ``entries`` and ``groups``
    field, every other field's encoding joined in order (the rest of the dump), and the
    interned tables' encodings joined (the key under which their check is remembered).

    Raises ``ValueError`` for bytes that are not a plain message, or whose entries or groups
    are not length-delimited. In C where ``_wire`` is built.
    """
    if _wire is not None:
        return _wire.split(data, _ENTRIES, _GROUPS, _TABLE_NUMBERS)
    return _split_py(data)


def _count_varints(chunk: bytes) -> int:
    """Values in a packed varint field: bytes without the continuation bit."""
    return len(chunk) - len(chunk.translate(None, _LOW7))


def _columns(
    data: bytes, ranges: list[tuple[int, int]], sizes: dict[str, int]
) -> dict[str, array[int]]:
    """The entry columns of the ``entries`` fields at ``ranges`` (one, or two in the 1.3 tail
    layout, whose packed columns concatenate, oldest first); ``sizes``: the length of each
    table an index column points into."""
    if _wire is not None:
        got = _wire.columns(data, ranges, _NUMBERS, _KINDS, _bounds(sizes))
        if None not in got:  # (the C loop checked that every column has as many values)
            return dict(zip(ENTRY_COLUMNS, got, strict=True))  # type: ignore[arg-type]
        columns = {
            name: col for name, col in zip(ENTRY_COLUMNS, got, strict=True) if col is not None
        }
        left = [name for name in ENTRY_COLUMNS if name not in columns]
        # Values protobuf would truncate: decoded as it does.
        columns.update(_columns_py(data, _spans(data, ranges, left), sizes))
    else:
        columns = _columns_py(data, _spans(data, ranges, ENTRY_COLUMNS), sizes)
    n = len(columns[ENTRY_COLUMNS[0]])
    if any(len(col) != n for col in columns.values()):
        raise _Odd
    return {name: columns[name] for name in ENTRY_COLUMNS}


_BOUNDS: dict[tuple[tuple[str, int], ...], tuple[int, ...]] = {}


def _bounds(sizes: dict[str, int]) -> tuple[int, ...]:
    """Per entry column (``ENTRY_COLUMNS`` order), the size of the table it indexes, or -1."""
    key = tuple(sizes.items())
    found = _BOUNDS.get(key)
    if found is None:
        found = tuple(sizes[_BOUNDED[name]] if name in _BOUNDED else -1 for name in ENTRY_COLUMNS)
        if len(_BOUNDS) < 4096:
            _BOUNDS[key] = found
    return found


def _spans(
    data: bytes, ranges: list[tuple[int, int]], wanted: Sequence[str]
) -> dict[str, list[tuple[int, int, int]]]:
    """Value bounds and tag start of each part of the columns named ``wanted``, each range
    holding every column once, length-delimited."""
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for start, end in ranges:
        seen: set[str] = set()
        for number, wire, a, b, at in walk_fields(data, start, end):
            name = _COLUMN_OF.get(number)
            if name is None or wire != _WIRE_LEN or name in seen:
                raise _Odd  # an unknown, unpacked or split column
            seen.add(name)
            spans.setdefault(name, []).append((a, b, at))
        if len(seen) != len(ENTRY_COLUMNS):
            raise _Odd  # an empty column (no entries, or damage): the ordinary reader decides
    return {name: spans[name] for name in wanted}


def _packed(data: bytes, parts: list[tuple[int, int, int]]) -> tuple[bytes, int, int]:
    """A column's packed values as (buffer, start, end): in ``data`` itself when the column is
    one field, else its fields' values joined (the 1.3 tail layout read whole)."""
    if len(parts) == 1:
        return data, parts[0][0], parts[0][1]
    joined = b"".join(data[a:b] for a, b, _ in parts)
    return joined, 0, len(joined)


def _columns_py(
    data: bytes, spans: dict[str, list[tuple[int, int, int]]], sizes: dict[str, int]
) -> dict[str, array[int]]:
    """The columns named in ``spans`` (value bytes and tag start of each part) in Python: at C
    speed over bytes where every value is below 128, through the protobuf parser otherwise."""
    chunks = {}
    for name, parts in spans.items():
        buf, a, b = _packed(data, parts)
        chunks[name] = buf[a:b]
    # Packed bytes all below 128 (``isascii``, one C pass) are one value each: most columns.
    counts = {
        name: len(chunk) if chunk.isascii() else _count_varints(chunk)
        for name, chunk in chunks.items()
    }
    # The columns with a value of 128 or more, parsed together (and only those) at C speed.
    wide = [name for name, chunk in chunks.items() if counts[name] != len(chunk)]
    parsed = pb.Entries.FromString(
        b"".join(data[at:b] for name in wide for _, b, at in spans[name])
    )
    columns: dict[str, array[int]] = {}
    for name, chunk in chunks.items():
        table = _BOUNDED.get(name)
        bound = sizes[table] if table is not None else None
        if counts[name] == len(chunk):  # every value below 128: the packed bytes are the values
            if bound is not None and bound < 128 and chunk.translate(None, _BELOW[bound]):
                raise _Odd  # an index beyond its table (C speed: drop the valid values)
            if name in _ZIGZAG:
                columns[name] = array("b", chunk.translate(_UNZIGZAG))
            else:
                columns[name] = array("B", chunk)
            continue
        values = getattr(parsed, name)[:]
        if name in _WIDE:  # clock readings: 64 bits whatever their bounds
            columns[name] = array("q", values)
            continue
        if bound is not None and max(values, default=0) >= bound:
            raise _Odd
        columns[name] = _fit(values, name in _ZIGZAG)
    return columns


def _fit(values: list[int], signed: bool) -> array[int]:
    """Values of which some are 128 or more, in two bytes each when they fit, else wider.

    Tried in order: a failed try stops at the first value out of range, and the first try
    fits most of these columns (seqs, record ids, peers of jobs below 32,768 ranks).
    """
    for code in ("h", "i", "q") if signed else ("H", "I", "Q"):
        try:
            return array(code, values)
        except OverflowError:
            continue
    return narrow(values)  # (raises OverflowError: beyond 64 bits)


def _members(data: bytes, start: int, end: int, group: pb.ProcessGroup) -> Sequence[int]:
    if group.HasField("rank_grid"):  # (validated) O(1) bytes: a range, or expanded once per grid
        return intern_ranks(members_of(group))
    key: bytes | None = None
    for number, wire, a, b, _ in walk_fields(data, start, end):
        if number == _RANKS:
            if key is not None or wire != _WIRE_LEN:
                raise _Odd
            key = data[a:b]
    key = key or b""
    members = _MEMBERS_BY_BYTES.get(key)
    if members is None:
        members = intern_ranks(compact_members(group.ranks[:]))
        _MEMBERS_BY_BYTES[key] = members
    return members


def read_compact(data: bytes, path: str, older: int = 0) -> DumpView | None:
    """The dump in ``data`` as a compact ``DumpView``; None when the ordinary reader must decide.

    Args:
        data: the whole file, or the bytes of a 1.3 file's tail section behind its head
            (``flightrec.format.tail``).
        path: its path, for messages.
        older: entries of the file that ``data`` leaves out (before its first).

    Returns:
        The dump, or None for bytes that are not a plainly laid out flightrec dump (damaged,
        another format, unpacked columns): ``read_any`` then reads or refuses them.
    """
    if not data.startswith(MAGIC_PREFIX):
        return None
    try:
        entries, groups, rest, tables = split_dump(data)
        if not entries:
            raise _Odd
        # The dump without its entries and groups (``rest``) is parsed and validated by the
        # one validator.
        try:
            dump = parse_dump(rest, path, tables=tables not in _CHECKED_TABLES)
            views = tuple(_group(data, a, b, dump.header.world_size, path) for a, b in groups)
        except DumpError:
            raise _Odd from None
        if len(_CHECKED_TABLES) < _MAX_CHECKED:
            _CHECKED_TABLES.add(tables)
        sizes = {
            "strings": len(dump.strings),
            "groups": len(views),
            "stacks": len(dump.stacks),
            "tensor_specs": len(dump.tensor_specs),
        }
        columns = _columns(data, entries, sizes)
    except (_Odd, ValueError, OverflowError, DecodeError):
        # DecodeError: damaged entries or groups.
        return None
    # Layout, not content (as ``view.meta_of`` leaves them out).
    for name in ("tail_start", "older_entries"):
        dump.ClearField(name)  # type: ignore[arg-type]
    view = DumpView(dump, views, EntriesView(columns), older)
    view.tables = tables
    return view


def _group(data: bytes, start: int, end: int, world_size: int, path: str) -> GroupView:
    """The view of the group whose bytes are ``data[start:end]``, checked as ``validate`` does.

    Ranks share their groups (each world group, and a tensor-parallel group with each of its
    members): a group seen before with the same bytes and world size is the same view,
    which is immutable. That skips parsing it, checking its grid and building its view again,
    and the loader's workers pickle a shared view once per batch.
    """
    key = (world_size, data[start:end])
    view = _GROUP_VIEWS.get(key)
    if view is None:
        g = pb.ProcessGroup.FromString(key[1])
        check_group(g, world_size, path)
        view = GroupView.of(g, _members(data, start, end, g))
        if len(_GROUP_VIEWS) >= _MAX_GROUP_VIEWS:
            _GROUP_VIEWS.clear()  # (a new job, or a huge one: start again)
        _GROUP_VIEWS[key] = view
    return view
