"""Reading a dump file: magic bytes, schema version, size limit, and validation of every index.

The one parser of flightrec dumps into ``pb.Dump``; ``flightrec.format.wire`` reads the same
bytes straight into the analysis's columnar view (see there for why both exist).
"""

from __future__ import annotations

import os
from pathlib import Path

from google.protobuf.message import DecodeError

from flightrec.errors import CorruptDumpError, NotADumpError, UnsupportedVersionError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import grid_field, grid_problem
from flightrec.format.schema import (
    ENTRY_COLUMNS,
    MAGIC_PREFIX,
    MAX_DUMP_BYTES,
    MAX_WORLD_SIZE,
    SCHEMA_MAJOR,
)


def has_magic(path: str | Path) -> bool:
    """True when the file starts with the flightrec magic bytes (cheap: reads 16 bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC_PREFIX)) == MAGIC_PREFIX
    except OSError:
        return False


def parse_dump(data: bytes, path: str | Path = "<bytes>", tables: bool = True) -> pb.Dump:
    """Parse and validate the bytes of one dump file.

    Args:
        data: the bytes.
        path: the file, for messages.
        tables: check the interned tables too (False: the caller checked identical bytes of
            them before; see ``validate``).

    Raises:
        NotADumpError: the bytes do not start with the flightrec magic.
        UnsupportedVersionError: written by an incompatible schema major version.
        CorruptDumpError: truncated, damaged, or with indices that point nowhere.
    """
    if not data.startswith(MAGIC_PREFIX):
        reason = "empty file" if not data else "not a flightrec dump (no flightrec.dump magic)"
        raise NotADumpError(path, reason)
    dump = pb.Dump()
    try:
        dump.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CorruptDumpError(path, f"truncated or damaged dump ({exc})") from None
    if dump.schema_major != SCHEMA_MAJOR:
        raise UnsupportedVersionError(
            path,
            f"written with dump schema {dump.schema_major}.{dump.schema_minor}; "
            f"this flightrec reads schema {SCHEMA_MAJOR}.x (upgrade torch-flightrec)",
        )
    validate(dump, path, tables)
    return dump


def read_dump(path: str | Path, max_bytes: int = MAX_DUMP_BYTES) -> pb.Dump:
    """Read, parse and validate one dump file.

    Raises:
        DumpError: (a subclass) with one line naming the file and the problem.
    """
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise CorruptDumpError(path, f"{size} bytes is larger than any dump ({max_bytes} max)")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise NotADumpError(path, f"cannot read: {exc.strerror or exc}") from None
    return parse_dump(data, path)


_ALL_BYTES = bytes(range(256))
"""Every byte value: its first ``n`` are those a one-byte index into a table of ``n`` may hold."""

# The largest value an unsigned array of each type code can hold.
_ARRAY_MAX = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF}


def _check_index(path: str | Path, what: str, values: object, bound: int) -> None:
    # Every index field is uint32 in the schema (the parser never yields a negative one), so
    # only the upper bound can be broken: skipped where the column's unsigned array type
    # cannot hold a value that large; for one-byte columns, one C pass deleting the values in
    # range (max() boxes every value: most of a converted dump's check); else one C-speed
    # max() over one C-speed slice.
    code = getattr(values, "typecode", "")
    top = _ARRAY_MAX.get(code)
    if top is not None and top < bound:
        return
    if code == "B":
        out = values.tobytes().translate(None, _ALL_BYTES[:bound])  # type: ignore[attr-defined]
        if out:
            raise CorruptDumpError(path, f"{what} points outside its table (size {bound})")
        return
    seq = values[:]  # type: ignore[index]
    if seq and max(seq) >= bound:
        raise CorruptDumpError(path, f"{what} points outside its table (size {bound})")


def validate(dump: pb.Dump, path: str | Path = "<dump>", tables: bool = True) -> None:
    """Check the internal consistency a reader relies on: equal column lengths, indices in range.

    Args:
        dump: the dump.
        path: its file, for messages.
        tables: check the interned tables (strings, frames, stacks, tensor signatures) and
            what points into them from outside the entries (threads, exceptions). False
            skips that, for a caller that validated identical bytes of those fields before:
            the ranks of one job mostly intern the same tables, and checking them again is
            a tenth of reading a dump's tail.

    Raises:
        CorruptDumpError: naming the first inconsistency found.
    """
    if not dump.strings or dump.strings[0] != "":
        raise CorruptDumpError(path, "string table lacks its empty first entry")
    if not dump.stacks or not dump.tensor_specs:
        raise CorruptDumpError(path, "stack or tensor tables lack their empty first entry")
    e = dump.entries
    # (No entries at all, one C call: the rest of a dump whose columns are read apart.)
    if not isinstance(e, pb.Entries) or e.ByteSize():
        _check_entries(dump, path)
    if tables:
        _check_tables(dump, path)
    for group in dump.groups:
        # (A DumpView's groups, which the native reader validates, hold members, not grids.)
        if isinstance(group, pb.ProcessGroup):
            check_group(group, dump.header.world_size, path)
    if tables:
        _check_stack_owners(dump, path)
    _check_header(dump.header, path)


def _check_entries(dump: pb.Dump, path: str | Path) -> None:
    """Equal column lengths, and every index column within its table."""
    e = dump.entries
    n = len(e.record_id)
    for name in ENTRY_COLUMNS:
        if len(getattr(e, name)) != n:
            raise CorruptDumpError(
                path, f"entry column {name} has {len(getattr(e, name))} values, expected {n}"
            )
    ns = len(dump.strings)
    for col in ("op", "reduce_op", "thread", "device"):
        _check_index(path, f"entry column {col}", getattr(e, col), ns)
    _check_index(path, "entry column group", e.group, len(dump.groups))
    _check_index(path, "entry column stack", e.stack, len(dump.stacks))
    _check_index(path, "entry column inputs", e.inputs, len(dump.tensor_specs))
    _check_index(path, "entry column outputs", e.outputs, len(dump.tensor_specs))


def _check_tables(dump: pb.Dump, path: str | Path) -> None:
    """The interned tables point within each other: frames, stacks, tensor signatures."""
    ns, nf = len(dump.strings), len(dump.frames)
    for frame in dump.frames:
        if frame.file >= ns or frame.name >= ns or frame.code >= ns:
            raise CorruptDumpError(path, "a stack frame names a string outside the table")
    for stack in dump.stacks:
        _check_index(path, "a stack", stack.frames, nf)
    for spec in dump.tensor_specs:
        if len(spec.ndim) != len(spec.dtype) or sum(spec.ndim) != len(spec.dims):
            raise CorruptDumpError(path, "a tensor signature's dims do not add up")
        _check_index(path, "a tensor dtype", spec.dtype, ns)


def _check_stack_owners(dump: pb.Dump, path: str | Path) -> None:
    """Threads and exceptions point at stacks that exist."""
    for thread in dump.threads:
        if thread.stack >= len(dump.stacks):
            raise CorruptDumpError(path, f"thread {thread.name!r} points at a missing stack")
    for exc in getattr(dump, "exceptions", ()):  # (none in a DumpView)
        if exc.stack >= len(dump.stacks):
            raise CorruptDumpError(path, "an exception's traceback points at a missing stack")


def _check_header(h: pb.Header, path: str | Path) -> None:
    """A rank within a world size no job reaches."""
    if h.world_size > MAX_WORLD_SIZE or h.rank >= MAX_WORLD_SIZE:
        raise CorruptDumpError(
            path,
            f"rank {h.rank} of world size {h.world_size} is beyond any job ({MAX_WORLD_SIZE} ranks max)",
        )
    if h.world_size < 0 or h.rank < 0 or (h.world_size and h.rank >= h.world_size):
        raise CorruptDumpError(path, f"rank {h.rank} does not fit world size {h.world_size}")


def check_group(group: pb.ProcessGroup, world_size: int, path: str | Path = "<dump>") -> None:
    """Check what a reader relies on in one process group: its members, listed once.

    Args:
        group: the group as parsed.
        world_size: the job's world size as the dump's header says (0: unknown).
        path: its file, for messages.

    Raises:
        CorruptDumpError: members listed twice, or a grid that cannot be a group's members.
    """
    grid = grid_field(group)
    if grid is None:
        return
    if group.ranks:
        raise CorruptDumpError(
            path, f"group {group.name!r} lists its members twice (list and grid)"
        )
    problem = grid_problem(grid, world_size)
    if problem is not None:
        raise CorruptDumpError(path, f"group {group.name!r}: {problem}")
