"""The in-memory view of one rank's dump that every reader produces: compact, picklable, read like protobuf.

A 16,384-rank job keeps every rank's ring in memory at once, so entry columns become the
narrowest typed arrays that hold them, the world group's member list is shared by all ranks,
and nothing per entry is a Python object. ``DumpView`` reads like ``pb.Dump`` so passes and
renderers written against the schema keep working.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.internal.containers import (
    RepeatedCompositeFieldContainer,
    RepeatedScalarFieldContainer,
)

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.format.schema import ENTRY_COLUMNS


def narrow(values: list[int]) -> array[int]:
    """The smallest array type that holds ``values``: most columns are small interned indices.

    The type follows from the values' bounds (two C-speed passes), not from trying each type
    in turn: a failed attempt costs a pass of its own.
    """
    if not values:
        return array("B")
    lo = min(values)
    hi = max(values)
    if lo >= 0:
        code = "B" if hi < 1 << 8 else "H" if hi < 1 << 16 else "I" if hi < 1 << 32 else "Q"
    elif lo >= -(1 << 7) and hi < 1 << 7:
        code = "b"
    elif lo >= -(1 << 15) and hi < 1 << 15:
        code = "h"
    elif lo >= -(1 << 31) and hi < 1 << 31:
        code = "i"
    else:
        code = "q"
    try:
        return array(code, values)
    except OverflowError:
        raise OverflowError("entry column value does not fit 64 bits") from None


class EntriesView:
    """The ``Entries`` columns of one dump as compact typed arrays (same names as the schema).

    Reads like ``pb.Entries`` (``e.state[i]``, ``len(e.record_id)``) at a fraction of its
    memory: a 16,384-rank job keeps every rank's ring in memory at once.
    """

    __slots__ = ENTRY_COLUMNS

    record_id: array[int]
    group: array[int]
    seq: array[int]
    p2p_seq: array[int]
    op: array[int]
    reduce_op: array[int]
    peer: array[int]
    state: array[int]
    enqueue_ns: array[int]
    start_ns: array[int]
    complete_ns: array[int]
    thread: array[int]
    stack: array[int]
    inputs: array[int]
    outputs: array[int]
    flags: array[int]
    device: array[int]

    def __init__(self, columns: Mapping[str, array[int]]) -> None:
        for name in ENTRY_COLUMNS:
            setattr(self, name, columns[name])

    @classmethod
    def of(cls, entries: pb.Entries) -> EntriesView:
        """Copy a parsed ``Entries`` message into narrow arrays (one C-speed slice each)."""
        return cls({name: narrow(getattr(entries, name)[:]) for name in ENTRY_COLUMNS})

    def columns(self) -> dict[str, array[int]]:
        """Column name -> array."""
        return {name: getattr(self, name) for name in ENTRY_COLUMNS}

    def packed(self) -> tuple[str, int, bytes]:
        """Every column in one bytes object, with their type codes and common length: what a
        loader process hands over (``unpack``). Pickled as 17 arrays, a rank took 68 us of a
        loader process's CPU, as one bytes object 37 us (16,384-rank job)."""
        arrays = [getattr(self, name) for name in ENTRY_COLUMNS]
        return "".join(a.typecode for a in arrays), len(arrays[0]), b"".join(arrays)

    @classmethod
    def unpack(cls, codes: str, length: int, data: bytes) -> EntriesView:
        """The view ``packed`` describes (on the machine that packed it: native byte order).

        Making the 17 arrays is most of its cost (about 10 us); done in C it saves a tenth.
        """
        if len(codes) != len(ENTRY_COLUMNS):
            raise ValueError("packed entry columns: one type code per column expected")
        view = cls.__new__(cls)
        arrays = _unpack(codes, length, data)
        for name, column in zip(ENTRY_COLUMNS, arrays, strict=True):
            setattr(view, name, column)
        return view


def _unpack(codes: str, length: int, data: bytes) -> list[array[int]]:
    """The arrays of packed columns (``EntriesView.packed``)."""
    whole = memoryview(data)
    out: list[array[int]] = []
    start = 0
    for code in codes:
        column = array(code)
        end = start + column.itemsize * length
        column.frombytes(whole[start:end])
        out.append(column)
        start = end
    if start != len(data):
        raise ValueError("packed entry columns: their types and length do not match")
    return out


class PeerView(NamedTuple):
    """Per-peer P2P counters of a group (as ``pb.PeerCounter``)."""

    peer: int
    sends: int
    recvs: int


# Every rank's dump lists the members of its groups; the world group alone is 16,384 ranks
# long at 16,384 ranks. One shared tuple per distinct member list keeps that O(world), not
# O(world^2), and makes comparing two ranks' lists an identity check most of the time.
# Small lists stay private lists (copying them costs nothing, and they stay editable).
# A ``range`` member list (see ``flightrec.format.wire``) maps to the same shared tuple in O(1), and a
# shared tuple pickles as its range again: 44 bytes instead of 16,384 numbers per rank.
_MEMBER_LISTS: dict[tuple[int, ...], tuple[int, ...]] = {}
_RANGES: dict[range, tuple[int, ...]] = {}
_RANGE_OF: dict[int, range] = {}
_SHARED: dict[int, tuple[int, ...]] = {}
_SHARE_FROM = 256


def intern_ranks(ranks: Sequence[int]) -> Sequence[int]:
    """The shared copy of a long member list; a short one as a list of its own."""
    if len(ranks) < _SHARE_FROM:
        return list(ranks)
    if isinstance(ranks, tuple) and _SHARED.get(id(ranks)) is ranks:
        return ranks  # already the shared copy: no need to hash 16,384 numbers again
    if isinstance(ranks, range):
        shared = _RANGES.get(ranks)
        if shared is None:
            t = tuple(ranks)
            shared = _RANGES[ranks] = _share(t)
            _RANGE_OF[id(shared)] = ranks
        return shared
    return _share(tuple(ranks))


def _share(t: tuple[int, ...]) -> tuple[int, ...]:
    shared = _MEMBER_LISTS.setdefault(t, t)
    _SHARED[id(shared)] = shared  # shared tuples live as long as the process: ids stay valid
    return shared


def _compact(ranks: Sequence[int]) -> Sequence[int]:
    """What to pickle for a member list: a shared one as its range when it is one."""
    if _SHARED.get(id(ranks)) is not ranks:
        return ranks
    found = _RANGE_OF.get(id(ranks))
    if found is None:
        compact = compact_members(ranks)
        if not isinstance(compact, range):
            return ranks
        found = _RANGE_OF[id(ranks)] = compact
    return found


def compact_members(ranks: Sequence[int]) -> Sequence[int]:
    """A member list as a ``range`` when it is an arithmetic progression, else a tuple."""
    if len(ranks) >= 2:
        step = ranks[1] - ranks[0]
        if step:
            span = range(ranks[0], ranks[-1] + (1 if step > 0 else -1), step)
            if len(span) == len(ranks) and tuple(span) == tuple(ranks):
                return span
    return tuple(ranks)


@dataclass(frozen=True, slots=True)
class GroupView:
    """A process group as one dump lists it; reads like ``pb.ProcessGroup``."""

    name: str
    desc: str
    ranks: Sequence[int]
    """Global ranks in group-rank order (long lists shared; see ``intern_ranks``)."""
    backend: str
    last_seq: int
    dropped: int
    p2p: tuple[PeerView, ...]
    members_known: bool

    @classmethod
    def of(cls, g: pb.ProcessGroup, members: Sequence[int] | None = None) -> GroupView:
        """Copy a parsed group, sharing its member list with identical ones.

        Args:
            g: the group as parsed.
            members: its member list when the caller already has it (as a range or tuple);
                else it is copied out of ``g``.
        """
        return cls(
            g.name,
            g.desc,
            intern_ranks(members_of(g) if members is None else members),
            g.backend,
            g.last_seq,
            g.dropped,
            tuple(PeerView(pc.peer, pc.sends, pc.recvs) for pc in g.p2p),
            g.members_known,
        )

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Unpickled member lists are shared again in the receiving process.
        return (
            _group_view,
            (
                self.name,
                self.desc,
                _compact(self.ranks),
                self.backend,
                self.last_seq,
                self.dropped,
                self.p2p,
                self.members_known,
            ),
        )


def _group_view(
    name: str,
    desc: str,
    ranks: Sequence[int],
    backend: str,
    last_seq: int,
    dropped: int,
    p2p: tuple[PeerView, ...],
    members_known: bool,
) -> GroupView:
    return GroupView(
        name, desc, intern_ranks(ranks), backend, last_seq, dropped, p2p, members_known
    )


class DumpView:
    """A parsed dump with its entries held as ``EntriesView``; reads like ``pb.Dump``.

    Attributes:
        meta: the dump without its entries and groups (header, interned tables, threads).
        groups: the process groups, in local index order.
        entries: the entry columns: the whole ring, or its newest part (``older`` > 0).
        older: entries of the file's ring before ``entries`` (0: the view holds them all).
            A view of a 1.3 file's tail section leaves those out until the loader reads deeper.
        tables: the bytes of the interned tables as the file held them, where the reader
            kept them: equal bytes mean equal tables, so what is derived from them (a
            signature, a check) can be reused across the ranks read by one process. Never
            pickled (None after).
    """

    __slots__ = ("entries", "groups", "meta", "older", "tables")

    def __init__(
        self,
        meta: pb.Dump,
        groups: tuple[GroupView, ...],
        entries: EntriesView,
        older: int = 0,
    ) -> None:
        self.meta = meta
        self.groups = groups
        self.entries = entries
        self.older = older
        self.tables: bytes | None = None

    @classmethod
    def of(cls, dump: pb.Dump) -> DumpView:
        """The view of a parsed dump (its entries copied into narrow arrays)."""
        groups = tuple(GroupView.of(g) for g in dump.groups)
        return cls(meta_of(dump), groups, EntriesView.of(dump.entries))

    @property
    def header(self) -> pb.Header:
        """The dump header."""
        return self.meta.header

    @property
    def strings(self) -> RepeatedScalarFieldContainer[str]:
        """Interned strings."""
        return self.meta.strings

    @property
    def frames(self) -> RepeatedCompositeFieldContainer[pb.Frame]:
        """Interned frames."""
        return self.meta.frames

    @property
    def stacks(self) -> RepeatedCompositeFieldContainer[pb.Stack]:
        """Interned stacks."""
        return self.meta.stacks

    @property
    def tensor_specs(self) -> RepeatedCompositeFieldContainer[pb.TensorSpec]:
        """Interned tensor signatures."""
        return self.meta.tensor_specs

    @property
    def threads(self) -> RepeatedCompositeFieldContainer[pb.ThreadState]:
        """Every thread's stack at dump time."""
        return self.meta.threads


def meta_of(dump: pb.Dump) -> pb.Dump:
    """Everything of ``dump`` but its entries and groups (copied field by field)."""
    meta = pb.Dump(magic=dump.magic, schema_major=dump.schema_major, schema_minor=dump.schema_minor)
    meta.header.CopyFrom(dump.header)
    meta.strings.extend(dump.strings)
    meta.frames.extend(dump.frames)
    meta.stacks.extend(dump.stacks)
    meta.tensor_specs.extend(dump.tensor_specs)
    meta.threads.extend(dump.threads)
    meta.exceptions.extend(dump.exceptions)
    return meta
