"""Where a rank stands, in a few dozen bytes: what the reporter reads from every rank first.

At 131,072 ranks the reporter cannot afford to read every rank's ``Summary`` (a few KB and a
few hundred microseconds of analysis each). Every rank therefore also publishes a
``Progress`` message (``proto/flightrec.proto``): per process group, the collectives it
issued and the oldest one still incomplete, and the one operation it waits in. That is
enough to find who holds the job up (``flightrec.live.frontier``); the reporter then reads
the summaries of those ranks only.

``progress`` builds one from the dump the rank just wrote; ``decode_progress`` reads one from
the store, trusting nothing (one ``SummaryError`` line naming the rank), into a
``ProgressRecord``: the message's fields in a tuple, which the reporter's first pass reads at
the speed of a tuple (a protobuf message's fields cost a microsecond each from Python).
``decode_many`` reads the records of a whole round.

Reading runs in C where the optional extension ``flightrec.format._progress`` is built: the
wire format and the checks in one pass over the bytes, with exactly the results of the Python
path here (protobuf's parser, ``_problem``, ``record_of``); tests/unit/test_progress_decode.py
compares the two on real and hostile bytes. 131,072 records of a simulated job took 0.11 to
0.26 s with it on a busy 2-core machine, against 1.4 s for protobuf's parser and the checks
(``python benchmarks/bench_progress.py`` prints today's figures, both ways).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from flightrec.errors import printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.format.summary import MAX_RANK, MAX_TEXT, SummaryError

MAX_GROUPS = 64
"""Groups listed per rank (more sets ``TRUNCATED``; the newest-used are kept)."""
MAX_BYTES = 1024
"""Largest progress record on the wire (64 group names of 8 characters fit)."""
MAX_NAME = 64
"""Longest group name listed (torch's names are short: "0", "12", or a hash)."""
_PENDING = (pb.ENQUEUED, pb.STARTED)
UNPARSEABLE = "not a flightrec progress record (unparseable)"


class ProgressRecord(NamedTuple):
    """A checked progress record, read-only: ``pb.Progress``'s fields in its order, the
    repeated ones as tuples (see ``proto/flightrec.proto``, message ``Progress``)."""

    round: int
    rank: int
    world_size: int
    flags: int
    group: tuple[str, ...]
    issued: tuple[int, ...]
    pending: tuple[int, ...]
    wait_group: int
    wait_op: str
    wait_seq: int
    wait_peer: int
    wait_flags: int
    waited_ms: int
    size: tuple[int, ...]


Decoded = dict[int, tuple[bytes, "ProgressRecord | str"]]
"""Records decoded (``decode_many``): rank -> (the bytes, the record or why it was refused)."""

try:
    from flightrec.format import _progress
except ImportError:  # not built (no compiler): protobuf's parser and the checks below
    _progress = None  # type: ignore[assignment]
else:
    _progress.use(ProgressRecord, MAX_BYTES, MAX_GROUPS, MAX_NAME, MAX_TEXT, MAX_RANK + 1)
_C_WORLD = 1 << 62
"""World sizes the C reader takes (it counts in 64 bits; any real one is far below)."""


def progress(dump: pb.Dump, round_: int) -> pb.Progress:
    """The progress record of a dump the recorder just built.

    Args:
        dump: the dump (entries oldest first).
        round_: the request number it answers.
    """
    h = dump.header
    e = dump.entries
    s = dump.strings
    states = e.state
    groups = dump.groups
    pending: dict[int, int] = {}
    newest: dict[int, int] = {}
    wait = -1
    failed_at = completed_at = -1
    for i, (g, state) in enumerate(zip(e.group, states, strict=True)):
        newest[g] = i
        if state == pb.COMPLETED:
            completed_at = i
            continue
        if state == pb.FAILED:
            failed_at = i
            continue
        if state not in _PENDING:
            continue
        if wait < 0:
            wait = i
        if e.seq[i] and not e.flags[i] & pb.IS_P2P and g not in pending:
            pending[g] = e.seq[i]
    flags = 0
    if any(x.is_main for x in dump.exceptions):
        flags |= pb.DIED
    if failed_at > completed_at:
        flags |= pb.OP_FAILED
    order = sorted(range(len(groups)), key=lambda g: (g not in pending, -newest.get(g, -1)))
    if len(order) > MAX_GROUPS:
        flags |= pb.TRUNCATED
        order = order[:MAX_GROUPS]
    msg = pb.Progress(round=round_, rank=h.rank, world_size=h.world_size, flags=flags)
    msg.group.extend(groups[g].name[:MAX_NAME] for g in order)
    msg.issued.extend(groups[g].last_seq for g in order)
    msg.pending.extend(pending.get(g, 0) for g in order)
    msg.size.extend(group_size(groups[g]) for g in order)
    if wait >= 0 and e.group[wait] in order:
        msg.wait_group = order.index(e.group[wait]) + 1
        msg.wait_op = s[e.op[wait]][:MAX_TEXT]
        p2p = bool(e.flags[wait] & pb.IS_P2P)
        msg.wait_seq = e.p2p_seq[wait] if p2p else e.seq[wait]
        msg.wait_peer = e.peer[wait]
        msg.wait_flags = e.flags[wait]
        if e.enqueue_ns[wait] and h.mono_time_ns > e.enqueue_ns[wait]:
            msg.waited_ms = min((h.mono_time_ns - e.enqueue_ns[wait]) // 1_000_000, 2**32 - 1)
    else:
        msg.wait_peer = -1
    return msg


def group_size(g: pb.ProcessGroup) -> int:
    """Members of a group as written (a grid's without expanding it)."""
    if g.HasField("rank_grid"):
        size = 1
        for n in g.rank_grid.shape:
            size *= n
        return size
    return len(members_of(g))


def encode_progress(msg: pb.Progress) -> bytes:
    """The record on the wire (within ``MAX_BYTES``: names are cut until it fits)."""
    data = msg.SerializeToString()
    while len(data) > MAX_BYTES and msg.group:
        # Only a rank in dozens of groups with long names gets here: keep the first ones.
        keep = len(msg.group) // 2
        trimmed = pb.Progress()
        trimmed.CopyFrom(msg)
        for name in ("group", "issued", "pending", "size"):
            del getattr(trimmed, name)[keep:]
        if trimmed.wait_group > keep:
            trimmed.wait_group = 0
        trimmed.flags |= pb.TRUNCATED
        msg = trimmed
        data = msg.SerializeToString()
    return data


def decode_progress(data: bytes, rank: int, world_size: int) -> ProgressRecord:
    """Read rank ``rank``'s progress record as it came from the store.

    Raises:
        SummaryError: one line naming the rank and the problem.
    """
    got = read_progress(data, rank, world_size)
    if isinstance(got, str):
        raise SummaryError(f"rank {rank}'s progress: {got}")
    return got


def read_progress(data: bytes, rank: int, world_size: int) -> ProgressRecord | str:
    """Rank ``rank``'s progress record, or why it is refused (one printable line, without the
    rank's label: ``decode_progress`` adds it)."""
    if _progress is not None and 0 <= rank < _C_WORLD and 0 <= world_size < _C_WORLD:
        return _progress.decode(data, rank, world_size)
    return _read_py(data, rank, world_size)


def decode_many(raw: Mapping[int, bytes], world_size: int, into: Decoded) -> None:
    """Read every rank's record of ``raw`` into ``into`` (``read_progress``; in one call of C
    where the extension is built: no Python per record)."""
    fits = type(raw) is dict and min(raw, default=0) >= 0 and max(raw, default=0) < _C_WORLD
    if _progress is not None and fits and 0 <= world_size < _C_WORLD:
        _progress.decode_into(raw, world_size, into)
        return
    for rank, data in raw.items():
        into[rank] = (data, read_progress(data, rank, world_size))


def by_group(records: Mapping[int, ProgressRecord]) -> dict[str, tuple[list[int], list[int]]]:
    """Per group name, the ranks whose records list it and what each issued: the records'
    group columns turned group-major (two appends per rank and group, the cost of the
    reporter's first pass that grows with the job: in C where the extension is built)."""
    if _progress is not None and type(records) is dict:
        return _progress.by_group(records)
    return _by_group_py(records)


def _by_group_py(records: Mapping[int, ProgressRecord]) -> dict[str, tuple[list[int], list[int]]]:
    out: dict[str, tuple[list[int], list[int]]] = {}
    # The appends of each group's two lists, bound once (the loop's cost is these calls).
    append: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {}
    for rank, rec in records.items():
        for name, n in zip(rec[4], rec[5], strict=True):
            add = append.get(name)
            if add is None:
                col = out[name] = ([], [])
                add = append[name] = (col[0].append, col[1].append)
            add[0](rank)
            add[1](n)
    return out


def _read_py(data: bytes, rank: int, world_size: int) -> ProgressRecord | str:
    """``read_progress`` in Python: what ``_progress.c`` does, and what it is tested against."""
    if len(data) > MAX_BYTES:
        return f"{len(data)} bytes, more than the {MAX_BYTES} a progress record may have"
    msg = pb.Progress()
    try:
        msg.ParseFromString(data)
    except Exception:  # protobuf's DecodeError, or worse on hostile bytes
        return UNPARSEABLE
    record = record_of(msg)  # (checked as a record: a message's fields cost far more to read)
    why = _problem(record, rank, world_size)
    return printable(why)[:200] if why else record


def record_of(msg: pb.Progress) -> ProgressRecord:
    """A progress message as a record (unchecked: ``decode_progress`` checks what it reads)."""
    return ProgressRecord(
        msg.round, msg.rank, msg.world_size, msg.flags, tuple(msg.group), tuple(msg.issued),
        tuple(msg.pending), msg.wait_group, msg.wait_op, msg.wait_seq, msg.wait_peer,
        msg.wait_flags, msg.waited_ms, tuple(msg.size),
    )  # fmt: skip


def _problem(msg: ProgressRecord, rank: int, world_size: int) -> str:
    n = len(msg.group)
    if msg.rank != rank:
        return f"says it is rank {msg.rank}"
    if msg.world_size != world_size or world_size > MAX_RANK + 1:
        return f"says the world has {msg.world_size} ranks, not {world_size}"
    if n > MAX_GROUPS or not len(msg.issued) == len(msg.pending) == len(msg.size) == n:
        return "its group columns disagree"
    if msg.wait_group > n:
        return "waits in a group it does not list"
    if not -1 <= msg.wait_peer < world_size:
        return "waits on a peer outside the world"
    if n and max(msg.size) > world_size:
        return "a group larger than the world"
    if len(msg.wait_op) > MAX_TEXT or (n and max(map(len, msg.group)) > MAX_NAME):
        return "a text longer than a progress record keeps"
    return ""
