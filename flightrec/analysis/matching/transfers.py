"""Sends and receives of wrapped rings, lined up by time.

A transfer pairs the n-th send from one rank to another with the n-th receive there. flightrec
dumps count both sides from the job's start (per-peer counters in the group table, and each
entry's ordinal), so n is the same number on both rings however much either overwrote. A ring
converted from PyTorch's recorder has no such counter: its ordinals are counted from the
oldest entry the ring still holds, and two rings that wrapped at different points number the
same transfer differently (one rank's 452nd send is its peer's 1st receive). Counted so, the
sends older than the peer's oldest entry look unmatched.

For those pairs the receiver's ordinals are shifted into the sender's numbering by the offset
that lines their times up: one transfer completes on both ends at nearly the same moment (and
both ends enter it within a step of each other). The offset tried first is the one that pairs
the two newest; a few either side are tried too, and the one whose paired times agree best
wins. Nothing older than either ring's oldest entry is then compared, and a pair whose times
cannot say is not judged at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import NamedTuple

from flightrec.analysis.loading.rankindex import RankGroupIndex
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb

_SEND = pb.SEND
_IS_P2P = pb.IS_P2P
_COMPLETED = pb.COMPLETED
SEARCH = 16
"""Offsets tried either side of the one that pairs the newest transfers."""
MIN_PAIRS = 3

Pair = tuple[str, int, int]
"""(group key, sender, receiver)."""


class Alignment(NamedTuple):
    """How the receivers' ordinals of ring-relative pairs map onto their senders'."""

    shift: Mapping[Pair, int]
    """Per pair: add to the receiver's ordinals (and receive count) to get the sender's."""
    unjudged: frozenset[Pair]
    """Pairs counted from wrapped rings whose times could not line them up: not compared."""


def ring_relative(d: RankDump) -> bool:
    """Whether the dump's P2P ordinals count from its ring's oldest entry rather than from
    the job's start: a converted native dump whose ring wrapped."""
    return d.converted and d.header.entries_recorded > len(d)


def _side(
    d: RankDump, gi: RankGroupIndex, peer: int, sending: bool, base: int
) -> list[tuple[int, int, int]]:
    """(ordinal, completion, enqueue) of the rank's sends to (receives from) ``peer`` in its
    ring, wall-anchored (0 where a time is missing)."""
    cols = d.columns
    e = d.dump.entries
    out: list[tuple[int, int, int]] = []
    for p in gi.p2p_positions:
        f = cols["flags"][p]
        if not f & _IS_P2P or bool(f & _SEND) != sending or cols["peer"][p] != peer:
            continue
        done = e.complete_ns[p] if e.state[p] == _COMPLETED and e.complete_ns[p] else 0
        enq = e.enqueue_ns[p]
        out.append((cols["p2p_seq"][p], done + base if done else 0, enq + base if enq else 0))
    return out


def _offset(sends: list[tuple[int, int, int]], recvs: list[tuple[int, int, int]]) -> int | None:
    """The shift of the receives' ordinals whose paired times agree best; None when no
    shift pairs ``MIN_PAIRS`` transfers with times."""
    if not sends or not recvs:
        return None
    by_ordinal = {o: (c, q) for o, c, q in recvs}
    guess = max(o for o, _, _ in sends) - max(by_ordinal)
    best: tuple[float, int, int] | None = None
    for delta in range(guess - SEARCH, guess + SEARCH + 1):
        diffs: list[int] = []
        for o, c, q in sends:
            theirs = by_ordinal.get(o - delta)
            if theirs is None:
                continue
            tc, tq = theirs
            if c and tc:
                diffs.append(abs(c - tc))
            elif q and tq:
                diffs.append(abs(q - tq))
        if len(diffs) < MIN_PAIRS:
            continue
        key = (float(median(diffs)), abs(delta - guess), delta)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def align(
    dumps: Mapping[int, RankDump],
    index: Mapping[int, Mapping[str, RankGroupIndex]],
    counts: Mapping[Pair, tuple[int, int]],
    base: Mapping[int, int],
) -> Alignment:
    """Line up the pairs that a ring-relative dump takes part in (see the module's doc).

    Args:
        dumps: per rank, its dump.
        index: per rank and group key, its group index.
        counts: (group, rank, peer) -> (sends to peer, receives from peer), as counted.
        base: per rank, what puts its times on its host's wall clock.

    Returns:
        The shifts, and the pairs left unjudged.
    """
    relative = {r for r, d in dumps.items() if ring_relative(d)}
    if not relative:
        return Alignment({}, frozenset())
    shift: dict[Pair, int] = {}
    unjudged: set[Pair] = set()
    pairs = {(g, a, b) for (g, a, b) in counts if a in dumps and b in dumps}
    for g, a, b in sorted(pairs):
        if a not in relative and b not in relative:
            continue
        # Both directions of the pair: a sends to b, and b to a.
        for sender, receiver in ((a, b), (b, a)):
            key = (g, sender, receiver)
            if key in shift or key in unjudged:
                continue
            gs, gr = index[sender].get(g), index[receiver].get(g)
            if gs is None or gr is None:
                continue
            sends = _side(dumps[sender], gs, receiver, True, base[sender])
            recvs = _side(dumps[receiver], gr, sender, False, base[receiver])
            if not sends and not recvs:
                continue
            delta = _offset(sends, recvs)
            if delta is None:
                unjudged.add(key)
            else:
                shift[key] = delta
    return Alignment(shift, frozenset(unjudged))
