"""Line ranks' histories up: per process group by sequence number, P2P by peer pair.

One pass over each rank's packed columns builds small integer indexes (positions of each
group's entries, counters, incomplete entries); nothing here creates a Python object per
entry. Passes then materialise ``CollectiveRecord``s only where they look closely.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from flightrec.analysis.loader import Run
from flightrec.analysis.model import CollectiveRecord, GroupProgress, ProcessGroupInfo, RankDump
from flightrec.proto import flightrec_pb2 as pb

_COMPLETED = pb.COMPLETED
_IS_P2P = pb.IS_P2P
_SEND = pb.SEND


@dataclass(slots=True)
class RankGroupIndex:
    """Where one group's entries sit in one rank's ring."""

    seqs: list[int] = field(default_factory=list)
    """Collective seqs in ring order."""
    positions: list[int] = field(default_factory=list)
    """Entry positions, parallel to ``seqs``."""
    p2p_positions: list[int] = field(default_factory=list)
    """Positions of P2P entries on this group."""

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


@dataclass(frozen=True, slots=True)
class Matched:
    """Ranks' histories lined up by group."""

    run: Run
    groups: dict[str, ProcessGroupInfo]
    index: dict[int, dict[str, RankGroupIndex]]
    """Per rank, per group key."""
    memberships: dict[str, dict[tuple[int, ...], tuple[int, ...]]]
    """Per group key: each distinct member list -> the ranks whose dump says so."""
    p2p_counts: dict[tuple[str, int, int], tuple[int, int]]
    """(group, rank, peer) -> (sends issued to peer, receives issued from peer)."""
    incomplete: dict[int, tuple[int, ...]]
    """Per rank: positions of entries that did not complete (enqueued, started, failed)."""

    def dump(self, rank: int) -> RankDump:
        """The chosen dump of ``rank``."""
        return self.run.dumps[rank]

    def record(self, rank: int, group: str, seq: int) -> CollectiveRecord | None:
        """Rank's entry for collective ``seq`` on ``group``, if still in its ring."""
        gi = self.index.get(rank, {}).get(group)
        pos = gi.position_of(seq) if gi else None
        return None if pos is None else self.run.dumps[rank].record(pos)

    def last_seq(self, rank: int, group: str) -> int | None:
        """Collectives ``rank`` issued on ``group``; None when its dump lacks the group."""
        p = self.groups[group].progress.get(rank)
        return None if p is None else p.last_seq

    def last_completed_entry(self, rank: int) -> CollectiveRecord | None:
        """The newest entry of ``rank`` that completed, any group.

        For a dump that does not track completion, the newest entry it issued.
        """
        d = self.run.dumps[rank]
        if not d.tracks_completion:
            return d.record(len(d) - 1) if len(d) else None
        states = d.columns["state"]
        for i in range(len(d) - 1, -1, -1):
            if states[i] == _COMPLETED:
                return d.record(i)
        return None


def _progress(
    d: RankDump, local: int, gi: RankGroupIndex, incomplete: tuple[int, ...]
) -> GroupProgress:
    g = d.dump.groups[local]
    cols = d.columns
    last_seq = max(g.last_seq, gi.seqs[-1] if gi.seqs else 0)
    # Incomplete entries are few: look at those instead of the group's whole history.
    first_incomplete = min(
        (
            cols["seq"][p]
            for p in incomplete
            if cols["group"][p] == local and not cols["flags"][p] & _IS_P2P
        ),
        default=None,
    )
    last_completed = last_seq if first_incomplete is None else first_incomplete - 1
    if not d.tracks_completion:
        last_completed = -1
    return GroupProgress(last_seq, last_completed, gi.seqs[0] if gi.seqs else 0)


def _incomplete_positions(states: Sequence[int]) -> tuple[int, ...]:
    """Positions of entries that did not complete, found from the newest end.

    A healthy ring is almost all completed, with the few outstanding entries at its end: count
    them at C speed, then walk back only until all are found.
    """
    left = len(states) - states.count(_COMPLETED)
    found: list[int] = []
    i = len(states) - 1
    while left and i >= 0:
        if states[i] != _COMPLETED:
            found.append(i)
            left -= 1
        i -= 1
    return tuple(reversed(found))


def match(run: Run) -> Matched:
    """Index every rank's ring by group and merge the groups' views.

    Args:
        run: the loaded dumps, one per rank.

    Returns:
        The lined-up histories every analysis pass works from.
    """
    index: dict[int, dict[str, RankGroupIndex]] = {}
    incomplete: dict[int, tuple[int, ...]] = {}
    p2p_counts: dict[tuple[str, int, int], tuple[int, int]] = {}
    progress: dict[str, dict[int, GroupProgress]] = defaultdict(dict)
    members: dict[str, dict[tuple[int, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    meta: dict[str, tuple[str, str]] = {}
    for rank, d in run.dumps.items():
        keys = d.group_keys
        per_local = [RankGroupIndex() for _ in keys]
        cols = d.columns
        groups, seqs, flags, states = cols["group"], cols["seq"], cols["flags"], cols["state"]
        # One comprehension per group present (a handful) instead of a Python loop body per
        # entry: this pass touches every entry of every rank.
        # A stable sort by group keeps ring order inside each group.
        order = sorted(range(len(groups)), key=groups.__getitem__)
        has_p2p = any(f & _IS_P2P for f in set(flags))
        start = 0
        for local, count in sorted(Counter(groups).items()):
            gi = per_local[local]
            mine = order[start : start + count]
            start += count
            if has_p2p:
                gi.p2p_positions = [i for i in mine if flags[i] & _IS_P2P]
                gi.positions = [i for i in mine if not flags[i] & _IS_P2P]
            else:
                gi.positions = mine
            gi.seqs = [seqs[i] for i in gi.positions]
        incomplete[rank] = _incomplete_positions(states)
        per_key: dict[str, RankGroupIndex] = {}
        with_counters = {k for k, g in zip(keys, d.dump.groups, strict=True) if g.p2p}
        for local, key in enumerate(keys):
            g = d.dump.groups[local]
            gi = per_local[local]
            if key in per_key:  # the same group listed twice: merge, ring order preserved
                merged = per_key[key]
                merged.seqs += gi.seqs
                merged.positions += gi.positions
                merged.p2p_positions += gi.p2p_positions
                continue
            per_key[key] = gi
            progress[key][rank] = _progress(d, local, gi, incomplete[rank])
            members[key][tuple(g.ranks)].append(rank)
            meta.setdefault(key, (g.desc, g.backend))
            for pc in g.p2p:
                p2p_counts[(key, rank, pc.peer)] = (pc.sends, pc.recvs)
        # P2P counters may be absent (older or converted dumps): count what the ring holds.
        for key, gi in per_key.items():
            if not gi.p2p_positions or key in with_counters:
                continue
            counted: dict[tuple[int, bool], int] = {}
            for pos in gi.p2p_positions:
                ident = (cols["peer"][pos], bool(flags[pos] & _SEND))
                counted[ident] = max(counted.get(ident, 0), cols["p2p_seq"][pos])
            for (peer, is_send), n in counted.items():
                sends, recvs = p2p_counts.get((key, rank, peer), (0, 0))
                p2p_counts[(key, rank, peer)] = (
                    max(sends, n) if is_send else sends,
                    recvs if is_send else max(recvs, n),
                )
        index[rank] = per_key

    infos: dict[str, ProcessGroupInfo] = {}
    memberships: dict[str, dict[tuple[int, ...], tuple[int, ...]]] = {}
    for key, views in members.items():
        # The member list most ranks agree on; disagreement is reported by the mismatch pass.
        ranks = max(views.items(), key=lambda kv: (len(kv[1]), -len(kv[0])))[0]
        if not ranks:  # members unknown: the ranks that hold the group
            ranks = tuple(sorted(progress[key]))
        memberships[key] = {m: tuple(sorted(rs)) for m, rs in views.items()}
        desc, backend = meta[key]
        infos[key] = ProcessGroupInfo(key, desc, ranks, backend, dict(progress[key]))
    return Matched(run, infos, index, memberships, p2p_counts, incomplete)
