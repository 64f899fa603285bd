"""Line ranks' histories up: per process group by sequence number, P2P by peer pair.

Each rank's ring is indexed on its own (``rankindex``, in the loader's workers); this merges
those small per-rank indexes into per-group views, with no Python work per entry. Passes then materialise ``CollectiveRecord``s only where they look closely.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from flightrec.analysis.loading.loader import Run
from flightrec.analysis.loading.rankindex import RankGroupIndex, incomplete_positions, index_rank
from flightrec.analysis.matching.failed import settle_failed_calls
from flightrec.analysis.matching.transfers import Alignment, align
from flightrec.analysis.model import CollectiveRecord, GroupProgress, ProcessGroupInfo, RankDump
from flightrec.format import flightrec_pb2 as pb

_COMPLETED = pb.COMPLETED
_IS_P2P = pb.IS_P2P
_SEND = pb.SEND


UNDESCRIBED = "undefined"
"""torch's description of a group created without one."""


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
    signatures: dict[int, tuple[tuple[Hashable, ...], ...]] = field(default_factory=dict)
    """Per rank: signature id -> compared values, for ``RankGroupIndex.signature_ids``."""
    transfers: Alignment = field(default_factory=lambda: Alignment({}, frozenset()))
    """How ring-relative P2P ordinals line up (``transfers.align``): every cross-rank use of
    an ordinal goes through ``sender_ordinal``."""
    _p2p_at: dict[tuple[int, str, int, bool], dict[int, int]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def sender_ordinal(self, group: str, sender: int, receiver: int, n: int) -> int:
        """The receiver's ordinal ``n`` of a receive from ``sender``, in the sender's
        numbering (the same number unless a ring-relative dump shifted it)."""
        return n + self.transfers.shift.get((group, sender, receiver), 0)

    def judged(self, group: str, sender: int, receiver: int) -> bool:
        """Whether the transfers from ``sender`` to ``receiver`` can be compared (not two
        wrapped rings whose times could not line them up)."""
        return (group, sender, receiver) not in self.transfers.unjudged

    def received(self, group: str, sender: int, receiver: int) -> int:
        """Receives from ``sender`` that ``receiver`` issued, in the sender's numbering."""
        recvs = self.p2p_counts.get((group, receiver, sender), (0, 0))[1]
        return self.sender_ordinal(group, sender, receiver, recvs)

    def p2p_position(self, rank: int, group: str, peer: int, sending: bool, n: int) -> int | None:
        """Position in ``rank``'s ring of its send to (receive from) ``peer`` on ``group``
        whose ordinal is ``n`` in the sender's numbering; None when its ring lacks it."""
        key = (rank, group, peer, sending)
        table = self._p2p_at.get(key)
        if table is None:
            table = {}
            d = self.run.dumps.get(rank)
            gi = self.index.get(rank, {}).get(group)
            if d is not None and gi is not None:
                cols = d.columns
                flags, peers, ordinals = cols["flags"], cols["peer"], cols["p2p_seq"]
                for pos in gi.p2p_positions:
                    if peers[pos] == peer and bool(flags[pos] & _SEND) == sending:
                        o = ordinals[pos]
                        table[o if sending else self.sender_ordinal(group, peer, rank, o)] = pos
            self._p2p_at[key] = table
        return table.get(n)

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
    # Keyed by the member list's identity: dumps share one tuple per distinct list (see
    # model.intern_ranks), and hashing a 16,384-rank list once per rank would cost seconds.
    by_list: dict[str, dict[int, tuple[tuple[int, ...], list[int]]]] = defaultdict(dict)
    guessed: dict[str, dict[int, tuple[tuple[int, ...], list[int]]]] = defaultdict(dict)
    meta: dict[str, tuple[str, str]] = {}
    signatures: dict[int, tuple[tuple[Hashable, ...], ...]] = {}
    # Ranks with equal rings share their group indexes (``rankindex.index_rank``: the same
    # group, seq and flags columns), so a group's progress follows from the shared index and
    # what differs per rank: its newest seq as the dump states it, its incomplete entries and
    # whether it tracks completion. Worked out once per distinct combination.
    progress_of: dict[tuple[int, int, int, tuple[int, ...], bool], GroupProgress] = {}
    # Collectives an exception came out of that read as finished: failed (``failed``).
    failed = settle_failed_calls(run.dumps)
    for rank, d in run.dumps.items():
        keys = d.group_keys
        # Built by the loader's workers; dumps assembled in memory are indexed here.
        ri = run.indexes.get(rank) or index_rank(d)
        per_local = ri.groups
        incomplete[rank] = (
            incomplete_positions(d.columns["state"]) if rank in failed else ri.incomplete
        )
        signatures[rank] = ri.signatures
        per_key: dict[str, RankGroupIndex] = {}
        with_counters = {k for k, g in zip(keys, d.dump.groups, strict=True) if g.p2p}
        for local, key in enumerate(keys):
            g = d.dump.groups[local]
            gi = per_local[local]
            if key in per_key:  # the same group listed twice: merge, ring order preserved
                # (a new index: ranks with equal rings share theirs, see ``index_rank``)
                was = per_key[key]
                per_key[key] = RankGroupIndex(
                    [*was.seqs, *gi.seqs],
                    [*was.positions, *gi.positions],
                    [*was.p2p_positions, *gi.p2p_positions],
                    None,  # ids of two tables; compared entry by entry
                )
                continue
            per_key[key] = gi
            known = (id(gi), local, g.last_seq, incomplete[rank], d.tracks_completion)
            got = progress_of.get(known)
            if got is None:
                got = progress_of[known] = _progress(d, local, gi, incomplete[rank])
            progress[key][rank] = got
            ranks_of = tuple(g.ranks)  # the shared tuple itself (tuple() of a tuple is a no-op)
            # A member list rebuilt from one rank's own native dump (gloo's name none) is a
            # guess: it counts only where no dump of the group knows its members.
            lists = by_list[key] if g.members_known else guessed[key]
            seen = lists.get(id(ranks_of))
            if seen is None:
                lists[id(ranks_of)] = (ranks_of, [rank])
            else:
                seen[1].append(rank)
            meta.setdefault(key, (g.desc, g.backend))
            for pc in g.p2p:
                p2p_counts[(key, rank, pc.peer)] = (pc.sends, pc.recvs)
        # P2P counters may be absent (older or converted dumps): count what the ring holds.
        for key, gi in per_key.items():
            if gi.p2p_positions and key not in with_counters:
                _count_ring_p2p(d, rank, key, gi, p2p_counts)
        index[rank] = per_key

    infos, memberships = _group_infos(by_list, guessed, progress, meta)
    base = {
        r: (h.wall_time_ns - h.mono_time_ns if h.wall_time_ns and h.mono_time_ns else 0)
        for r, d in run.dumps.items()
        for h in (d.header,)
    }
    transfers = align(run.dumps, index, p2p_counts, base)
    return Matched(run, infos, index, memberships, p2p_counts, incomplete, signatures, transfers)


def _count_ring_p2p(
    d: RankDump,
    rank: int,
    key: str,
    gi: RankGroupIndex,
    p2p_counts: dict[tuple[str, int, int], tuple[int, int]],
) -> None:
    """Count ``rank``'s sends and receives on group ``key`` from its ring, for a dump without
    P2P counters: the highest per-pair ordinal of each direction."""
    counted: dict[tuple[int, bool], int] = {}
    cols = d.columns
    flags = cols["flags"]
    for pos in gi.p2p_positions:
        ident = (cols["peer"][pos], bool(flags[pos] & _SEND))
        counted[ident] = max(counted.get(ident, 0), cols["p2p_seq"][pos])
    for (peer, is_send), n in counted.items():
        sends, recvs = p2p_counts.get((key, rank, peer), (0, 0))
        p2p_counts[(key, rank, peer)] = (
            max(sends, n) if is_send else sends,
            recvs if is_send else max(recvs, n),
        )


_Lists = dict[str, dict[int, tuple[tuple[int, ...], list[int]]]]
"""Per group key, per member list (by the shared tuple's identity): the list and its holders."""


def _group_infos(
    by_list: _Lists,
    guessed: _Lists,
    progress: Mapping[str, dict[int, GroupProgress]],
    meta: Mapping[str, tuple[str, str]],
) -> tuple[dict[str, ProcessGroupInfo], dict[str, dict[tuple[int, ...], tuple[int, ...]]]]:
    """Every group's info, members as most ranks list them; and per group, which ranks hold
    which member list (a guessed list counts only where no dump knows the group's members)."""
    for key, lists in guessed.items():
        if key not in by_list:
            by_list[key] = lists
    infos: dict[str, ProcessGroupInfo] = {}
    memberships: dict[str, dict[tuple[int, ...], tuple[int, ...]]] = {}
    members: dict[str, dict[tuple[int, ...], list[int]]] = {}
    for key, lists in by_list.items():
        views: dict[tuple[int, ...], list[int]] = {}
        for ranks_of, holders in lists.values():
            views.setdefault(ranks_of, []).extend(holders)
        members[key] = views
    for key, views in members.items():
        # The member list most ranks agree on; disagreement is reported by the mismatch pass.
        ranks = max(views.items(), key=lambda kv: (len(kv[1]), -len(kv[0])))[0]
        if not ranks:  # members unknown: the ranks that hold the group
            ranks = tuple(sorted(progress[key]))
        memberships[key] = {m: tuple(sorted(rs)) for m, rs in views.items()}
        desc, backend = meta[key]
        # torch describes every group made without a group_desc (new_subgroups*, most
        # new_group calls) as "undefined": that names nothing, so the members name it instead.
        desc = "" if desc == UNDESCRIBED else desc
        infos[key] = ProcessGroupInfo(key, desc, ranks, backend, dict(progress[key]))
    return infos, memberships
