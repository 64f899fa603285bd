"""How one rank's dump is held in memory during analysis: compact, picklable, read like protobuf.

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

from flightrec.dumpfile import ENTRY_COLUMNS
from flightrec.proto import flightrec_pb2 as pb

_NARROW_CODES = ("B", "H", "b", "h", "I", "i", "q", "Q")


def _narrow(values: list[int]) -> array[int]:
    """The smallest array type that holds ``values``: most columns are small interned indices.

    Each attempt is one C-speed pass that stops at the first value out of range, which for a
    column of clock readings is its first value; no Python-level min/max pass is needed.
    """
    for code in _NARROW_CODES:
        try:
            return array(code, values)
        except OverflowError:
            continue
    raise OverflowError("entry column value does not fit 64 bits")


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
        return cls({name: _narrow(getattr(entries, name)[:]) for name in ENTRY_COLUMNS})

    def columns(self) -> dict[str, array[int]]:
        """Column name -> array."""
        return {name: getattr(self, name) for name in ENTRY_COLUMNS}


class PeerView(NamedTuple):
    """Per-peer P2P counters of a group (as ``pb.PeerCounter``)."""

    peer: int
    sends: int
    recvs: int


# Every rank's dump lists the members of its groups; the world group alone is 16,384 ranks
# long at 16,384 ranks. One shared tuple per distinct member list keeps that O(world), not
# O(world^2), and makes comparing two ranks' lists an identity check most of the time.
# Small lists stay private lists (copying them costs nothing, and they stay editable).
_MEMBER_LISTS: dict[tuple[int, ...], tuple[int, ...]] = {}
_SHARE_FROM = 256


def intern_ranks(ranks: Sequence[int]) -> Sequence[int]:
    """The shared copy of a long member list; a short one as a list of its own."""
    if len(ranks) < _SHARE_FROM:
        return list(ranks)
    t = tuple(ranks)
    return _MEMBER_LISTS.setdefault(t, t)


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
    def of(cls, g: pb.ProcessGroup) -> GroupView:
        """Copy a parsed group, sharing its member list with identical ones."""
        return cls(
            g.name,
            g.desc,
            intern_ranks(g.ranks[:]),
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
                self.ranks,
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
        entries: the entry columns.
    """

    __slots__ = ("entries", "groups", "meta")

    def __init__(self, meta: pb.Dump, groups: tuple[GroupView, ...], entries: EntriesView) -> None:
        self.meta = meta
        self.groups = groups
        self.entries = entries

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
    return meta
