"""How deep to read each rank's ring: the tail, unless another rank is further behind than it.

The loader first reads only the newest entries of each flightrec dump (the tail section of
schema 1.3, ``flightrec.format.tail``). That holds what a hang diagnosis reads on nearly every
rank: the frontier where the members of a group stop agreeing is where the slowest member
is, and every rank is within a step or so of the others it shares a group with, because a
collective holds them together. Where a rank's tail does not reach back to where a member of
one of its groups (or its P2P peer) is, this module says so, and the loader reads that rank's
whole ring: a rank far ahead of a stalled peer, a group whose members issued very different
numbers of collectives, a sender whose receiver lags many messages behind.

What the tail alone cannot show is said in the README: passes that look back over history
(stragglers, skipped calls, a mismatch that did not hang) see the newest entries only.
"""

from __future__ import annotations

from collections.abc import Mapping

from flightrec.analysis.loading.rankindex import RankGroupIndex, RankIndex, index_rank
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.view import GroupView

_SEND = int(pb.SEND)

# Collectives before the slowest member's newest that the tail must also hold: its last
# completed one, which the waits and the progress table compare against.
_BEFORE_FRONTIER = 1


def needs_depth(dumps: Mapping[int, RankDump], indexes: Mapping[int, RankIndex]) -> list[int]:
    """Ranks whose loaded tail misses entries that a member of one of their groups is at.

    Args:
        dumps: one dump per rank; those with ``dump.older == 0`` are whole already.
        indexes: per rank, its ring's index when built (else built here).

    Returns:
        Sorted ranks to read whole.
    """
    if not any(d.dump.older for d in dumps.values()):
        return []
    low: dict[str, int] = {}
    sent: dict[tuple[str, int, int], int] = {}  # (group, sender, receiver) -> sends
    received: dict[tuple[str, int, int], int] = {}  # (group, sender, receiver) -> receives
    rows: dict[int, list[_Row]] = {}  # of the ranks read from their tail
    for r, d in dumps.items():
        ri = indexes.get(r) or index_rank(d)
        mine: list[_Row] = []
        for key, g, gi in zip(d.group_keys, d.dump.groups, ri.groups, strict=True):
            seqs = gi.seqs
            newest = max(g.last_seq, seqs[-1] if seqs else 0)
            if newest:
                old = low.get(key)
                if old is None or newest < old:
                    low[key] = newest
            for pc in g.p2p:
                sent[(key, r, pc.peer)] = pc.sends
                received[(key, pc.peer, r)] = pc.recvs
            mine.append((key, g, gi, newest))
        if d.dump.older:
            rows[r] = mine
    return sorted(r for r, mine in rows.items() if _short(r, dumps[r], mine, low, sent, received))


_Row = tuple[str, GroupView, RankGroupIndex, int]
"""A group of one rank: its key, as the dump lists it, its index, the newest seq issued."""


def _short(
    r: int,
    d: RankDump,
    rows: list[_Row],
    low: dict[str, int],
    sent: dict[tuple[str, int, int], int],
    received: dict[tuple[str, int, int], int],
) -> bool:
    """Whether rank ``r``'s tail misses a collective or P2P ordinal a peer is at."""
    for key, g, gi, newest in rows:
        floor = max(1, low.get(key, newest) - _BEFORE_FRONTIER)
        if newest >= floor:
            seqs = gi.seqs
            first = seqs[0] if seqs and seqs[0] > 0 else next((s for s in seqs if s > 0), None)
            if first is None or first > floor:
                return True
        if not g.p2p:
            continue
        behind = [
            (pc.peer, is_send, theirs)
            for pc in g.p2p
            for is_send, mine, theirs in (
                (True, pc.sends, received.get((key, r, pc.peer))),
                (False, pc.recvs, sent.get((key, pc.peer, r))),
            )
            if theirs is not None and theirs < mine  # level or ahead: the newest entries count
        ]
        if not behind:
            continue
        oldest: dict[tuple[int, bool], int] = {}
        cols = d.columns
        for pos in gi.p2p_positions:
            ident = (cols["peer"][pos], bool(cols["flags"][pos] & _SEND))
            ordinal = cols["p2p_seq"][pos]
            if ordinal and ordinal < oldest.get(ident, ordinal + 1):
                oldest[ident] = ordinal
        for peer, is_send, theirs in behind:
            first = oldest.get((peer, is_send))
            if first is None or first > max(1, theirs):
                return True
    return False
