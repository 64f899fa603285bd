"""Put every rank's timestamps on one clock, estimated from the dumps themselves.

Each dump records times on its rank's monotonic clock, plus one anchor pair (wall and monotonic
time at dump) that maps them to that host's wall clock. Hosts' wall clocks disagree by
milliseconds (NTP), and drift apart slowly, which is as much as the lateness a straggler shows.
The dumps hold a better reference: a synchronous collective completes on all its members at
nearly the same moment, when the last one arrives. So for two ranks of one group, the
difference of their completion times of the same collective is their clock offset plus a
little jitter; its median over many collectives is robust against outliers (a rank descheduled
on its way out), and entries that never completed (hangs, failures) are simply not used.

Two levels are provided:

* ``group_arrivals``: per group and collective, each member's arrival on the clock of the
  group's anchor member: one robust offset per member when its completion differences are
  stable, else each collective aligned on its own completions, so slow drift between hosts
  over a long ring does not masquerade as lateness.
* ``estimate_offsets``: one constant offset per rank against a reference rank (groups chained
  through shared members), with its uncertainty, for timelines and reports.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from statistics import median
from typing import NamedTuple

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.matching.signature import Taker, taker
from flightrec.format import flightrec_pb2 as pb

_COMPLETED = pb.COMPLETED
# 1.4826 x median absolute deviation estimates a normal spread's sigma, ignoring outliers.
_MAD_SIGMA = 1.4826
# Completion differences of two ranks that vary less than this (sigma) are one constant offset.
STABLE_NS = 1_000_000
# Fewer shared completions than this cannot estimate an offset.
MIN_LINK_SAMPLES = 3


@dataclass(frozen=True, slots=True)
class GroupArrivals:
    """Members' arrivals at a group's completed collectives, on the anchor member's clock.

    Attributes:
        group: the group key.
        anchor: the member whose clock the others are aligned to.
        ranks: members with usable times, sorted.
        seqs: collectives completed by every one of ``ranks``, increasing.
        arrivals: per rank, arrival (enqueue) per collective, parallel to ``seqs`` (ns).
        completions: per rank, completion per collective on the same clock (ns).
        spread_ns: per rank, per-collective jitter of its completions against the anchor's:
            how far apart "simultaneous" completions are, i.e. how precisely arrivals compare.
        positions: per rank, ring positions parallel to ``seqs``.
    """

    group: str
    anchor: int
    ranks: tuple[int, ...]
    seqs: tuple[int, ...]
    arrivals: Mapping[int, Sequence[int]]
    completions: Mapping[int, Sequence[int]]
    spread_ns: Mapping[int, float]
    positions: Mapping[int, Sequence[int]]


@dataclass(frozen=True, slots=True)
class RankClock:
    """One rank's clock relative to the reference rank.

    Attributes:
        rank: global rank.
        offset_ns: add to nothing, subtract from the rank's wall-anchored time to get reference
            time (0 for the reference rank).
        uncertainty_ns: one-sigma error of ``offset_ns`` (standard errors summed along the
            chain of groups that links the rank to the reference).
        spread_ns: sigma of the per-collective completion differences on the last link.
        drift_ns: how much the completion differences moved over the ring (5th to 95th
            percentile): clock drift or steps, which a constant offset cannot follow.
        samples: completions the last link was estimated from.
        via: the rank it was linked through (itself for the reference).
    """

    rank: int
    offset_ns: int
    uncertainty_ns: float
    spread_ns: float
    drift_ns: int
    samples: int
    via: int


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    """Every rank's offset against one reference rank.

    Attributes:
        reference: the reference rank (lowest rank with completed collectives); -1 when none.
        clocks: per aligned rank.
        unaligned: ranks with a dump whose clock could not be linked (no shared completed
            collective); their wall-clock anchor is used as is.
    """

    reference: int
    clocks: Mapping[int, RankClock]
    unaligned: tuple[int, ...]

    def offset_ns(self, rank: int) -> int:
        """The rank's offset (0 when unaligned)."""
        c = self.clocks.get(rank)
        return c.offset_ns if c else 0

    @property
    def max_uncertainty_ns(self) -> float:
        """The largest offset uncertainty among aligned ranks."""
        return max((c.uncertainty_ns for c in self.clocks.values()), default=0.0)


def base_ns(m: Matched, rank: int) -> int:
    """What to add to ``rank``'s monotonic times to put them on its host's wall clock.

    0 when the dump has no wall-clock anchor: offsets then absorb the whole difference.
    """
    h = m.dump(rank).header
    return h.wall_time_ns - h.mono_time_ns if h.wall_time_ns and h.mono_time_ns else 0


@dataclass(frozen=True, slots=True)
class TimelineClock:
    """What puts every rank's monotonic times on one clock, for a timeline.

    Attributes:
        alignment: the offsets it applies.
        shift_ns: per rank with a dump, what to add to its monotonic ns: its host's wall-clock
            anchor minus its offset against the reference rank.
    """

    alignment: ClockAlignment
    shift_ns: Mapping[int, int]


def timeline(m: Matched, alignment: ClockAlignment) -> TimelineClock:
    """The per-rank shifts onto the aligned clock.

    Args:
        m: the lined-up histories.
        alignment: the ranks' offsets (``estimate_offsets``).

    Returns:
        The timeline clock of every rank with a dump.
    """
    shift = {r: base_ns(m, r) - alignment.offset_ns(r) for r in m.run.dumps}
    return TimelineClock(alignment, shift)


class Lane(NamedTuple):
    """One rank's newest completed collectives on one group, as parallel tuples.

    Seqs are increasing and distinct; times are on the rank's wall-anchored clock (ns).
    """

    seqs: tuple[int, ...]
    positions: tuple[int, ...]
    enqueue_ns: tuple[int, ...]
    complete_ns: tuple[int, ...]

    def at(self, seqs: tuple[int, ...]) -> Lane:
        """The lane restricted to ``seqs`` (each of which it holds), in that order."""
        if self.seqs == seqs:
            return self
        where = {s: i for i, s in enumerate(self.seqs)}
        take = itemgetter(*(where[s] for s in seqs))
        if len(seqs) == 1:
            return Lane(
                seqs, (take(self.positions),), (take(self.enqueue_ns),), (take(self.complete_ns),)
            )
        return Lane(seqs, take(self.positions), take(self.enqueue_ns), take(self.complete_ns))


Window = tuple[tuple[int, ...], tuple[int, ...], Taker, bool, frozenset[int]]
"""A group index's newest seqs, their positions, their gather, whether the seqs are in order,
and the positions as a set."""


def window_of(positions: Sequence[int], seqs: Sequence[int]) -> Window:
    """What ``lane`` needs of a group index's newest entries, worked out once per index."""
    seqs_t, pos = tuple(seqs), tuple(positions)
    # (C speed, unlike a loop over pairs)
    return (seqs_t, pos, taker(pos), seqs_t == tuple(sorted(set(seqs_t))), frozenset(pos))


def lane(
    enqueue_ns: Sequence[int],
    complete_ns: Sequence[int],
    state: Sequence[int],
    window: Window,
    base: int,
    incomplete: Sequence[int] | None = None,
) -> Lane | None:
    """One member's lane: the entries of ``window`` that completed with both times, the
    newest per seq, in increasing seq order, times plus ``base``; None when none did.

    Args:
        enqueue_ns: the member's ring's column.
        complete_ns: the same.
        state: the same.
        window: its group index's newest entries (``window_of``).
        base: added to its times (``base_ns``).
        incomplete: positions of its entries that did not complete, when known (else found
            from ``state``).
    """
    seqs, pos, take, ordered, held = window
    enq, comp = take(enqueue_ns), take(complete_ns)
    if incomplete is None:
        incomplete = tuple(p for p in pos if state[p] != _COMPLETED)
    if 0 in enq or 0 in comp or not held.isdisjoint(incomplete):
        # Usually what to leave out (outstanding, without both times) is the newest
        # entries: the rest is a prefix.
        out_of = set(incomplete)
        k = len(pos)
        while k and (pos[k - 1] in out_of or not enq[k - 1] or not comp[k - 1]):
            k -= 1
        if 0 in enq[:k] or 0 in comp[:k] or not out_of.isdisjoint(pos[:k]):
            # (not a prefix: entry by entry)
            keep = [i for i, p in enumerate(pos) if state[p] == _COMPLETED and comp[i] and enq[i]]
            if not keep:
                return None
            kept = taker(keep)
            seqs, pos, enq, comp = (tuple(kept(c)) for c in (seqs, pos, enq, comp))
            ordered = seqs == tuple(sorted(set(seqs)))
        else:
            seqs, pos, enq, comp = seqs[:k], pos[:k], enq[:k], comp[:k]
    if not seqs:
        return None
    if not ordered:
        # Repeated or unordered seqs (unnumbered entries): the newest entry of each seq.
        last = {s: i for i, s in enumerate(seqs)}
        keep = [last[s] for s in sorted(last)]
        seqs = tuple(sorted(last))
        pos = tuple(pos[i] for i in keep)
        enq = tuple(enq[i] for i in keep)
        comp = tuple(comp[i] for i in keep)
    return Lane(seqs, tuple(pos), tuple(map(base.__add__, enq)), tuple(map(base.__add__, comp)))


def completed_lanes(m: Matched, group: str, recent: int) -> dict[int, Lane]:
    """Per member of ``group``: its newest ``recent`` collectives that completed, as a lane.

    Members without a dump, or whose dump records no completion times, are left out. The work
    per member is a few C-speed gathers: this runs for every member of every group, which is
    64k lanes at 16,384 ranks.
    """
    out: dict[int, Lane] = {}
    # Ranks with equal rings share one group index (``rankindex.index_rank``): what depends
    # on the index alone (the window, its gather, whether its seqs are in order) is worked
    # out once per distinct index. (Keyed by identity: every index lives in ``m``.)
    windows: dict[int, Window] = {}
    dumps = m.run.dumps
    for r in m.groups[group].ranks:
        gi = m.index.get(r, {}).get(group)
        d = dumps.get(r)
        if gi is None or d is None or not gi.seqs or not d.completion_times:
            continue
        window = windows.get(id(gi))
        if window is None:
            window = windows[id(gi)] = window_of(gi.positions[-recent:], gi.seqs[-recent:])
        e = d.dump.entries
        got = lane(e.enqueue_ns, e.complete_ns, e.state, window, base_ns(m, r), m.incomplete.get(r))
        if got is not None:
            out[r] = got
    return out


def _median_sorted(ordered: Sequence[float]) -> float:
    """``statistics.median`` of an already sorted sequence."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _sigma(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mid = _median_sorted(sorted(values))
    return _MAD_SIGMA * _median_sorted(sorted([abs(v - mid) for v in values]))


def jitter_ns(diffs: Sequence[float]) -> float:
    """Per-collective disagreement of completions, free of slow drift.

    The spread of successive differences (divided by sqrt 2) measures the jitter of single
    completions whatever the clocks' drift does over the whole ring.
    """
    steps = list(map(operator.sub, diffs[1:], diffs[:-1]))
    return _sigma(steps) / math.sqrt(2) if len(steps) >= 2 else 0.0


def local_offsets(diffs: Sequence[int]) -> list[float]:
    """Offset per collective from the completion differences of two ranks.

    When the differences stay put (sigma under ``STABLE_NS``), one constant offset, their
    median: robust against single odd completions. When they wander (clock drift over a long
    ring, an NTP step), each collective is aligned on its own completion: the only reference
    that moves with the clocks.
    """
    if not diffs:
        return []
    if _sigma(diffs) < STABLE_NS:
        whole = float(median(diffs))
        return [whole] * len(diffs)
    return [float(d) for d in diffs]


def _shift(times: Sequence[int], offsets: float | list[float]) -> list[int]:
    """``times`` minus one constant offset, or minus an offset each (rounded to ns)."""
    if isinstance(offsets, float):
        if offsets.is_integer():  # (the usual median of integers: exact, in integers)
            return list(map(int(offsets).__rsub__, times))
        return list(map(round, map(offsets.__rsub__, times)))
    return [round(t - o) for t, o in zip(times, offsets, strict=True)]


class _Completions(Mapping[int, Sequence[int]]):
    """Per rank, aligned completion times, shifted when first asked for (rarely: the
    straggler pass reads arrivals only)."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Sequence[int], float | list[float]]] = {}

    def __getitem__(self, rank: int) -> Sequence[int]:
        return _shift(*self.pending[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self.pending)

    def __len__(self) -> int:
        return len(self.pending)


class _Spread(Mapping[int, float]):
    """Per rank ``jitter_ns`` of its completion differences, computed when first asked for.

    The straggler pass needs it only for the last two arrivals of each collective: computing
    it for every member of every group would be most of the pass at 16,384 ranks.
    """

    def __init__(self) -> None:
        self.diffs: dict[int, list[int]] = {}
        self._done: dict[int, float] = {}

    def __getitem__(self, rank: int) -> float:
        value = self._done.get(rank)
        if value is None:
            value = self._done[rank] = jitter_ns(self.diffs[rank])
        return value

    def __iter__(self) -> Iterator[int]:
        return iter(self.diffs)

    def __len__(self) -> int:
        return len(self.diffs)


def may_share(m: Matched, group: str, recent: int) -> bool:
    """Whether the members' newest ``recent`` seqs of ``group``, completed or not, have
    ``MIN_LINK_SAMPLES`` in common: when not, no lane needs building (the world group of a
    job read from its rings' tails, whose few world collectives each member holds)."""
    common: set[int] | None = None
    seen: Sequence[int] | None = None
    for r in m.groups[group].ranks:
        gi = m.index.get(r, {}).get(group)
        if gi is None or not gi.seqs:
            continue
        window = gi.seqs[-recent:]
        if window != seen:  # (most members hold the same window: one C comparison)
            seen = window
            common = set(window) if common is None else common.intersection(window)
            if len(common) < MIN_LINK_SAMPLES:
                return False
    return common is not None


def group_arrivals(m: Matched, group: str, recent: int = 256) -> GroupArrivals | None:
    """Arrivals of a group's members at the collectives all of them completed, on one clock.

    Args:
        m: the lined-up histories.
        group: group key.
        recent: newest completed collectives per member looked at.

    Returns:
        The aligned arrivals, or None when fewer than two members have ``MIN_LINK_SAMPLES``
        collectives in common.
    """
    if not may_share(m, group, recent):
        return None
    return align_lanes(group, completed_lanes(m, group, recent))


def align_lanes(group: str, lanes: Mapping[int, Lane]) -> GroupArrivals | None:
    """Members' lanes (keyed by rank) put on the clock of the lowest rank among them, at the
    seqs all of them hold; None when fewer than two lanes share ``MIN_LINK_SAMPLES`` seqs."""
    if len(lanes) < 2:
        return None
    # Most members hold the same window of seqs: intersect each distinct window once.
    common: set[int] | None = None
    seen: tuple[int, ...] | None = None
    for ln in lanes.values():
        if ln.seqs != seen:
            seen = ln.seqs
            common = set(seen) if common is None else common.intersection(seen)
    seqs = tuple(sorted(common or ()))
    if len(seqs) < MIN_LINK_SAMPLES:
        return None
    ranks = tuple(sorted(lanes))
    anchor = ranks[0]
    ref = lanes[anchor].at(seqs).complete_ns
    arrivals: dict[int, list[int]] = {}
    completions = _Completions()
    spread = _Spread()
    positions: dict[int, Sequence[int]] = {}
    for r in ranks:
        mine = lanes[r].at(seqs)
        diffs = list(map(operator.sub, mine.complete_ns, ref))
        # As local_offsets: one constant offset when the differences are steady. The MAD
        # sigma is at most 1.4826 x their range, so a small range (two C-speed passes)
        # settles it without the two sorts.
        if _MAD_SIGMA * (max(diffs) - min(diffs)) < STABLE_NS or _sigma(diffs) < STABLE_NS:
            offs: float | list[float] = float(_median_sorted(sorted(diffs)))
        else:
            offs = local_offsets(diffs)
        arrivals[r] = _shift(mine.enqueue_ns, offs)
        completions.pending[r] = (mine.complete_ns, offs)
        spread.diffs[r] = diffs
        positions[r] = mine.positions
    return GroupArrivals(group, anchor, ranks, seqs, arrivals, completions, spread, positions)


@dataclass(frozen=True, slots=True)
class HostArrivals:
    """Arrivals of a group's members on one host, from enqueue times alone."""

    host: str
    """The members' host name ("" when the dumps do not record it)."""
    arrivals: GroupArrivals
    """Their arrivals, as recorded: one host's ranks share one clock, so none is shifted."""


def enqueue_arrivals(m: Matched, group: str, recent: int = 256) -> list[HostArrivals]:
    """Arrivals of a group's members that record no completion, per host, as recorded.

    PyTorch's gloo recorder keeps only when each collective was issued (``time_created_ns``,
    the wall clock): no completion aligns clocks. Ranks on one host read one clock, so their
    enqueue times compare as they are; ranks of different hosts are never compared. A dump
    without a host name is taken as on the same host as the others without one.

    Args:
        m: the lined-up histories.
        group: group key.
        recent: newest collectives per member looked at.

    Returns:
        One entry per host with at least two such members sharing ``MIN_LINK_SAMPLES``
        collectives with enqueue times; members whose dumps record completion times are left out (see
        ``group_arrivals``).
    """
    by_host: dict[str, list[int]] = {}
    for r in m.groups[group].ranks:
        d = m.run.dumps.get(r)
        gi = m.index.get(r, {}).get(group)
        if d is None or gi is None or not gi.seqs or d.completion_times:
            continue
        by_host.setdefault(d.header.hostname, []).append(r)
    out: list[HostArrivals] = []
    for host, ranks in sorted(by_host.items()):
        if len(ranks) < 2:
            continue
        tables: dict[int, dict[int, int]] = {}
        for r in ranks:
            gi = m.index[r][group]
            enq = m.dump(r).dump.entries.enqueue_ns
            tables[r] = {
                s: p
                for s, p in zip(gi.seqs[-recent:], gi.positions[-recent:], strict=True)
                if s and enq[p]
            }
        common = set(tables[ranks[0]])
        for t in tables.values():
            common &= t.keys()
        seqs = tuple(sorted(common))
        if len(seqs) < MIN_LINK_SAMPLES:
            continue
        positions = {r: [tables[r][q] for q in seqs] for r in ranks}
        arrivals = {r: [m.dump(r).dump.entries.enqueue_ns[p] for p in positions[r]] for r in ranks}
        ga = GroupArrivals(
            group, ranks[0], tuple(ranks), seqs, arrivals, {}, dict.fromkeys(ranks, 0.0), positions
        )
        out.append(HostArrivals(host, ga))
    return out


def timing_notes(m: Matched) -> tuple[str, ...]:
    """What the dumps cannot say about time, in words, for the report.

    Returns:
        One note when no dump records when its operations were issued (nothing is timed:
        no wait, lateness or straggler can be measured), one naming the ranks whose dumps
        lack it when only some do; else none.
    """
    untimed = [
        r for r, d in sorted(m.run.dumps.items()) if len(d) and not any(d.dump.entries.enqueue_ns)
    ]
    if not untimed:
        return ()
    if len(untimed) == len(m.run.dumps):
        return (
            "timing is missing altogether: no dump records when its operations were issued, "
            "so waits, late arrivals and stragglers cannot be measured",
        )
    listed = ", ".join(map(str, untimed))
    return (f"no operation times in the dumps of ranks {listed}: they are left out of timing",)


@dataclass(frozen=True, slots=True)
class _Link:
    offset_ns: float
    stderr_ns: float
    spread_ns: float
    drift_ns: int
    samples: int


def _links(m: Matched, recent: int) -> dict[tuple[int, int], _Link]:
    """Offset of b against a for pairs (a, b) that share completed collectives."""
    links: dict[tuple[int, int], _Link] = {}
    for key in m.groups:
        lanes = completed_lanes(m, key, recent)
        if len(lanes) < 2:
            continue
        ranks = sorted(lanes)
        anchor = max(ranks, key=lambda r: (len(lanes[r].seqs), -r))
        mine = lanes[anchor]
        for r in ranks:
            if r == anchor or ((anchor, r) in links and links[(anchor, r)].samples >= recent):
                continue
            theirs = lanes[r]
            common = (
                theirs.seqs
                if theirs.seqs == mine.seqs
                else tuple(sorted(set(theirs.seqs).intersection(mine.seqs)))
            )
            if len(common) < MIN_LINK_SAMPLES:
                continue
            diffs = [
                c - a
                for c, a in zip(
                    theirs.at(common).complete_ns, mine.at(common).complete_ns, strict=True
                )
            ]
            spread = jitter_ns(diffs)
            # Standard error of a median: about 1.25 sigma / sqrt(n); a floor of 1 us keeps a
            # perfectly regular (simulated) spread from claiming infinite precision. Drift adds
            # its own sigma: a constant offset is only as good as the clocks are steady.
            wander = math.sqrt(max(0.0, _sigma(diffs) ** 2 - spread**2))
            stderr = 1.2533 * max(spread, 1_000.0) / math.sqrt(len(diffs)) + wander
            ordered = sorted(diffs)
            drift = ordered[(len(ordered) * 95) // 100 - 1] - ordered[len(ordered) // 20]
            link = _Link(float(median(diffs)), stderr, spread, drift, len(diffs))
            old = links.get((anchor, r))
            if old is None or link.stderr_ns < old.stderr_ns:
                links[(anchor, r)] = link
                links[(r, anchor)] = _Link(
                    -link.offset_ns, stderr, spread, link.drift_ns, link.samples
                )
    return links


def estimate_offsets(m: Matched, recent: int = 256) -> ClockAlignment:
    """One offset per rank against the reference rank, chained through shared groups.

    Ranks are linked to the anchor of each group they share; the chain to the reference
    is the one of least accumulated variance (Dijkstra over the links).

    Args:
        m: the lined-up histories.
        recent: newest completed collectives per rank and group used.

    Returns:
        The alignment; ranks that share no completed collective with the rest are listed as
        unaligned.
    """
    links = _links(m, recent)
    neighbours: dict[int, list[int]] = {}
    for a, b in links:
        neighbours.setdefault(a, []).append(b)
    if not neighbours:
        return ClockAlignment(-1, {}, tuple(sorted(m.run.dumps)))
    reference = min(neighbours)
    clocks: dict[int, RankClock] = {reference: RankClock(reference, 0, 0.0, 0.0, 0, 0, reference)}
    variance: dict[int, float] = {reference: 0.0}
    offset: dict[int, float] = {reference: 0.0}
    heap: list[tuple[float, int]] = [(0.0, reference)]
    done: set[int] = set()
    while heap:
        var, a = heapq.heappop(heap)
        if a in done:
            continue
        done.add(a)
        for b in neighbours[a]:
            link = links[(a, b)]
            v = var + link.stderr_ns**2
            if b not in done and v < variance.get(b, math.inf):
                variance[b] = v
                offset[b] = offset[a] + link.offset_ns
                clocks[b] = RankClock(
                    b,
                    round(offset[b]),
                    math.sqrt(v),
                    link.spread_ns,
                    link.drift_ns,
                    link.samples,
                    a,
                )
                heapq.heappush(heap, (v, b))
    unaligned = tuple(r for r in sorted(m.run.dumps) if r not in clocks)
    return ClockAlignment(reference, clocks, unaligned)


TIMELINE_RECENT = 256
"""Newest completed collectives per group that the timeline's clock alignment reads."""


class Clocks:
    """One run's clock alignment, estimated on first use and kept.

    Nothing here changes a finding: each value is a function of the lined-up histories alone,
    memoized so that the straggler candidate and a timeline renderer share one estimate, and
    so that the text and JSON reports never pay for it.

    Args:
        matched: the lined-up histories.
    """

    def __init__(self, matched: Matched) -> None:
        self.matched = matched
        self._alignments: dict[int, ClockAlignment] = {}

    def alignment(self, recent: int = TIMELINE_RECENT) -> ClockAlignment:
        """Every rank's clock offset, from its newest ``recent`` collectives per group.

        Args:
            recent: completed collectives per group to read.

        Returns:
            The alignment (computed once per ``recent``).
        """
        if recent not in self._alignments:
            self._alignments[recent] = estimate_offsets(self.matched, recent)
        return self._alignments[recent]

    @cached_property
    def timeline_clock(self) -> TimelineClock:
        """Each rank's shift from its monotonic clock to the aligned one, for timelines."""
        return timeline(self.matched, self.alignment(TIMELINE_RECENT))

    @cached_property
    def notes(self) -> tuple[str, ...]:
        """What the dumps cannot say that the report should (timing missing, for one)."""
        return timing_notes(self.matched)
