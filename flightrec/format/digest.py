"""The digest: one rank's newest arrivals per group, small enough to publish every check.

The in-job slow check (``flightrec.recorder.exchange.slowcheck``) has each rank publish one digest
through the job's store; one rank gathers them and looks for a rank that is persistently late
(``flightrec.live.slow``). A digest holds, per process group (at most ``MAX_GROUPS``), the
newest ``MAX_PER_GROUP`` completed collectives: sequence number, enqueue time and completion
time. That is what the straggler analysis needs: completions of one collective are
simultaneous on every member, which lines the ranks' clocks up; enqueue times then say who
arrived last.

Layout (little-endian; a fixed header, then groups; times to the microsecond, which is far
finer than the milliseconds lateness is judged in):

- header ``MAGIC``, version (u8), rank (u32), world size (u32), taken at (i64 ns, wall
  clock), host length (u8), device length (u8), groups (u8); then host and device (UTF-8);
- per group: key length (u8), key (UTF-8), members (u32), collectives (u16), base (i64 ns,
  wall clock), first seq (u64); then per collective: seq after the first (u32), enqueue
  after base (u32 µs), completion after enqueue (u32 µs);
- then the rank's activity (version 2, ``format.activity.RingActivity``): own time and the
  span it was measured over (u64 ns each), entries measured and entries per step (u32 each),
  and its point-to-point peers (u8 count, then u32 each): what tells a slow worker, a slow
  pipeline stage and spread imbalance apart (``flightrec.live.shapes``).

The reader takes bytes from the store, which anyone who can reach it may write: a value that
is not a digest of this version raises ``DigestError``, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.errors import DumpError
from flightrec.format.activity import MAX_PEERS, RingActivity

MAGIC = b"FRDG"
VERSION = 2
MAX_GROUPS = 8
MAX_PER_GROUP = 64
MAX_TEXT = 64
"""Bytes kept of a host name, a device name or a group key."""
_HEAD = struct.Struct("<4sBIIqBBB")
_GROUP = struct.Struct("<IHqQ")
_ENTRY = struct.Struct("<III")
_ACTIVITY = struct.Struct("<QQIIB")
_PEER = struct.Struct("<I")
_U32 = (1 << 32) - 1
MAX_BYTES = (
    _HEAD.size
    + 2 * MAX_TEXT
    + MAX_GROUPS * (1 + MAX_TEXT + _GROUP.size + MAX_PER_GROUP * _ENTRY.size)
    + _ACTIVITY.size
    + MAX_PEERS * _PEER.size
)
"""The largest digest (7,049 bytes); one group of 64 collectives takes about 800."""


NOTHING_MEASURED = RingActivity(0, 0, 0, 0, ())


class DigestError(DumpError):
    """Bytes that are not a digest this version can read."""


@dataclass(frozen=True, slots=True)
class GroupDigest:
    """One group's newest completed collectives, oldest first, on the rank's wall clock."""

    key: str
    members: int
    seqs: tuple[int, ...]
    enqueue_ns: tuple[int, ...]
    complete_ns: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Digest:
    """One rank's digest."""

    rank: int
    world_size: int
    taken_ns: int
    """Wall-clock time it was made."""
    host: str
    device: str
    groups: tuple[GroupDigest, ...]
    activity: RingActivity = NOTHING_MEASURED
    """Its own time and pipeline neighbours."""


def _text(s: str) -> bytes:
    return s.encode("utf-8", "replace")[:MAX_TEXT]


def encode(d: Digest) -> bytes:
    """The digest's bytes (at most ``MAX_BYTES``; longer groups keep their newest)."""
    host, device = _text(d.host), _text(d.device)
    groups = d.groups[:MAX_GROUPS]
    out = [_HEAD.pack(MAGIC, VERSION, d.rank, d.world_size, d.taken_ns, len(host), len(device),
                      len(groups)), host, device]  # fmt: skip
    for g in groups:
        rows = _rows(g)
        key = _text(g.key)
        base = rows[0][1] if rows else 0
        first = rows[0][0] if rows else 0
        out += [bytes([len(key)]), key, _GROUP.pack(min(g.members, _U32), len(rows), base, first)]
        out += [_ENTRY.pack(s - first, (e - base) // 1000, (c - e) // 1000) for s, e, c in rows]
    a = d.activity
    peers = [p for p in a.peers if 0 <= p <= _U32][:MAX_PEERS]
    out.append(
        _ACTIVITY.pack(
            max(0, a.own_ns),
            max(0, a.span_ns),
            min(a.entries, _U32),
            min(a.period, _U32),
            len(peers),
        )
    )
    out += [_PEER.pack(p) for p in peers]
    return b"".join(out)


def _rows(g: GroupDigest) -> list[tuple[int, int, int]]:
    """The newest collectives that fit the layout: increasing seqs, times within u32 µs."""
    rows = list(zip(g.seqs, g.enqueue_ns, g.complete_ns, strict=True))[-MAX_PER_GROUP:]
    while rows and not _fits(rows):
        rows = rows[1:]
    return rows


def _fits(rows: Sequence[tuple[int, int, int]]) -> bool:
    s0, e0 = rows[0][0], rows[0][1]
    return all(
        0 <= s - s0 <= _U32 and 0 <= (e - e0) // 1000 <= _U32 and 0 <= (c - e) // 1000 <= _U32
        for s, e, c in rows
    )


def decode(data: bytes, label: str) -> Digest:
    """Read a digest.

    Args:
        data: the bytes published.
        label: how to name their origin in an error.

    Raises:
        DigestError: not a digest, another version, or cut short.
    """
    if len(data) > MAX_BYTES:
        raise DigestError(label, f"{len(data)} bytes is more than a digest holds")
    try:
        magic, version, rank, world, taken, nh, nd, ng = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise DigestError(label, "not a flightrec digest")
        if version != VERSION:
            raise DigestError(label, f"digest version {version}, this flightrec reads {VERSION}")
        off = _HEAD.size
        host = data[off : off + nh].decode("utf-8", "replace")
        device = data[off + nh : off + nh + nd].decode("utf-8", "replace")
        off += nh + nd
        groups = []
        for _ in range(min(ng, MAX_GROUPS)):
            nk = data[off]
            key = data[off + 1 : off + 1 + nk].decode("utf-8", "replace")
            off += 1 + nk
            members, count, base, first = _GROUP.unpack_from(data, off)
            off += _GROUP.size
            if count > MAX_PER_GROUP:
                raise DigestError(label, f"group {key!r} claims {count} collectives")
            seqs, enq, comp = [], [], []
            for s, e, c in _ENTRY.iter_unpack(data[off : off + count * _ENTRY.size]):
                seqs.append(first + s)
                enq.append(base + e * 1000)
                comp.append(base + e * 1000 + c * 1000)
            if len(seqs) != count:
                raise DigestError(label, "cut short")
            off += count * _ENTRY.size
            groups.append(GroupDigest(key, members, tuple(seqs), tuple(enq), tuple(comp)))
        own, span, entries, period, npeers = _ACTIVITY.unpack_from(data, off)
        off += _ACTIVITY.size
        if npeers > MAX_PEERS:
            raise DigestError(label, f"{npeers} peers is more than a digest holds")
        peers = tuple(p for (p,) in _PEER.iter_unpack(data[off : off + npeers * _PEER.size]))
        if len(peers) != npeers:
            raise DigestError(label, "cut short")
    except (struct.error, IndexError):
        raise DigestError(label, "cut short") from None
    activity = RingActivity(own, span, entries, period, peers)
    return Digest(rank, world, taken, host, device, tuple(groups), activity)
