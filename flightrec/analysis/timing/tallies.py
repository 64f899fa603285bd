"""Late arrivals counted per rank and process group, over every group's newest collectives.

What the straggler and imbalance candidates read: for each group, its members' arrivals on
one clock and who arrived last by a clear margin (``lastarrivals.tally``), then per member
*of that group* how often and by how much. A rank is judged group by group: a rank late at
nearly all of one group's collectives is late there even when its other groups (a
tensor-parallel pair it keeps pace with, a world group where it is one of 64) dilute it.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.timing.clocks import HostArrivals, enqueue_arrivals, may_share
from flightrec.analysis.timing.lastarrivals import GroupTally, members_of, tally, tally_arrivals
from flightrec.analysis.timing.trend import median_rule
from flightrec.text import compress


@dataclass(slots=True)
class Tally:
    """One rank's arrivals at one group's (or, pooled, all its groups') recent collectives."""

    taken: int = 0
    last: int = 0
    late: list[float] = field(default_factory=list)
    """Margins (ms) behind the next-latest member, where it was last by a clear margin."""
    behind: list[float] = field(default_factory=list)
    """Arrival minus the other members' median arrival (ms), every collective."""
    waited_ns: int = 0
    delay_ns: int = 0
    groups: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    spread_ns: float = 0.0
    sizes: Counter[int] = field(default_factory=Counter)
    """Collectives taken part in, per member count of their group."""

    def add(self, other: Tally) -> None:
        """Pool ``other`` (another group's tally of the same rank) into this one."""
        self.taken += other.taken
        self.last += other.last
        self.late += other.late
        self.behind += other.behind
        self.waited_ns += other.waited_ns
        self.delay_ns += other.delay_ns
        self.groups += other.groups
        self.ops += other.ops
        self.spread_ns = max(self.spread_ns, other.spread_ns)
        self.sizes += other.sizes


@dataclass(frozen=True, slots=True)
class Pending:
    """What a group's tally leaves for the steps that only a finding needs."""

    group: str
    ranks: Sequence[int]
    """The members tallied, in rank order."""
    tally: GroupTally


@dataclass(frozen=True, slots=True)
class Tallied:
    """Every group's tally, per rank and group."""

    per_group: dict[tuple[int, str], Tally]
    """(rank, group key) -> its tally there (members that arrived late there at least once;
    ``add_evidence`` adds the others)."""
    pending: Sequence[Pending]
    assumed: Mapping[int, str]
    """Per rank compared by enqueue times alone, the assumption that made that possible."""

    def pooled(self) -> dict[int, Tally]:
        """Per rank tallied, its tallies over all its groups, pooled."""
        out: dict[int, Tally] = {}
        for (r, _), t in self.per_group.items():
            if r not in out:
                out[r] = Tally()
            out[r].add(t)
        return out


def _count(
    m: Matched,
    group: str,
    ranks: Sequence[int],
    gt: GroupTally,
    per: dict[tuple[int, str], Tally],
) -> Pending:
    """Add a group's tally (members ``ranks``) to the per-rank, per-group tallies: a tally
    only for the members that arrived late at least once (the others are never judged, and
    at 131,072 ranks most members of most groups are not)."""
    n = len(ranks)
    taken = len(gt.seqs)
    for i, j, margin in gt.late:
        r = ranks[j]
        tl = per.get((r, group))
        if tl is None:
            tl = per[(r, group)] = Tally(taken=taken, last=gt.lasts[j])
            tl.sizes[n] = taken
        tl.late.append(margin / 1e6)
        tl.waited_ns += margin * (n - 1)
        tl.delay_ns += margin
        tl.groups[group] += 1
        d = m.dump(r)
        tl.ops[d.string(d.columns["op"][gt.positions[j][i]])] += 1
    return Pending(group, ranks, gt)


def add_evidence(pending: Pending, blamed: set[int], per: dict[tuple[int, str], Tally]) -> None:
    """Per member, arrival minus the others' median (ms); per blamed rank, its clock jitter.

    Only a finding needs these: computed then, one comprehension per member and group.
    """
    gt = pending.tally
    n, taken = len(pending.ranks), len(gt.seqs)
    rows = [gt.arrivals[j] for j in range(n)]
    rules = [median_rule(sorted(col)) for col in zip(*rows, strict=True)]
    for j, (r, mine) in enumerate(zip(pending.ranks, rows, strict=True)):
        t = per.get((r, pending.group))
        if t is None:  # (never late there: tallied now, for the lateness table)
            t = per[(r, pending.group)] = Tally(taken=taken, last=gt.lasts[j])
            t.sizes[n] = taken
        t.behind.extend(
            [
                (a - (hi if a > t1 else (mid if a > t2 else lo))) / 1e6
                for a, (t1, hi, t2, mid, lo) in zip(mine, rules, strict=True)
            ]
        )
    for j, r in enumerate(pending.ranks):
        if gt.lasts[j] and r in blamed:
            t = per[(r, pending.group)]
            t.spread_ns = max(t.spread_ns, gt.spread(j))


def tally_groups(m: Matched, recent: int, floor_ns: float) -> Tallied:
    """Tally every group of two or more members over its newest ``recent`` collectives.

    Groups whose dumps record completions are lined up on one clock from them; groups whose
    dumps do not (PyTorch's gloo recorder) are compared by enqueue times, host by host.

    Args:
        m: the lined-up histories.
        recent: collectives per group looked at.
        floor_ns: the least margin behind the next-latest member that counts as late.
    """
    per: dict[tuple[int, str], Tally] = {}
    pending: list[Pending] = []
    assumed: dict[int, str] = {}
    windows: dict[int, tuple[array[int], array[int]]] = {}
    for key, info in m.groups.items():
        if len(info.ranks) < 2:
            continue
        if may_share(m, key, recent):
            ranks, members = members_of(m, key, recent, windows)
            gt = tally(members, floor_ns)
            if gt is not None:
                kept = [ranks[j] for j in gt.kept]
                pending.append(_count(m, key, kept, gt, per))
                continue
        # No completion times (PyTorch's gloo recorder): enqueue times, one host at a time.
        for ha in enqueue_arrivals(m, key, recent):
            ga = ha.arrivals
            pending.append(_count(m, key, ga.ranks, tally_arrivals(ga, floor_ns), per))
            for r in ga.ranks:
                assumed[r] = _assumption(ha)
    return Tallied(per, pending, assumed)


def _assumption(ha: HostArrivals) -> str:
    ranks = compress(ha.arrivals.ranks)
    where = f"on host {ha.host}" if ha.host else "on one host (their dumps do not name it)"
    return (
        f"compared by enqueue times alone (the dumps record no completion): assumes ranks "
        f"{ranks} {where} share one clock"
    )
