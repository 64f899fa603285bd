"""Build a ``flightrec.v1.Dump`` column by column, interning what repeats.

Every producer of dumps goes through ``DumpBuilder``: the recorder at dump time, the native
dump converter, ``flightrec simulate``, and the test factories. Callers hand over plain Python
values; the builder interns strings, frames, stacks and tensor signatures and fills the packed
columns in one pass at ``build()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import set_members
from flightrec.format.schema import new_dump

# Entries.flags bits, mirrored from the EntryFlag enum for use without the protobuf types.
ASYNC_OP = pb.ASYNC_OP
OBJECT_API = pb.OBJECT_API
COALESCED = pb.COALESCED
IS_P2P = pb.IS_P2P
SEND = pb.SEND
DDP_BUCKET = pb.DDP_BUCKET

FrameTuple = tuple[str, str, int]
"""(file, function, line)"""
TensorTuple = tuple[tuple[int, ...], str]
"""(shape, dtype name)"""


@dataclass(frozen=True, slots=True)
class EntryValues:
    """One ring entry in plain Python values, before interning. Times are monotonic ns."""

    record_id: int
    group: int
    op: str
    seq: int = 0
    p2p_seq: int = 0
    reduce_op: str = ""
    peer: int = -1
    state: int = pb.ENQUEUED
    enqueue_ns: int = 0
    start_ns: int = 0
    complete_ns: int = 0
    thread: str = ""
    stack: Sequence[FrameTuple] = ()
    inputs: Sequence[TensorTuple] = ()
    outputs: Sequence[TensorTuple] = ()
    flags: int = 0
    device: str = ""


MAX_SOURCE_CHARS = 200
"""Longest source line kept in a dump; longer ones are cut (a generated or minified line)."""

SourceReader = Callable[[str, int], str]
"""(file, line) -> that line of source, stripped; "" when it cannot be read."""

OriginReader = Callable[[str, int], int]
"""(file, line) -> the frame's ``FrameOrigin``; 0 when not known."""


class DumpBuilder:
    """Accumulates one dump. Not thread-safe: build each dump in one thread.

    Args:
        source: reads the source line of each new frame into the dump (the recorder passes
            one: the analysis usually runs on another machine, or after the code changed, so
            the line must come from the files the job ran). None leaves frames without it.
        origin: says whose code each new frame is (``flightrec.frames.origin_of`` in the
            recorder: only the process that ran the code knows its prefixes and working
            tree). None leaves the origin unknown, to be judged by whoever reads the dump.
    """

    def __init__(
        self, source: SourceReader | None = None, origin: OriginReader | None = None
    ) -> None:
        self._source = source
        self._origin = origin
        self._dump = new_dump()
        self._strings: dict[str, int] = {"": 0}
        self._frames: dict[tuple[int, int, int], int] = {}
        self._stacks: dict[tuple[int, ...], int] = {(): 0}
        self._specs: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], int] = {
            ((), (), ()): 0
        }
        # Entries repeat a handful of call sites and tensor signatures: remember the index of
        # each distinct raw value so it is interned once, not once per entry.
        self._raw_stacks: dict[tuple[FrameTuple, ...], int] = {(): 0}
        self._raw_specs: dict[tuple[TensorTuple, ...], int] = {(): 0}
        self._cols: dict[str, list[int]] = {
            field.name: [] for field in pb.Entries.DESCRIPTOR.fields
        }

    def fork(self) -> DumpBuilder:
        """An independent copy of this builder as it stands: tables, groups, entries so far.

        For producers of many similar dumps (the simulator interns a step program's strings,
        stacks and tensor signatures once, then forks that builder for every rank).
        """
        other = DumpBuilder.__new__(DumpBuilder)
        other._source = self._source
        other._origin = self._origin
        other._dump = pb.Dump()
        other._dump.CopyFrom(self._dump)
        other._strings = dict(self._strings)
        other._frames = dict(self._frames)
        other._stacks = dict(self._stacks)
        other._specs = dict(self._specs)
        other._raw_stacks = dict(self._raw_stacks)
        other._raw_specs = dict(self._raw_specs)
        other._cols = {name: list(column) for name, column in self._cols.items()}
        return other

    def read_sources(self, source: SourceReader) -> None:
        """Read the source line of every frame interned from now on with ``source`` (a
        producer that started from frames without it: a snapshot adding stacks to a
        converted ring)."""
        self._source = source

    @property
    def header(self) -> pb.Header:
        """The dump's header, to be filled in place."""
        return self._dump.header

    def string(self, value: str) -> int:
        """Index of ``value`` in the string table, adding it if new."""
        index = self._strings.get(value)
        if index is None:
            index = len(self._dump.strings)
            self._strings[value] = index
            self._dump.strings.append(value)
        return index

    def frame(self, file: str, name: str, line: int) -> int:
        """Index of the frame (file, function, line), adding it if new."""
        key = (self.string(file), self.string(name), max(0, line))
        index = self._frames.get(key)
        if index is None:
            index = len(self._dump.frames)
            self._frames[key] = index
            text = self._source(file, line)[:MAX_SOURCE_CHARS] if self._source and line > 0 else ""
            code = self.string(text) if text else 0
            origin = self._origin(file, line) if self._origin else 0
            self._dump.frames.add(
                file=key[0], name=key[1], line=key[2], code=code,
                origin=origin,  # type: ignore[arg-type]
            )  # fmt: skip
        return index

    def stack(self, frames: Iterable[FrameTuple]) -> int:
        """Index of a stack given innermost frame first; 0 for an empty stack."""
        raw = tuple(frames)
        known = self._raw_stacks.get(raw)
        if known is not None:
            return known
        key = tuple(self.frame(f, n, ln) for f, n, ln in raw)
        index = self._stacks.get(key)
        if index is None:
            index = len(self._dump.stacks)
            self._stacks[key] = index
            self._dump.stacks.add(frames=key)
        self._raw_stacks[raw] = index
        return index

    def tensors(self, tensors: Iterable[TensorTuple]) -> int:
        """Index of a tensor signature (list of (shape, dtype)); 0 for no tensors."""
        raw = tuple((tuple(shape), dtype) for shape, dtype in tensors)
        known = self._raw_specs.get(raw)
        if known is not None:
            return known
        ndim: list[int] = []
        dims: list[int] = []
        dtypes: list[int] = []
        for shape, dtype in raw:
            ndim.append(len(shape))
            dims.extend(shape)
            dtypes.append(self.string(dtype))
        key = (tuple(ndim), tuple(dims), tuple(dtypes))
        index = self._specs.get(key)
        if index is None:
            index = len(self._dump.tensor_specs)
            self._specs[key] = index
            self._dump.tensor_specs.add(ndim=key[0], dims=key[1], dtype=key[2])
        self._raw_specs[raw] = index
        return index

    def group(
        self,
        name: str,
        ranks: Sequence[int],
        *,
        desc: str = "",
        backend: str = "",
        last_seq: int = 0,
        dropped: int = 0,
        p2p: Iterable[tuple[int, int, int]] = (),
        members_known: bool = True,
    ) -> int:
        """Add a process group; returns its index for ``EntryValues.group``.

        ``ranks`` are the global ranks in group-rank order; a regular list is written as a
        ``RankGrid`` (a ``range`` in O(1)), an irregular one as it is. ``p2p`` holds
        (peer, sends, recvs) counters.
        """
        g = self._dump.groups.add(
            name=name,
            desc=desc,
            backend=backend,
            last_seq=last_seq,
            dropped=dropped,
            members_known=members_known,
        )
        set_members(g, ranks)
        for peer, sends, recvs in p2p:
            g.p2p.add(peer=peer, sends=sends, recvs=recvs)
        return len(self._dump.groups) - 1

    def entry(self, e: EntryValues) -> None:
        """Append one ring entry (oldest first)."""
        self.entry_raw(
            record_id=e.record_id,
            group=e.group,
            seq=e.seq,
            p2p_seq=e.p2p_seq,
            op=self.string(e.op),
            reduce_op=self.string(e.reduce_op),
            peer=e.peer,
            state=e.state,
            enqueue_ns=e.enqueue_ns,
            start_ns=e.start_ns,
            complete_ns=e.complete_ns,
            thread=self.string(e.thread),
            stack=self.stack(e.stack),
            inputs=self.tensors(e.inputs),
            outputs=self.tensors(e.outputs),
            flags=e.flags,
            device=self.string(e.device),
        )

    def entry_raw(self, **columns: int) -> None:
        """Append one entry whose table references are already interned indices.

        Every column of ``Entries`` must be given; this is the fast path for producers that
        intern on their own (the recorder caches stack indices across entries).
        """
        cols = self._cols
        for name, column in cols.items():
            column.append(columns[name])

    def entry_columns(self, columns: dict[str, list[int]]) -> None:
        """Append many entries at once, one list per ``Entries`` column, all of one length.

        Table references must already be interned indices. This is the bulk path for
        producers that build whole columns (the simulator, the native converter).

        Raises:
            ValueError: a column is missing or the lengths differ.
        """
        lengths = {len(columns.get(name, ())) for name in self._cols}
        if len(lengths) != 1:
            raise ValueError(
                f"entry columns must all be given, with one length (got {sorted(lengths)})"
            )
        for name, column in self._cols.items():
            column.extend(columns[name])

    def thread(
        self,
        ident: int,
        name: str,
        frames: Iterable[FrameTuple],
        *,
        is_main: bool = False,
        holds_recorder: bool = False,
        pid: int = 0,
        still_ms: int = 0,
        cpu_ms: int = 0,
    ) -> None:
        """Record one thread's stack at dump time (innermost frame first); ``pid``,
        ``still_ms`` and ``cpu_ms`` as in ``ThreadState`` (a snapshot taken from outside)."""
        self._dump.threads.add(
            ident=ident,
            name=name,
            stack=self.stack(frames),
            is_main=is_main,
            holds_recorder=holds_recorder,
            pid=pid,
            still_ms=still_ms,
            cpu_ms=cpu_ms,
        )

    def exception(
        self,
        type_name: str,
        message: str,
        frames: Iterable[FrameTuple],
        *,
        thread: str = "",
        is_main: bool = False,
        wall_time_ns: int = 0,
        via: str = "",
    ) -> None:
        """Record an exception that ended a thread (its traceback raising frame first)."""
        self._dump.exceptions.add(
            type=type_name,
            message=message,
            thread=thread,
            is_main=is_main,
            stack=self.stack(frames),
            wall_time_ns=wall_time_ns,
            via=via,
        )

    def build(self) -> pb.Dump:
        """The finished dump. The builder must not be used afterwards."""
        entries = self._dump.entries
        for name, column in self._cols.items():
            getattr(entries, name).extend(column)
        return self._dump
