"""Who is slow and who only waits: each rank's time outside communication, compared among
ranks that do the same work, and the chains of waits that lead from a late rank to the
rank that held it up.

A rank that arrives last at its data-parallel collectives is slow itself only when it spends
longer outside communication (computing) than the ranks of its pipeline stage; otherwise
it spent the difference inside operations, waiting: on a tensor-parallel peer, on the send
of the stage before it. Three shapes of slowness follow:

* **a slow worker**: one rank's own time stands out among its stage's (``slow_workers``);
  the ranks it holds up wait on it, directly or down the pipeline (``head_of``);
* **a slow stage**: every rank of one stage spends longer outside communication than the
  ranks of the other stages (stage imbalance, ``slow_stages``): no single rank;
* **spread imbalance**: neither, yet ranks doing the same work keep waiting for each other
  (``findings.imbalance``).

Own time is ``format.activity.gaps`` over each rank's newest ``WINDOW`` entries, on its own
clock (no alignment needed). Where a dump records no completion times (PyTorch's recorder
without timing), an operation's completion is taken as the latest arrival of its
participants, which needs their clocks to agree: done only for ranks on one host (or whose
dumps name none), as the straggler pass assumes for enqueue times; elsewhere own time is not
measured, and the report says so.

Everything is worked out on first use, for the ranks asked about (at 131,072 ranks, a
sample of each stage and the few ranks found late).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import median
from typing import NamedTuple

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.timing.clocks import base_ns
from flightrec.analysis.timing.stages import Stages, find_stages
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.activity import WINDOW, gaps, own_time, signature, step_period

SAMPLE = 16
"""Ranks per stage whose own time sets the stage's typical value (evenly spread)."""
MIN_KNOWN = 0.5
"""Share of a window's entries that must have a completion (recorded or inferred)."""
SLOW_FACTOR = 1.3
"""A worker (a stage) is slow when its own time is at least this many times its
stage's others' (the other stages')."""
MIN_EXCESS = 0.03
"""... and exceeds it by at least this share of the time (3%)."""
OUTLIER_SIGMAS = 4.0
"""... and, in a stage of more than three ranks, stands this many robust sigmas above them."""
STAGE_MEMBERS = 2 / 3
"""A slow stage: at least this share of its ranks spend longer outside communication than
the other stages' typical rank by ``STAGE_MEMBER_FACTOR``."""
STAGE_MEMBER_FACTOR = 1.15
CHAIN_SHARE = 0.2
"""A wait chain follows the peers a rank waited on for at least this share of its waiting."""
MAX_HOPS = 64

_IS_P2P = pb.IS_P2P
_SEND = pb.SEND
_ASYNC = pb.ASYNC_OP
_COMPLETED = pb.COMPLETED
_MAD_SIGMA = 1.4826


class _Window(NamedTuple):
    """A rank's newest entries as the own-time measure takes them."""

    first: int
    """Position of the first one in its ring."""
    enqueue: list[int]
    completions: list[int]
    flags: list[int]


@dataclass(frozen=True, slots=True)
class RankTime:
    """One rank's own time over its newest entries."""

    rank: int
    own_ns: int
    """Time outside communication: from a release to the next entry, summed."""
    span_ns: int
    """The time measured (own plus blocked)."""
    entries: int
    period: int | None
    """Entries per step (``format.activity.step_period``); None when no step repeats."""
    inferred: bool
    """Completions were taken from the participants' arrivals (the dump has none)."""

    @property
    def share(self) -> float:
        """Own time as a share of the time measured."""
        return self.own_ns / self.span_ns if self.span_ns else 0.0

    @property
    def step_ns(self) -> float | None:
        """Length of one step, where steps repeat."""
        if self.period is None or self.entries < 2:
            return None
        return self.span_ns * self.period / (self.entries - 1)

    @property
    def own_per_step_ns(self) -> float | None:
        """Own time per step, where steps repeat."""
        step = self.step_ns
        return None if step is None else step * self.share


@dataclass(frozen=True, slots=True)
class SlowStage:
    """A stage whose ranks spend longer outside communication than the other stages'."""

    stage: int
    ranks: tuple[int, ...]
    share: float
    """Typical own time of its ranks, as a share of time."""
    others_share: float
    """Typical own time of the other stages' ranks."""
    elevated: int
    """Its ranks above the others' typical value by ``STAGE_MEMBER_FACTOR``."""
    per_step_ms: float | None
    others_per_step_ms: float | None


@dataclass(frozen=True, slots=True)
class Excess:
    """A rank's own time against the other ranks of its stage."""

    share: float
    others_share: float
    """Median of the others' (a sample of them at scale)."""
    others: int
    """How many others were compared."""
    per_step_ms: float | None
    others_per_step_ms: float | None

    @property
    def factor(self) -> float:
        return self.share / self.others_share if self.others_share > 0 else math.inf


def _evenly(ranks: Sequence[int], k: int) -> list[int]:
    """Up to ``k`` of ``ranks``, evenly spread."""
    if len(ranks) <= k:
        return list(ranks)
    return [ranks[(i * len(ranks)) // k] for i in range(k)]


def _sigma(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mid = median(values)
    return _MAD_SIGMA * median(abs(v - mid) for v in values)


class Activity:
    """Own time, stages and wait chains of one run, worked out on first use and kept.

    Args:
        m: the lined-up histories.
    """

    def __init__(self, m: Matched) -> None:
        self.m = m
        self._times: dict[int, RankTime | None] = {}
        self._inputs: dict[int, _Window | None] = {}
        self._completion: dict[tuple[str, int], int] = {}
        self._waited: dict[int, Counter[int]] = {}

    @cached_property
    def stages(self) -> Stages:
        """The run's pipeline stages (one stage of every rank where there are none)."""
        return find_stages(self.m)

    @cached_property
    def one_clock(self) -> bool:
        """Whether every dump is on one host (or names none): arrivals then compare as
        recorded where completions are missing."""
        return len({d.header.hostname for d in self.m.run.dumps.values()}) <= 1

    # -- one rank ---------------------------------------------------------------------------
    def _window(self, rank: int) -> _Window | None:
        """The rank's newest entries, with their completions; None when its times cannot
        be measured."""
        if rank in self._inputs:
            return self._inputs[rank]
        d = self.m.run.dumps.get(rank)
        out: _Window | None = None
        if d is not None and len(d) >= 3:
            first = max(0, len(d) - WINDOW)
            e = d.dump.entries
            enq = list(e.enqueue_ns[first:])
            comp = self._completions(rank, first)
            known = sum(1 for c in comp if c)
            if comp and known >= MIN_KNOWN * len(comp) and any(enq):
                out = _Window(first, enq, comp, list(e.flags[first:]))
        self._inputs[rank] = out
        return out

    def _completions(self, rank: int, first: int) -> list[int]:
        """Per entry from ``first``, when it completed on the rank's clock (0 unknown).

        As recorded where the recorder saw it complete at once (a call that returned, a
        future's callback); the latest arrival of its participants where it only found out
        later: PyTorch's recorder notes completions its watchdog discovers, and flightrec
        polls asynchronous sends and receives (gloo's have no future), both a tenth of a
        second late or more, which would count a rank's wait for a receive as its own
        time. So for those entries (and where nothing is recorded) the earlier of the two.
        """
        d = self.m.dump(rank)
        e = d.dump.entries
        states, flags = e.state, e.flags
        recorded = [
            c if states[first + i] == _COMPLETED else 0 for i, c in enumerate(e.complete_ns[first:])
        ]
        late = [
            not recorded[i] or d.converted or (flags[p] & _IS_P2P and flags[p] & _ASYNC)
            for i, p in enumerate(range(first, len(d)))
        ]
        if not any(late) or not self._comparable(rank):
            return recorded if d.completion_times else []
        base = base_ns(self.m, rank)
        cols = d.columns
        keys = d.group_keys
        enq = e.enqueue_ns
        out: list[int] = []
        for i, p in enumerate(range(first, len(d))):
            got = recorded[i]
            if late[i]:
                if cols["flags"][p] & _IS_P2P:
                    peers = self._p2p_completion(rank, p)
                else:
                    peers = self._collective_completion(keys[cols["group"][p]], cols["seq"][p])
                peers = peers - base if peers else 0
                # Hosts' clocks differ by milliseconds: a peer that seems to arrive after
                # this rank entered its next operation arrived before it (it waited for it).
                if peers and p + 1 < len(d) and enq[p + 1] and peers > enq[p + 1]:
                    peers = enq[p + 1]
                got = min(got, peers) if got and peers else got or peers
            out.append(got)
        return out

    def _comparable(self, rank: int) -> bool:
        """Whether the rank's arrivals compare with its peers' as recorded: one host, or
        clocks its completions line up (a converted dump's are the wall clock)."""
        return self.one_clock or self.m.dump(rank).converted

    def _collective_completion(self, group: str, seq: int) -> int:
        """Latest arrival of every member at (group, seq), wall-anchored; 0 when a member's
        entry is not at hand."""
        key = (group, seq)
        if key in self._completion:
            return self._completion[key]
        latest = 0
        info = self.m.groups.get(group)
        for q in info.ranks if info is not None and seq else ():
            gi = self.m.index.get(q, {}).get(group)
            pos = gi.position_of(seq) if gi else None
            enq = self.m.dump(q).dump.entries.enqueue_ns[pos] if pos is not None else 0
            if not enq:
                latest = 0
                break
            latest = max(latest, enq + base_ns(self.m, q))
        self._completion[key] = latest
        return latest

    def _p2p_completion(self, rank: int, p: int) -> int:
        """The later of the two ends' arrivals at the transfer, wall-anchored (0 unknown)."""
        d = self.m.dump(rank)
        cols = d.columns
        peer, n = int(cols["peer"][p]), int(cols["p2p_seq"][p])
        group = d.group_keys[cols["group"][p]]
        sending = bool(cols["flags"][p] & _SEND)
        if not sending:  # (the sender's numbering)
            n = self.m.sender_ordinal(group, peer, rank, n)
        other = self.m.p2p_position(peer, group, rank, not sending, n)
        if other is None:
            return 0
        theirs = self.m.dump(peer).dump.entries.enqueue_ns[other]
        mine = d.dump.entries.enqueue_ns[p]
        if not theirs or not mine:
            return 0
        return max(theirs + base_ns(self.m, peer), mine + base_ns(self.m, rank))

    def time_of(self, rank: int) -> RankTime | None:
        """The rank's own time over its newest entries; None where it cannot be measured."""
        if rank in self._times:
            return self._times[rank]
        got: RankTime | None = None
        w = self._window(rank)
        if w is not None:
            own, span = own_time(w.enqueue, w.completions, w.flags)
            if span > 0:
                d = self.m.dump(rank)
                got = RankTime(
                    rank,
                    own,
                    span,
                    len(w.enqueue),
                    step_period(self._signature(rank, w.first)),
                    not d.completion_times,
                )
        self._times[rank] = got
        return got

    def _signature(self, rank: int, first: int) -> list[int]:
        """One value per entry naming the operation (``format.activity.signature``)."""
        cols = self.m.dump(rank).columns
        return [
            signature(o, g, f, q)
            for o, g, f, q in zip(
                cols["op"][first:],
                cols["group"][first:],
                cols["flags"][first:],
                cols["peer"][first:],
                strict=True,
            )
        ]

    # -- compared with its stage ------------------------------------------------------------
    def _shares(self, ranks: Sequence[int]) -> list[tuple[int, RankTime]]:
        return [(r, t) for r in ranks if (t := self.time_of(r)) is not None]

    def excess(self, rank: int) -> Excess | None:
        """The rank's own time against the others of its stage (a sample of them); None
        where either cannot be measured or it is alone in its stage."""
        mine = self.time_of(rank)
        if mine is None or rank not in self.stages.stage_of:
            return None
        return excess_of(mine, self._others(rank))

    def _others(self, rank: int) -> list[RankTime]:
        cohort = [r for r in self.stages.cohort(self.stages.stage_of[rank]) if r != rank]
        return [t for _, t in self._shares(_evenly(cohort, SAMPLE))]

    def is_slow_worker(self, rank: int) -> bool:
        """Whether the rank's own time stands out among its stage's (``slow_worker``)."""
        mine = self.time_of(rank)
        if mine is None or rank not in self.stages.stage_of:
            return False
        return slow_worker(mine, self._others(rank))

    @cached_property
    def slow_stages(self) -> tuple[SlowStage, ...]:
        """The stages whose ranks spend longer outside communication than the others'."""
        st = self.stages
        if st.count < 2:
            return ()
        sampled = {
            s: [t for _, t in self._shares(_evenly(st.cohort(s), SAMPLE))] for s in range(st.count)
        }
        return slow_stages_of(st, sampled)

    @cached_property
    def slow_stage_ranks(self) -> frozenset[int]:
        return frozenset(r for s in self.slow_stages for r in s.ranks)

    # -- who held whom up -------------------------------------------------------------------
    def waited_on(self, rank: int) -> Counter[int]:
        """Per peer, how long (ns) the rank was held inside operations that peer arrived at
        last (a collective's last member; a transfer's other end), over its window."""
        if rank in self._waited:
            return self._waited[rank]
        out: Counter[int] = Counter()
        w = self._window(rank)
        if w is not None:
            for g in gaps(w.enqueue, w.completions, w.flags):
                if g is None or g.released_by < 0 or g.blocked_ns <= 0:
                    continue
                holder = self._holder(rank, w.first + g.released_by)
                if holder is not None and holder != rank:
                    out[holder] += g.blocked_ns
        self._waited[rank] = out
        return out

    def _holder(self, rank: int, p: int) -> int | None:
        """Who ``rank``'s entry at position ``p`` waited for: a transfer's other end; a
        collective's member that was inside it the shortest (it arrived last: completions
        are simultaneous), or that arrived last where completions are not recorded."""
        d = self.m.dump(rank)
        cols = d.columns
        if cols["flags"][p] & _IS_P2P:
            peer = int(cols["peer"][p])
            return peer if peer >= 0 else None
        group, seq = d.group_keys[cols["group"][p]], cols["seq"][p]
        info = self.m.groups.get(group)
        if info is None or not seq:
            return None
        best: tuple[int, int] | None = None
        for q in info.ranks:
            dq = self.m.run.dumps.get(q)
            gi = self.m.index.get(q, {}).get(group)
            pos = gi.position_of(seq) if gi else None
            if dq is None or pos is None:
                return None
            e = dq.dump.entries
            if dq.completion_times:
                if not e.complete_ns[pos] or not e.enqueue_ns[pos]:
                    return None
                inside = e.complete_ns[pos] - e.enqueue_ns[pos]
                key = (-inside, q)
            elif self.one_clock and e.enqueue_ns[pos]:
                key = (e.enqueue_ns[pos] + base_ns(self.m, q), q)
            else:
                return None
            if best is None or key > best:
                best = key
        return best[1] if best is not None else None

    def head_of(self, rank: int, is_head: Callable[[int], bool]) -> int | None:
        """The rank at the head of the chain of waits that held ``rank`` up: the first
        rank reached for which ``is_head`` holds.

        From each rank the chain goes on to the peers it waited on for at least
        ``CHAIN_SHARE`` of its waiting; among the heads reached, the one reached through the
        heaviest chain (the product of those shares) is returned.
        """
        best: dict[int, float] = {rank: 0.0}  # rank -> least -log(share product)
        heap = [(0.0, rank)]
        hops = 0
        while heap and hops < MAX_HOPS * 8:
            cost, r = heapq.heappop(heap)
            hops += 1
            if cost > best.get(r, math.inf):
                continue
            if r != rank and is_head(r):
                return r
            waited = self.waited_on(r)
            total = sum(waited.values())
            for q, ns in waited.items():
                share = ns / total if total else 0.0
                if share < CHAIN_SHARE:
                    continue
                c = cost - math.log(share)
                if c < best.get(q, math.inf):
                    best[q] = c
                    heapq.heappush(heap, (c, q))
        return None


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 1)


def per_step_phrase(mine_ms: float | None, others_ms: float | None) -> str:
    """`` (about 2181.3 ms a step against 1458.1 ms)``; "" where steps do not repeat."""
    if mine_ms is None or others_ms is None:
        return ""
    return f" (about {mine_ms:.1f} ms a step against {others_ms:.1f} ms)"


def excess_of(mine: RankTime, others: Sequence[RankTime]) -> Excess | None:
    """``mine`` against ``others`` (the other ranks of its stage); None without others."""
    if not others:
        return None
    steps = [t.own_per_step_ns for t in others if t.own_per_step_ns is not None]
    return Excess(
        mine.share,
        median(t.share for t in others),
        len(others),
        _ms(mine.own_per_step_ns),
        _ms(median(steps)) if steps else None,
    )


def slow_worker(mine: RankTime, others: Sequence[RankTime]) -> bool:
    """Whether ``mine`` stands out among ``others`` (the other ranks of its stage): at
    least ``SLOW_FACTOR`` times their typical own time and ``MIN_EXCESS`` more of the time,
    and, among more than three others, ``OUTLIER_SIGMAS`` robust sigmas above them."""
    ex = excess_of(mine, others)
    if ex is None:
        return False
    if ex.share < SLOW_FACTOR * ex.others_share or ex.share - ex.others_share < MIN_EXCESS:
        return False
    spread = _sigma([t.share for t in others]) if len(others) >= 3 else 0.0
    return ex.share - ex.others_share >= OUTLIER_SIGMAS * spread


def slow_stages_of(
    stages: Stages, sampled: Mapping[int, Sequence[RankTime]]
) -> tuple[SlowStage, ...]:
    """The stages whose ranks spend longer outside communication than the other stages'.

    Args:
        stages: the pipelines' stages.
        sampled: per stage, the own times of (a sample of) its ranks.

    Returns:
        Each stage at least ``SLOW_FACTOR`` times (and ``MIN_EXCESS`` more than) the other
        stages' typical own time, with ``STAGE_MEMBERS`` of its ranks elevated.
    """
    typical = {s: median(t.share for t in v) for s, v in sampled.items() if v}
    if stages.count < 2 or len(typical) < 2:
        return ()
    out: list[SlowStage] = []
    for s, share in typical.items():
        others = median(v for k, v in typical.items() if k != s)
        if share < SLOW_FACTOR * others or share - others < MIN_EXCESS:
            continue
        members = sampled[s]
        elevated = sum(1 for t in members if t.share >= STAGE_MEMBER_FACTOR * others)
        if elevated < STAGE_MEMBERS * len(members):
            continue
        mine = [t.own_per_step_ns for t in members if t.own_per_step_ns is not None]
        theirs = [
            t.own_per_step_ns
            for k, v in sampled.items()
            if k != s
            for t in v
            if t.own_per_step_ns is not None
        ]
        ranks = stages.cohort(s)
        out.append(
            SlowStage(
                s,
                ranks,
                round(share, 3),
                round(others, 3),
                round(elevated * len(ranks) / len(members)),
                _ms(median(mine)) if mine else None,
                _ms(median(theirs)) if theirs else None,
            )
        )
    return tuple(out)
