"""Where a rank stands, in a few dozen bytes: what the reporter reads from every rank first.

At 131,072 ranks the reporter cannot afford to read every rank's ``Summary`` (a few KB and a
few hundred microseconds of analysis each). Every rank therefore also publishes a
``Progress`` message (``proto/flightrec.proto``): per process group, the collectives it
issued and the oldest one still incomplete, and the one operation it waits in. That is
enough to find who holds the job up (``flightrec.live.frontier``); the reporter then reads
the summaries of those ranks only.

``progress`` builds one from the dump the rank just wrote; ``decode_progress`` reads one from
the store, trusting nothing (one ``SummaryError`` line naming the rank).
"""

from __future__ import annotations

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


def decode_progress(data: bytes, rank: int, world_size: int) -> pb.Progress:
    """Read rank ``rank``'s progress record as it came from the store.

    Raises:
        SummaryError: one line naming the rank and the problem.
    """
    label = f"rank {rank}'s progress"
    why = ""
    msg = pb.Progress()
    if len(data) > MAX_BYTES:
        why = f"{len(data)} bytes, more than the {MAX_BYTES} a progress record may have"
    else:
        try:
            msg.ParseFromString(data)
        except Exception:  # protobuf's DecodeError, or worse on hostile bytes
            why = "not a flightrec progress record (unparseable)"
    if not why:
        why = _problem(msg, rank, world_size)
    if why:
        raise SummaryError(f"{label}: {printable(why)[:200]}")
    return msg


def _problem(msg: pb.Progress, rank: int, world_size: int) -> str:
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
