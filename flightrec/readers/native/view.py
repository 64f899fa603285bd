"""Native dumps straight into the analyzer's compact in-memory form.

The second output of the one native reader, kept because it pays. ``read_native`` produces a
``pb.Dump`` (what ``flightrec convert`` writes and ``flightrec show`` prints); the analyzer
does not need one: ``DumpView.of`` would copy every entry column out of the protobuf again
into narrow arrays. That round trip (filling 17 protobuf columns, validating them, slicing
them back out) is skipped here: the converted columns become the arrays directly, and the
tables and header, small, stay protobuf. Parsing and conversion (``load_native``,
``convert_columns``) are shared; the result reads like the ``pb.Dump`` ``read_native``
returns for the same file.

What it saves, measured (CPU per file, serial, both outputs interleaved on the same files,
the folder's job already built): ``bench_vs_fr_trace.py``'s input (tp=8, one stalled rank)
at 1,024 ranks x 2,000 entries, 10.99 ms per file here against 14.56 ms through
``read_any`` and ``DumpView.of``, 1.32x (256 ranks: 10.56 against 14.06 ms); about 3.6 s of
CPU per 1,024-rank analysis, whose load is most of its time. Reproduce: ``python
benchmarks/bench_vs_fr_trace.py --ranks 1024 --readers``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.read import validate
from flightrec.format.schema import ENTRY_COLUMNS
from flightrec.format.view import DumpView, EntriesView, GroupView, narrow
from flightrec.readers.native import job_of_file, load_native
from flightrec.readers.native.convert import convert_columns

# Wall-clock nanoseconds need 64 bits whatever their values: no narrowing pass.
_CLOCKS = frozenset({"enqueue_ns", "start_ns", "complete_ns"})


def _clock(column: Sequence[int]) -> array[int]:
    return column if isinstance(column, array) and column.typecode == "q" else array("q", column)


def _indices(bound: int, column: Sequence[int]) -> array[int]:
    """``column`` (values below ``bound``) in the narrowest unsigned array type."""
    if bound <= 1 << 8:
        return array("B", bytes(column))  # bytes() packs a list at C speed; array() per item
    return array("H" if bound <= 1 << 16 else "I", column)


def read_native_view(path: str | Path) -> DumpView:
    """Read one native dump file into the analyzer's compact form.

    Group membership the file lacks is rebuilt as ``read_native`` does (from the file
    alone when it lists its groups, else from the native dumps beside it).

    Args:
        path: a native dump file.

    Returns:
        The dump, checked like a flightrec file (``flightrec.format.read.validate``).

    Raises:
        DumpError: (a subclass) naming the file, when it cannot be read; for
            ``UnsafeDumpError`` nothing from the file was executed.
    """
    own = load_native(path)
    b, columns = convert_columns(own, job_of_file(Path(path), own))
    meta = b.build()  # header, tables and groups: the entries stay in ``columns``
    groups = tuple(GroupView.of(g) for g in meta.groups)
    meta.ClearField("groups")
    meta.ClearField("entries")
    # Index columns point into tables of known size, so their array type follows from the
    # size with no pass over the values (an index beyond its table still fails validate).
    bounds = {
        "group": len(groups),
        "op": len(meta.strings),
        "reduce_op": len(meta.strings),
        "thread": len(meta.strings),
        "device": len(meta.strings),
        "stack": len(meta.stacks),
        "inputs": len(meta.tensor_specs),
        "outputs": len(meta.tensor_specs),
        "state": max(pb.State.values()) + 1,
        "flags": max(pb.EntryFlag.values()) * 2,
    }
    entries = EntriesView(
        {
            name: _indices(bounds[name], columns[name])
            if name in bounds
            else _clock(columns[name])
            if name in _CLOCKS
            else narrow(list(columns[name]))
            for name in ENTRY_COLUMNS
        }
    )
    view = DumpView(meta, groups, entries)
    validate(view, path)  # type: ignore[arg-type]  # reads like pb.Dump
    return view
