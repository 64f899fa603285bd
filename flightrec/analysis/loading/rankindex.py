"""Everything about one rank that needs no other rank: where each group's entries sit in its
ring, which entries are incomplete, and a fingerprint of each group's operation sequence.

Built right after a dump is read, in the loader's worker processes, so that the per-entry work
of a 16,384-rank job is spread over the CPUs; the analysing process only merges these small
per-rank indexes. Positions and seqs are typed arrays (a few bytes per entry).
"""

from __future__ import annotations

import hashlib
import operator
import pickle
import sys
from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from flightrec.analysis.matching.signature import RawSignature, raw_signatures, resolve, taker
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb

_COMPLETED = pb.COMPLETED
_IS_P2P = pb.IS_P2P

# Signature ids are kept one byte per entry; a group with more distinct signatures than this
# in one ring is compared entry by entry instead.
_MAX_LOCAL_SIGNATURES = 255


def _compact(values: Sequence[int]) -> array[int]:
    for code in ("H", "I", "Q"):
        try:
            return array(code, values)
        except OverflowError:
            continue
    raise OverflowError("value does not fit 64 bits")


@dataclass(slots=True)
class RankGroupIndex:
    """Where one group's entries sit in one rank's ring."""

    seqs: Sequence[int] = field(default_factory=list)
    """Collective seqs in ring order."""
    positions: Sequence[int] = field(default_factory=list)
    """Entry positions, parallel to ``seqs``."""
    p2p_positions: Sequence[int] = field(default_factory=list)
    """Positions of P2P entries on this group."""
    signature_ids: bytes | None = None
    """Per collective entry (parallel to ``seqs``): an id into ``RankIndex.signatures``; None
    when the ring holds too many distinct signatures for one byte each."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # A constructor call: the dataclass default (a state dict walked field by field)
        # costs three times as much, once per group of every rank the loader hands over.
        return (RankGroupIndex, (self.seqs, self.positions, self.p2p_positions, self.signature_ids))

    def position_of(self, seq: int) -> int | None:
        """Ring position of collective ``seq``, if still in the ring."""
        # Seqs are increasing in ring order, so the entry sits at a fixed offset from the first.
        if not self.seqs:
            return None
        i = seq - self.seqs[0]
        if 0 <= i < len(self.seqs) and self.seqs[i] == seq:
            return self.positions[i]
        for s, p in zip(self.seqs, self.positions, strict=True):  # a gap: fall back
            if s == seq:
                return p
        return None

    @property
    def contiguous(self) -> bool:
        """Seqs run first, first + 1, ... with no gap and no unnumbered (seq 0) entry."""
        return (
            bool(self.seqs)
            and self.seqs[0] > 0
            and self.seqs[-1] - self.seqs[0] + 1 == len(self.seqs)
        )


@dataclass(frozen=True, slots=True)
class RankIndex:
    """One rank's ring, indexed by local group."""

    groups: tuple[RankGroupIndex, ...]
    """Per local group index of the dump."""
    incomplete: tuple[int, ...]
    """Positions of entries that did not complete (enqueued, started, failed)."""
    signatures: tuple[tuple[Hashable, ...], ...]
    """Signature id -> the compared fields' values (see ``signature.FIELDS``)."""
    shared: bytes | None = None
    """Names ``groups`` and ``signatures`` when other ranks' indexes may share them (a digest
    of what they were built from): a process that receives indexes from several loader
    processes shares equal ones again (``RankIndex.intern``)."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (
            RankIndex,
            (self.groups, self.incomplete, self.signatures, self.shared),
        )  # (as above)

    def intern(self, seen: dict[bytes, RankIndex]) -> RankIndex:
        """This index sharing ``groups`` and ``signatures`` with an equal one in ``seen``
        (which it joins when it is the first)."""
        if self.shared is None:
            return self
        first = seen.setdefault(self.shared, self)
        if first is self or first.groups is self.groups:
            return self
        return RankIndex(first.groups, self.incomplete, first.signatures, self.shared)


def incomplete_positions(states: Sequence[int]) -> tuple[int, ...]:
    """Positions of entries that did not complete, found from the newest end.

    A healthy ring is almost all completed, with the few outstanding entries at its end: count
    them at C speed, then walk back only until all are found.
    """
    left = len(states) - states.count(_COMPLETED)  # type: ignore[attr-defined]
    found: list[int] = []
    i = len(states) - 1
    while left and i >= 0:
        if states[i] != _COMPLETED:
            found.append(i)
            left -= 1
        i -= 1
    return tuple(reversed(found))


# _ONLY[v] maps byte v to 1 and every other byte to 0.
_ONLY = [bytes(v) + b"\x01" + bytes(255 - v) for v in range(256)]


_HAS_BITS: dict[int, bytes] = {}


def _mask(col: Sequence[int], bits: int) -> Sequence[int]:
    """Per value of ``col``: nonzero when it has any of ``bits`` (C speed either way)."""
    if getattr(col, "typecode", "") == "B":
        table = _HAS_BITS.get(bits)
        if table is None:
            table = _HAS_BITS[bits] = bytes(int(bool(b & bits)) for b in range(256))
        data: bytes = col.tobytes()  # type: ignore[attr-defined]
        return data.translate(table)
    return list(map(bits.__and__, col))


_KEYED = ("op", "reduce_op", "peer", "inputs", "outputs", "flags")
_OBJECT_API = int(pb.OBJECT_API)
_KEEP_OBJECT_API = bytes(b & _OBJECT_API for b in range(256))
assert _OBJECT_API < 256


def _raw_keys(d: RankDump) -> tuple[Sequence[Hashable], Callable[[Any], RawSignature]]:
    """Every entry's raw signature, and how to turn one back into ``RawSignature``.

    When the compared columns are one byte each, peers two (the usual case, up to 32,767
    ranks), an entry's raw signature is those seven bytes laid side by side in one 64-bit
    number: built by strided C copies, no tuple per entry, and hashed as an int.
    """
    cols = d.columns
    codes = [getattr(cols[name], "typecode", "") for name in _KEYED]
    if any(code != "B" for i, code in enumerate(codes) if i != 2) or codes[2] not in "BbhH":
        return raw_signatures(d, range(len(cols["op"]))), _same
    signed_peer = codes[2] != "H"
    peers = cols["peer"] if codes[2] in "hH" else array("h", cols["peer"])
    peer_bytes = peers.tobytes()
    blob = bytearray(8 * len(cols["op"]))
    blob[0::8] = cols["op"].tobytes()
    blob[1::8] = cols["reduce_op"].tobytes()
    blob[2::8] = peer_bytes[0::2]  # the peer's two bytes in native order
    blob[3::8] = peer_bytes[1::2]
    blob[4::8] = cols["inputs"].tobytes()
    blob[5::8] = cols["outputs"].tobytes()
    blob[6::8] = cols["flags"].tobytes().translate(_KEEP_OBJECT_API)

    def decode(key: int) -> RawSignature:
        b = key.to_bytes(8, sys.byteorder)
        peer = int.from_bytes(b[2:4], sys.byteorder, signed=signed_peer)
        return (b[0], b[1], peer, b[4], b[5], b[6])

    return memoryview(blob).cast("Q"), decode


def _same(raw: RawSignature) -> RawSignature:
    return raw


# Resolved signatures by (tables, raw signature), per loader process: ranks whose dumps hold
# the same table bytes resolve a raw signature alike (``DumpView.tables``). Bounded.
_RESOLVED: dict[tuple[bytes, RawSignature], tuple[Hashable, ...]] = {}
_MAX_RESOLVED = 1 << 16


def _resolve(d: RankDump, raw: RawSignature) -> tuple[Hashable, ...]:
    tables = d.dump.tables
    if tables is None:
        return resolve(d, raw)
    key = (tables, raw)
    found = _RESOLVED.get(key)
    if found is None:
        found = resolve(d, raw)
        if len(_RESOLVED) < _MAX_RESOLVED:
            _RESOLVED[key] = found
    return found


# The columns an index is built from (besides ``state``, which only gives ``incomplete``).
_INDEXED = ("group", "seq", "flags", *_KEYED[:-1])

# Per loader process: (tables, group count, the indexed columns' type codes and bytes) ->
# (groups, signatures) of the index built from them. Ranks of one job that play the same part
# and dumped at the same point (every rank waiting in the collective a hang stopped) hold the
# same sequence of collectives in their rings' tails, byte for byte; their indexes are equal,
# and are then shared. Bounded; never holds dumps whose tables are not known by their bytes.
_Built = tuple[tuple[RankGroupIndex, ...], tuple[tuple[Hashable, ...], ...], bytes | None]
_BUILT: dict[tuple[object, ...], _Built] = {}
_MAX_BUILT = 4096


_ZERO_ONLY = bytes([1] + [0] * 255)


def _content_key(d: RankDump) -> tuple[object, ...] | None:
    """What ``index_rank`` reads of ``d`` besides its states, as one key; None: not keyable.

    A P2P entry's peer is left out (the index keeps only its position): the peers of P2P
    entries differ from rank to rank where the rest is alike (a pipeline stage's neighbours).
    """
    tables = d.dump.tables
    cols = d.columns
    if tables is None or any(not hasattr(cols[name], "typecode") for name in _INDEXED):
        return None  # (a column that is not a typed array)
    parts: list[object] = [tables, len(d.dump.groups)]
    for name in _INDEXED:
        col = cols[name]
        if name == "peer":
            p2p = _mask(cols["flags"], _IS_P2P)
            if any(p2p):
                kept = bytes(p2p).translate(_ZERO_ONLY)  # 1 where not P2P
                col = array(col.typecode, compress(col, kept))  # type: ignore[attr-defined]
        parts.append(col.typecode)  # type: ignore[attr-defined]
        parts.append(col.tobytes())  # type: ignore[attr-defined]
    return tuple(parts)


def index_rank(d: RankDump) -> RankIndex:
    """Index one rank's ring by local group and fingerprint each group's sequence.

    Ranks whose indexed columns and tables are equal byte for byte share one index
    (``_BUILT``); a shared ``RankGroupIndex`` must never be changed in place.

    Args:
        d: the rank's dump.

    Returns:
        Positions, seqs and signature ids per local group, plus the incomplete entries.
    """
    incomplete = incomplete_positions(d.columns["state"])
    key = _content_key(d)
    built = _BUILT.get(key) if key is not None else None
    if built is None:
        groups, signatures = _build(d)
        # Named by its content, so that equal indexes built in different processes share.
        name = None if key is None else hashlib.blake2b(pickle.dumps(key), digest_size=16).digest()
        built = (groups, signatures, name)
        if key is not None:
            if len(_BUILT) >= _MAX_BUILT:
                _BUILT.clear()
            _BUILT[key] = built
    return RankIndex(built[0], incomplete, built[1], built[2])


def _build(
    d: RankDump,
) -> tuple[tuple[RankGroupIndex, ...], tuple[tuple[Hashable, ...], ...]]:
    """``index_rank``'s groups and signatures, built from ``d``'s columns."""
    cols = d.columns
    groups, seqs, flags = cols["group"], cols["seq"], cols["flags"]
    per_local = [RankGroupIndex() for _ in d.dump.groups]
    # Everything per entry runs in C: selections are ``compress`` over ``map``s of bound
    # methods, gathers are ``itemgetter``s. This runs for every rank of the job.
    p2p = _mask(flags, _IS_P2P)
    has_p2p = any(p2p)
    everyone = range(len(groups))
    # One-byte group indices (the usual case): each group's selection is one C translate.
    group_bytes = groups.tobytes() if getattr(groups, "typecode", "") == "B" else None
    raw_all: Sequence[Hashable] | None = None
    signatures: dict[tuple[Hashable, ...], int] = {}
    for local in sorted(set(groups)):
        if local >= len(per_local):
            continue
        gi = per_local[local]
        if group_bytes is not None:
            selected: Iterable[object] = group_bytes.translate(_ONLY[local])
        else:
            selected = map(local.__eq__, groups)
        positions = list(compress(everyone, selected))
        if has_p2p:
            kinds = taker(positions)(p2p)
            gi.p2p_positions = _compact(list(compress(positions, kinds)))
            positions = list(compress(positions, map(operator.not_, kinds)))
        gi.positions = _compact(positions)
        if not positions:
            gi.seqs = _compact([])
            gi.signature_ids = b"" if len(signatures) <= _MAX_LOCAL_SIGNATURES else None
            continue
        take = taker(positions)
        gi.seqs = _compact(take(seqs))
        if raw_all is None:
            raw_all, decode = _raw_keys(d)
        raws = take(raw_all)
        ids: dict[Hashable, int] = {}
        for raw in set(raws):
            ids[raw] = signatures.setdefault(_resolve(d, decode(raw)), len(signatures))
        if len(signatures) <= _MAX_LOCAL_SIGNATURES:
            gi.signature_ids = bytes(map(ids.__getitem__, raws))
    if len(signatures) > _MAX_LOCAL_SIGNATURES:
        for gi in per_local:
            gi.signature_ids = None
    return tuple(per_local), tuple(signatures)
