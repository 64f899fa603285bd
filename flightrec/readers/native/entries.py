"""Validate a native dump's ``entries`` table column by column.

A native ring is a list of dicts, one per operation, with the same twenty keys. Reading it
entry by entry costs microseconds per value in Python; reading it a column at a time lets
C do the walking: ``list(map(dict.get, entries, repeat(key)))`` pulls one column out,
``Reader.ints`` / ``texts`` check its types in one pass, and everything that repeats
(profiling names, group tuples, tensor signatures, stacks) is validated once per distinct
value, then shared. What any value is allowed to be is exactly what the scalar accessors of
``Reader`` allow: the fast paths only skip work for data that is already well formed.

Where ``_pickled.c`` is built, pickles of the usual shape skip all of this: the C reader
produces the same ``NativeEntries`` from the bytes (``from_c``), and declines everything
else to the path here, which defines what it must produce.

The work stays bounded: the pickle memo lets a small file refer to one big list many times,
so nested lists are handled once per distinct object (by identity) and their lengths are
counted against the reader's work budget before they are walked.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import is_, itemgetter
from typing import NamedTuple

from flightrec.format.native_names import DTYPES, SEND_RECV, parse_profiling_name
from flightrec.readers.native.reader import Reader

MAX_FRAMES_PER_ENTRY = 64
MAX_TENSORS_PER_ENTRY = 4096
MAX_DIMS = 64
_MAX_LINE = (1 << 32) - 1  # the schema's frame line is 32 bits

FrameTuple = tuple[str, str, int]
"""(file, function, line)"""
StackTuple = tuple[FrameTuple, ...]
"""Frames, innermost first."""
TensorSig = tuple[tuple[tuple[int, ...], str], ...]
"""The (shape, dtype name) of each tensor argument of an operation."""

_NONE = type(None)
_SEQS = frozenset({list, tuple})
_SEQS_OR_NONE = frozenset({list, tuple, _NONE})
_TUPLES_OR_NONE = frozenset({tuple, _NONE})
_INTS = frozenset({int})
_STRS = frozenset({str})
_TUPLES = frozenset({tuple})
_PAIR = frozenset({2})
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


@dataclass(frozen=True, slots=True)
class NativeEntries:
    """A native ring, validated, as columns (oldest entry first). Times are wall-clock ns.

    Tensor signatures and stacks are held once each in ``tensor_sigs`` / ``stacks`` (index 0
    is the empty one) and referred to by index from ``inputs``, ``outputs`` and ``stack``.
    """

    record_id: Sequence[int]
    pg_id: Sequence[int]
    pg_name: Sequence[str]
    pg_desc: Sequence[str]
    seq: Sequence[int]
    p2p_seq: Sequence[int]
    backend: Sequence[str]
    op: Sequence[str]
    local_src: Sequence[int]
    """P2P: group-local sender from the profiling name; -1 otherwise."""
    local_dst: Sequence[int]
    """P2P: group-local receiver; -1 otherwise."""
    is_p2p: Sequence[bool]
    state: Sequence[str]
    created_ns: Sequence[int]
    started_ns: Sequence[int]
    completed_ns: Sequence[int]
    inputs: Sequence[int]
    outputs: Sequence[int]
    tensor_sigs: tuple[TensorSig, ...]
    stack: Sequence[int]
    stacks: tuple[StackTuple, ...]
    thread: Sequence[str]
    timeout_ms: Sequence[int]

    def __len__(self) -> int:
        return len(self.record_id)


EMPTY_ENTRIES = NativeEntries(
    record_id=(),
    pg_id=(),
    pg_name=(),
    pg_desc=(),
    seq=(),
    p2p_seq=(),
    backend=(),
    op=(),
    local_src=(),
    local_dst=(),
    is_p2p=(),
    state=(),
    created_ns=(),
    started_ns=(),
    completed_ns=(),
    inputs=(),
    outputs=(),
    tensor_sigs=((),),
    stack=(),
    stacks=((),),
    thread=(),
    timeout_ms=(),
)


class _Interned:
    """Validated values that repeat, each kept once and referred to by index."""

    def __init__(self) -> None:
        self.sigs: list[TensorSig] = [()]
        self.sig_index: dict[TensorSig, int] = {(): 0}
        self.stacks: list[StackTuple] = [()]
        self.stack_index: dict[StackTuple, int] = {(): 0}
        # The recorder symbolizes each distinct frame once and every entry refers to the same
        # frame dict (shared through the pickle memo): validate each object once. Keyed by
        # id(), which is stable because the whole unpickled tree outlives the reading.
        self.frames_by_id: dict[int, FrameTuple] = {}

    def sig(self, sig: TensorSig) -> int:
        index = self.sig_index.get(sig)
        if index is None:
            index = self.sig_index[sig] = len(self.sigs)
            self.sigs.append(sig)
        return index

    def stack(self, stack: StackTuple) -> int:
        index = self.stack_index.get(stack)
        if index is None:
            index = self.stack_index[stack] = len(self.stacks)
            self.stacks.append(stack)
        return index


def _column(entries: list[dict[object, object]], key: str) -> list[object]:
    return list(map(dict.get, entries, repeat(key)))


# The keys read_entries takes from every entry (format 2.x names).
_KEYS = (
    "profiling_name", "process_group", "collective_seq_id", "record_id", "is_p2p",
    "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "frames", "pg_id",
    "p2p_seq_id", "state", "time_created_ns", "time_discovered_started_ns",
    "time_discovered_completed_ns", "thread_name", "timeout_ms",
)  # fmt: skip
_ALL_KEYS = itemgetter(*_KEYS)


def _columns(entries: list[dict[object, object]]) -> dict[str, Sequence[object]]:
    """Every column ``read_entries`` reads, by key; a missing value is None.

    One pass when every entry has every key (what torch writes): each dict is looked up once
    for all keys and the rows are transposed at C speed into tuples (nothing downstream
    writes to a column, so no list copies). Otherwise a pass per column.
    """
    try:
        rows = list(map(_ALL_KEYS, entries))
    except KeyError:
        return {key: _column(entries, key) for key in _KEYS}
    return dict(zip(_KEYS, zip(*rows, strict=True), strict=True))


def _first_bad(values: Sequence[object], allowed: frozenset[type]) -> int:
    return next(i for i, v in enumerate(values) if type(v) not in allowed)


# -- tensors ----------------------------------------------------------------------------


def _tensors_one(
    r: Reader, sizes: object, dtypes: object, size_label: str, dtype_label: str
) -> TensorSig:
    """One entry's tensor signature, value by value (the reference the fast path matches)."""
    if sizes is None:
        return ()
    shapes = r.seq(sizes, size_label)
    names = r.seq(dtypes, dtype_label) if dtypes is not None else ()
    out: list[tuple[tuple[int, ...], str]] = []
    for i, shape in enumerate(shapes[:MAX_TENSORS_PER_ENTRY]):
        dims = r.seq(shape, size_label)
        if len(dims) > MAX_DIMS:
            raise r.fail(f"{size_label}[{i}] has {len(dims)} dimensions")
        dtype = r.text(names[i], dtype_label) if i < len(names) else ""
        out.append(
            (tuple([r.integer(d, size_label) for d in dims]), DTYPES.get(dtype) or dtype.lower())
        )
    return tuple(out)


_SAMPLE = 64  # entries looked at to guess whether a column shares its objects


def _per_object(
    columns: Sequence[Sequence[object]], codes_of: Callable[..., list[int]]
) -> list[int]:
    """``codes_of(*columns)``, computed once per distinct combination of objects.

    The pickle memo keeps the sharing of the writer: where entries refer to one list (a
    stack, a shape), the unpickled entries share one object. Working per distinct object
    (by identity, which holds because the unpickled tree outlives the reading) makes the
    cost follow what the file holds, not how often entries refer to it.

    Entries are keyed by the identity of their object in the first column alone (integers
    hash for free, where a tuple of identities costs a tuple and its hash per entry); the
    other columns must then hold the same object wherever the first does, which one C-speed
    comparison per column checks. Where they do not, the key is the tuple of identities.
    """
    first = columns[0]
    head = first[:_SAMPLE]
    if len(head) == _SAMPLE and len(set(map(id, head))) == _SAMPLE:
        return codes_of(*columns)  # no sharing where the ring starts: likely none at all
    ids: list[object] = list(map(id, first))
    where = dict(zip(ids, range(len(ids)), strict=True))
    if len(where) == len(ids):
        return codes_of(*columns)
    if len(columns) > 1:
        rep = list(map(where.__getitem__, ids))  # the entry standing for each entry's key
        if not all(all(map(is_, c, map(c.__getitem__, rep))) for c in columns[1:]):
            ids = list(zip(*(map(id, c) for c in columns), strict=True))
            where = dict(zip(ids, range(len(ids)), strict=True))
    picks = list(where.values())
    distinct = codes_of(*([c[i] for i in picks] for c in columns))
    by_ids = dict(zip(where, distinct, strict=True))
    return list(map(by_ids.__getitem__, ids))


def _tensor_column(
    r: Reader, sizes: Sequence[object], dtypes: Sequence[object], what: str, interned: _Interned
) -> list[int]:
    """The tensor signature index of every entry, for ``what`` = "input" or "output"."""
    return _per_object((sizes, dtypes), lambda s, d: _tensor_codes(r, s, d, what, interned))


def _tensor_codes(
    r: Reader, sizes: Sequence[object], dtypes: Sequence[object], what: str, interned: _Interned
) -> list[int]:
    size_label, dtype_label = f"{what}_sizes", f"{what}_dtypes"
    r.tick(len(sizes))
    if set(map(type, sizes)) <= _SEQS_OR_NONE and set(map(type, dtypes)) <= _SEQS_OR_NONE:
        present: list[Sequence[object]] = [s for s in sizes if s]  # type: ignore[misc]
        r.tick(sum(map(len, present)))  # shapes, bounded before anything walks them
        shapes: list[Sequence[object]] = list(chain.from_iterable(present))  # type: ignore[arg-type]
        if set(map(type, shapes)) <= _SEQS:
            r.tick(sum(map(len, shapes)))  # dimensions
            named: list[Sequence[object]] = [d for d in dtypes if d]  # type: ignore[misc]
            r.tick(sum(map(len, named)))
            # Only exact ints and strs make keys: values that merely compare equal (1.0 and
            # 1, True and 1) must not share the validation of another entry.
            if (
                set(map(type, chain.from_iterable(shapes))) <= _INTS
                and set(map(type, chain.from_iterable(named))) <= _STRS
            ):
                # The raw value of each entry as a hashable key: distinct keys are few (one
                # per call site and shape), and only they are validated.
                keys: list[Hashable] = [
                    None if s is None else (tuple(map(tuple, s)), tuple(d or ()))  # type: ignore[call-overload, arg-type]
                    for s, d in zip(sizes, dtypes, strict=True)
                ]
                where = dict(zip(keys, range(len(keys)), strict=True))
                codes = {
                    key: interned.sig(_tensors_one(r, sizes[i], dtypes[i], size_label, dtype_label))
                    for key, i in where.items()
                }
                return list(map(codes.__getitem__, keys))
    return [
        interned.sig(_tensors_one(r, s, d, size_label, dtype_label))
        for s, d in zip(sizes, dtypes, strict=True)
    ]


# -- stacks -----------------------------------------------------------------------------


def _stack_one(r: Reader, value: object, interned: _Interned) -> StackTuple:
    """One entry's stack, frame by frame, each distinct frame object validated once."""
    if value is None:
        return ()
    out: list[FrameTuple] = []
    memo = interned.frames_by_id
    for frame in r.seq(value, "frames")[:MAX_FRAMES_PER_ENTRY]:
        done = memo.get(id(frame))
        if done is None:
            f = r.mapping(frame, "a frame")
            line = r.integer(f.get("line"), "frame line")
            if line > _MAX_LINE:
                raise r.fail(f"frame line {line} is beyond any source file")
            done = (
                r.text(f.get("filename"), "frame filename"),
                r.text(f.get("name"), "frame name"),
                max(0, line),
            )
            memo[id(frame)] = done
        out.append(done)
    return tuple(out)


def _stack_column(r: Reader, frames: Sequence[object], interned: _Interned) -> list[int]:
    """The stack index of every entry."""
    return _per_object((frames,), lambda f: _stack_codes(r, f, interned))


def _stack_codes(r: Reader, frames: Sequence[object], interned: _Interned) -> list[int]:
    r.tick(len(frames))
    if set(map(type, frames)) <= _SEQS_OR_NONE:
        present: list[Sequence[object]] = [f for f in frames if f]  # type: ignore[misc]
        r.tick(sum(map(len, present)))
        # Entries share frame objects, not always frame lists: key each entry by the
        # identities of its frames, and build each distinct stack once.
        keys = [tuple(map(id, f)) if f else () for f in frames]  # type: ignore[call-overload]
        where = dict(zip(keys, range(len(keys)), strict=True))
        r.cells -= sum(map(len, present))  # _stack_one counts the frames it reads itself
        codes = {
            key: interned.stack(_stack_one(r, frames[i], interned)) for key, i in where.items()
        }
        return list(map(codes.__getitem__, keys))
    return [interned.stack(_stack_one(r, f, interned)) for f in frames]


# -- names ------------------------------------------------------------------------------


def _group_one(r: Reader, pg: object) -> tuple[str, str]:
    if pg is None:
        return "", ""
    parts = r.seq(pg, "process_group")
    name = r.text(parts[0], "process_group name") if parts else ""
    desc = r.text(parts[1], "process_group desc") if len(parts) > 1 else ""
    return name, desc


def _group_column(r: Reader, groups: Sequence[object]) -> tuple[Sequence[str], Sequence[str]]:
    """(name, desc) columns from the ``process_group`` tuples."""
    if not groups:
        return (), ()
    if set(map(type, groups)) <= _TUPLES and set(map(len, groups)) <= _PAIR:  # type: ignore[arg-type]
        # The pickle form: a (name, desc) tuple of two strings per entry. Both columns come
        # out at C speed, checked by type; nothing to hash or to look up per entry.
        names: Sequence[object] = list(map(_FIRST, groups))  # type: ignore[arg-type]
        descs: Sequence[object] = list(map(_SECOND, groups))  # type: ignore[arg-type]
        if set(map(type, names)) <= _STRS and set(map(type, descs)) <= _STRS:
            r.tick(3 * len(groups))
            return names, descs  # type: ignore[return-value]  # checked just above
    pairs: list[tuple[str, str]] = []
    codes = _per_object((groups,), lambda g: _group_codes(r, g, pairs))
    if len(pairs) == 1:
        ((name, desc),) = pairs
        return [name] * len(groups), [desc] * len(groups)
    name_of = [pair[0] for pair in pairs]
    desc_of = [pair[1] for pair in pairs]
    return list(map(name_of.__getitem__, codes)), list(map(desc_of.__getitem__, codes))


def _group_codes(r: Reader, groups: Sequence[object], pairs: list[tuple[str, str]]) -> list[int]:
    """Index into ``pairs`` (appended to: each distinct (name, desc) once) of every entry."""
    index: dict[tuple[str, str], int] = {}

    def code(pair: tuple[str, str]) -> int:
        found = index.get(pair)
        if found is None:
            found = index[pair] = len(pairs)
            pairs.append(pair)
        return found

    types = set(map(type, groups))
    if types <= _SEQS_OR_NONE:
        r.tick(sum(map(len, filter(None, groups))))  # type: ignore[arg-type]  # hashed below
        try:
            # Tuples (the pickle form) are their own keys; lists (JSON) become tuples.
            keys: Sequence[Hashable] = (
                groups  # type: ignore[assignment]
                if types <= _TUPLES_OR_NONE
                else [None if g is None else tuple(g[:2]) for g in groups]  # type: ignore[index]
            )
            distinct = dict.fromkeys(keys)
        except TypeError:
            pass  # unhashable parts: explained value by value below
        else:
            r.tick(2 * len(groups))
            of = {key: code(_group_one(r, key)) for key in distinct}  # (validated once each)
            return list(map(of.__getitem__, keys))
    return [code(_group_one(r, g)) for g in groups]


# -- the table --------------------------------------------------------------------------


def read_entries(r: Reader, raw: object) -> NativeEntries:
    """Validate the ``entries`` table of a native dump.

    Args:
        r: the reader of this file (its work budget and its name for messages).
        raw: the unpickled ``entries`` value.

    Returns:
        The entries as validated columns.

    Raises:
        CorruptDumpError: a value of the wrong type or size, or more work than any dump needs.
    """
    checked = check_columns(r, raw)
    return EMPTY_ENTRIES if checked is None else checked


def check_columns(r: Reader, raw: object) -> NativeEntries | None:
    """Check the unpickled ``entries`` table column by column (None when it is empty).

    What the C reader makes of a pickle's bytes (``from_c``) is exactly this.

    Raises:
        CorruptDumpError: a value of the wrong type or size, or more work than any dump needs.
    """
    seq = r.seq(raw, "entries")
    if not seq:
        return None
    entries: list[dict[object, object]] = list(seq)  # type: ignore[arg-type]
    if set(map(type, entries)) != {dict}:
        i = _first_bad(entries, frozenset({dict}))
        raise r.fail(f"entries[{i}] is {type(entries[i]).__name__}, expected a dict")
    cols = _columns(entries)
    names = r.texts(cols["profiling_name"], "profiling_name")
    pg_name, pg_desc = _group_column(r, cols["process_group"])
    seqs = cols["collective_seq_id"]
    if None in seqs:  # format 1.x calls it seq_id
        seqs = [e.get("collective_seq_id", e.get("seq_id")) for e in entries]
    record_ids = cols["record_id"]
    if None in record_ids:
        record_ids = [i if v is None else v for i, v in enumerate(record_ids)]
    is_p2p = r.flags(cols["is_p2p"], "is_p2p")
    interned = _Interned()
    inputs = _tensor_column(r, cols["input_sizes"], cols["input_dtypes"], "input", interned)
    outputs = _tensor_column(r, cols["output_sizes"], cols["output_dtypes"], "output", interned)
    stack = _stack_column(r, cols["frames"], interned)
    record_id = r.naturals(record_ids, "record_id")  # unsigned in the schema
    pg_id = r.ints(cols["pg_id"], "pg_id", -1)
    seq_ids = r.naturals(seqs, "collective_seq_id")
    p2p_seq = r.naturals(cols["p2p_seq_id"], "p2p_seq_id")
    state = r.texts(cols["state"], "state")
    created = r.naturals(cols["time_created_ns"], "time_created_ns")
    started = r.naturals(cols["time_discovered_started_ns"], "time_discovered_started_ns")
    completed = r.naturals(cols["time_discovered_completed_ns"], "time_discovered_completed_ns")
    thread = r.texts(cols["thread_name"], "thread_name")
    timeout_ms = r.naturals(cols["timeout_ms"], "timeout_ms")
    # Every column checked: the names are parsed last, as ``from_c``'s are.
    calls = parse_calls(names, is_p2p)
    return NativeEntries(
        record_id=record_id,
        pg_id=pg_id,
        pg_name=pg_name,
        pg_desc=pg_desc,
        seq=seq_ids,
        p2p_seq=p2p_seq,
        backend=calls.backend,
        op=calls.op,
        local_src=calls.local_src,
        local_dst=calls.local_dst,
        is_p2p=calls.is_p2p,
        state=state,
        created_ns=created,
        started_ns=started,
        completed_ns=completed,
        inputs=inputs,
        outputs=outputs,
        tensor_sigs=tuple(interned.sigs),
        stack=stack,
        stacks=tuple(interned.stacks),
        thread=thread,
        timeout_ms=timeout_ms,
    )


CReading = tuple[
    dict[object, object],
    int,
    tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes],
    tuple[list[str], list[str], list[str], list[bool], list[str], list[str]],
    tuple[bytes, bytes, bytes],
    tuple[TensorSig, ...],
    tuple[StackTuple, ...],
]
"""What ``_pickled.read`` answers for a pickle it reads (see ``_pickled.c``)."""


def from_c(reading: CReading) -> NativeEntries:
    """The entries of what the C reader answered (the rest of the dump aside)."""
    _, _, ints, lists, codes, sigs, stacks = reading
    q = [_array("q", b) for b in ints]
    c = [_array("i", b) for b in codes]
    pg_name, pg_desc, names, is_p2p, state, thread = lists
    calls = parse_calls(names, is_p2p)
    return NativeEntries(
        record_id=q[0],
        pg_id=q[1],
        pg_name=pg_name,
        pg_desc=pg_desc,
        seq=q[2],
        p2p_seq=q[3],
        backend=calls.backend,
        op=calls.op,
        local_src=calls.local_src,
        local_dst=calls.local_dst,
        is_p2p=calls.is_p2p,
        state=state,
        created_ns=q[4],
        started_ns=q[5],
        completed_ns=q[6],
        inputs=c[0],
        outputs=c[1],
        tensor_sigs=sigs,
        stack=c[2],
        stacks=stacks,
        thread=thread,
        timeout_ms=q[7],
    )


def _array(code: str, data: bytes) -> array[int]:
    a = array(code)
    a.frombytes(data)
    return a


class Calls(NamedTuple):
    """The columns a ring's profiling names (``"nccl:all_reduce"``) stand for."""

    backend: Sequence[str]
    op: Sequence[str]
    local_src: Sequence[int]
    local_dst: Sequence[int]
    is_p2p: Sequence[bool]
    """The ring's own flag, or'ed with a send or receive the name says."""


def parse_calls(names: Sequence[str], is_p2p: Sequence[bool]) -> Calls:
    """The profiling names parsed, once per distinct name.

    Args:
        names: the ring's profiling names, checked.
        is_p2p: the ring's own ``is_p2p`` flags, checked.

    Returns:
        Per entry: backend, operation, group-local sender and receiver, P2P flag.
    """
    n = len(names)
    calls = {name: parse_profiling_name(name) for name in dict.fromkeys(names)}
    if len(calls) == 1:
        ((backend, op, src, dst),) = calls.values()
        backends: Sequence[str] = [backend] * n
        ops: Sequence[str] = [op] * n
        srcs: Sequence[int] = [src] * n
        dsts: Sequence[int] = [dst] * n
    else:
        backends = list(map({k: call[0] for k, call in calls.items()}.__getitem__, names))
        ops = list(map({k: call[1] for k, call in calls.items()}.__getitem__, names))
        if any(call[2] >= 0 or call[3] >= 0 for call in calls.values()):
            srcs = list(map({k: call[2] for k, call in calls.items()}.__getitem__, names))
            dsts = list(map({k: call[3] for k, call in calls.items()}.__getitem__, names))
        else:
            srcs = dsts = [-1] * n
    if any(calls[name][1] in SEND_RECV for name in calls):
        is_p2p = [p or op in SEND_RECV for p, op in zip(is_p2p, ops, strict=True)]
    return Calls(backends, ops, srcs, dsts, is_p2p)
