"""Slow, not stuck: name a persistently late rank in the job's log while the job runs.

The recorder's slow check (``flightrec.recorder.exchange.slowcheck``) hands the reporting rank every
rank's digest (``flightrec.format.digest``) once per check. ``SlowJudge.check`` lines each
group's members up on one clock (``clocks.align_lanes``: completions of one collective are
simultaneous), counts who arrived last and by how much (``lastarrivals.tally_arrivals``, as
``flightrec analyze`` does), and keeps each member's lateness per collective as history, so
that the onset and the shape come from the same change-point test as in ``analyze``
(``flightrec.analysis.timing.trend``).

A rank is late in a check's window when it arrived last, by at least ``floor_ms`` behind
the next-latest member, at ``min_late`` or more of the window's collectives, and either

- more often than random arrival order would make it last (``chance_of_as_many``: a rank
  slow at most steps), or
- it holds more of the group's late arrivals than chance would give it (a rank slow every
  few steps: late arrivals happen rarely, but when they do, it is this rank),

and the others spend at least ``min_cost`` of the window's time waiting for it (a rank late only
because it waited for a late peer in another group is left out: ``_first_causes``). It is named
after ``confirm`` checks in a row that are at least ``min_persist_s`` apart, each late also
at the collectives new since the check before, again only when what the line says changes (another rank
or group, another shape, lateness halved or doubled unless it is growing), and once when it is over (``confirm``
checks in a row without it).

Where the time goes is judged as ``flightrec analyze`` judges it (``flightrec.live.shapes``):
a late rank whose own time (outside communication) stands out among its pipeline stage's is
a slow worker, and the late ranks that are not were waiting (on it, down its pipeline): they
are left out while it is named; a stage whose ranks all spend longer outside communication
than the other stages gets a line of its own (stage imbalance), and so does spread imbalance
(ranks doing the same work waiting for each other, a different one last each time), where
no rank is late.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from statistics import median

from flightrec.analysis.facts.lateness import OwnTime, chance_of_as_many, own_phrase, percentile
from flightrec.analysis.timing.activity import RankTime, excess_of
from flightrec.analysis.timing.clocks import Lane, align_lanes
from flightrec.analysis.timing.lastarrivals import tally_arrivals
from flightrec.analysis.timing.stages import Stages
from flightrec.analysis.timing.tallies import Pending
from flightrec.analysis.timing.trend import (
    GROWING,
    Trend,
    describe_trend,
    lateness_rows,
    trend_phrase,
)
from flightrec.format.digest import Digest, DigestError, decode
from flightrec.live.shapes import Shapes, is_slow_worker, rank_times, slow_stages, stages_of

log = logging.getLogger("flightrec")
WARMUP_SEQS = 5
"""A group's first collectives, which set up its connections, are not judged."""


@dataclass(frozen=True, slots=True)
class SlowOptions:
    """Thresholds of the in-job slow check.

    Attributes:
        floor_ms: the least margin behind the next-latest member that counts as late.
        min_late: late arrivals a rank needs in one window.
        max_chance: the most probability allowed that arrival order alone explains them.
        min_cost: the least share of the window's time the others spend waiting for it.
        confirm: checks in a row before a line, and without it before "over".
        min_persist_s: and at least this long between the first of those checks and the
            line (a process starved for a second or two on a busy host is not a slow rank).
        history: lateness samples kept per rank and group for the onset.
    """

    floor_ms: float = 10.0
    min_late: int = 6
    max_chance: float = 1e-3
    min_cost: float = 0.02
    confirm: int = 2
    min_persist_s: float = 5.0
    history: int = 1024


@dataclass(frozen=True, slots=True)
class Slowness:
    """One rank found late in one group at one check."""

    rank: int
    group: str
    members: int
    late: int
    collectives: int
    median_ms: float
    p90_ms: float
    cost: float
    """Share of the window's time the other members spent waiting for it."""
    host: str
    device: str
    trend: Trend | None
    worker: str = ""
    """Where it is a slow worker: ``(stage 1 of 4): it spends 68% of its time outside
    communication, against 34% for the other ranks of its stage``."""


@dataclass(slots=True)
class _Seen:
    """A group's history as gathered check by check."""

    last_seq: int = 0
    lateness: dict[int, deque[tuple[int, float]]] = field(default_factory=dict)


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


class SlowJudge:
    """Judges each check's digests; remembers what it said (one instance per job)."""

    def __init__(self, options: SlowOptions | None = None, since_ns: int = 0) -> None:
        """``since_ns``: collectives that began earlier (wall clock) are not looked at: the
        reporting rank is late at those while it loads the judge."""
        self.options = options or SlowOptions()
        self.since_ns = since_ns
        self._groups: dict[str, _Seen] = {}
        self._streak: dict[tuple[int, str], tuple[int, int]] = {}
        """(rank, group) -> checks in a row it was late at, and when the first was taken."""
        self._said: tuple[int, str, str, int] | None = None
        self._named: Slowness | None = None
        self._clear = 0
        self._shapes = Shapes(self.options.confirm, self.options.min_persist_s)
        self._pendings: list[Pending] = []
        self._stages = Stages(1, {}, ())
        self._times: dict[int, RankTime] = {}

    def find(self, digests: Mapping[int, Digest]) -> list[Slowness]:
        """Ranks late in this check's window, the costliest first (history updated)."""
        lanes, members = self._lanes(digests)
        found: list[Slowness] = []
        self._pendings = []
        for key, group_lanes in sorted(lanes.items()):
            found += self._late_in(key, group_lanes, members[key], digests)
        found = _first_causes(found, {k: set(v) for k, v in lanes.items()})
        found = self._slow_workers(found, digests)
        found.sort(key=lambda s: (-s.cost, s.rank))
        flagged = {(s.rank, s.group) for s in found}
        now = max((d.taken_ns for d in digests.values()), default=0)
        self._streak = {
            k: (self._streak[k][0] + 1, self._streak[k][1]) if k in self._streak else (1, now)
            for k in flagged
        }
        return found

    def _lanes(
        self, digests: Mapping[int, Digest]
    ) -> tuple[dict[str, dict[int, Lane]], dict[str, int]]:
        """Per group, each rank's lane of the window's collectives; and per group, its size."""
        lanes: dict[str, dict[int, Lane]] = {}
        members: dict[str, int] = {}
        for r, d in digests.items():
            for g in d.groups:
                # Not the first collectives of a group (connections are set up in them), nor
                # any that began before the judge was made.
                keep = [
                    i
                    for i, (s, e) in enumerate(zip(g.seqs, g.enqueue_ns, strict=True))
                    if s > WARMUP_SEQS and e >= self.since_ns
                ]
                if g.members < 2 or len(keep) < 3:
                    continue
                lanes.setdefault(g.key, {})[r] = Lane(
                    tuple(g.seqs[i] for i in keep),
                    tuple(range(len(keep))),
                    tuple(g.enqueue_ns[i] for i in keep),
                    tuple(g.complete_ns[i] for i in keep),
                )
                members[g.key] = g.members
        return lanes, members

    def _late_in(
        self,
        key: str,
        group_lanes: dict[int, Lane],
        size: int,
        digests: Mapping[int, Digest],
    ) -> list[Slowness]:
        """The members late in one group's window (its history and pending tally kept)."""
        opt = self.options
        ga = align_lanes(key, group_lanes)
        if ga is None:
            return []
        rows = lateness_rows(ga)
        seen = self._groups.setdefault(key, _Seen())
        fresh = [i for i, s in enumerate(ga.seqs) if s > seen.last_seq]
        is_fresh = set(fresh)
        for r in ga.ranks:
            hist = seen.lateness.setdefault(r, deque(maxlen=opt.history))
            hist.extend((ga.arrivals[r][i], rows[r][i]) for i in fresh)
        seen.last_seq = max(seen.last_seq, ga.seqs[-1])
        gt = tally_arrivals(ga, opt.floor_ms * 1e6)
        self._pendings.append(Pending(key, ga.ranks, gt))
        n, taken, total = len(ga.ranks), len(ga.seqs), len(gt.late)
        span = max(max(c) for c in ga.completions.values()) - min(
            min(a) for a in ga.arrivals.values()
        )
        by_member: dict[int, list[int]] = {}
        for i, j, _ in gt.late:
            by_member.setdefault(j, []).append(i)
        found: list[Slowness] = []
        for j, late in by_member.items():
            if len(late) < opt.min_late:
                continue
            # Late in what is new since the last check, too: windows overlap when checks
            # are frequent, and a burst that is over must not count twice.
            new = sum(1 for i in late if i in is_fresh)
            if not new or new / len(fresh) < 0.5 * len(late) / taken:
                continue
            often = chance_of_as_many({n: taken}, len(late)) <= opt.max_chance
            alone = _binomial_tail(total, len(late), 1.0 / n) <= opt.max_chance
            if not (often or alone):
                continue
            r = ga.ranks[j]
            behind = [rows[r][i] for i in late]
            cost = sum(behind) / (span / 1e6) if span > 0 else 0.0
            if cost < opt.min_cost:
                continue
            d = digests[r]
            found.append(
                Slowness(
                    rank=r,
                    group=key,
                    members=size,
                    late=len(late),
                    collectives=taken,
                    median_ms=round(median(behind), 1),
                    p90_ms=round(percentile(behind, 0.9), 1),
                    cost=round(cost, 3),
                    host=d.host,
                    device=d.device,
                    trend=describe_trend(list(seen.lateness[r]), opt.floor_ms),
                )
            )
        return found

    def _slow_workers(self, found: list[Slowness], digests: Mapping[int, Digest]) -> list[Slowness]:
        """The late ranks that are slow themselves, said so; while one is, the late ranks
        that are not (they waited, on it or down its pipeline) and those of a slow stage
        are left out."""
        self._stages, self._times = stages_of(digests), rank_times(digests)
        stages, times = self._stages, self._times
        slow_stage = {r for st in slow_stages(stages, times) for r in st.ranks}
        out: list[Slowness] = []
        for s in found:
            if s.rank in slow_stage:
                continue
            if is_slow_worker(s.rank, stages, times):
                place = stages.place(s.rank)
                cohort = stages.cohort(stages.stage_of[s.rank])
                ex = excess_of(
                    times[s.rank], [times[r] for r in cohort if r != s.rank and r in times]
                )
                if ex is not None:
                    own = OwnTime(round(ex.share, 3), round(ex.others_share, 3), ex.others,
                                  ex.per_step_ms, ex.others_per_step_ms)  # fmt: skip
                    where = f"stage {place[0]} of {place[1]}" if place else ""
                    phrase = own_phrase(own, bool(place))
                    s = replace(s, worker=f"{f' ({where})' if where else ''}: {phrase}")
            out.append(s)
        if any(s.worker for s in out):
            out = [s for s in out if s.worker]
        return out

    def check(self, raw: Mapping[int, bytes]) -> str | None:
        """One check: the line to print into the log, or None.

        Args:
            raw: the digests gathered, by rank, as published (untrusted: one that does not
                decode is left out).
        """
        digests: dict[int, Digest] = {}
        for rank, data in raw.items():
            with contextlib.suppress(DigestError):
                d = decode(data, f"rank {rank}'s digest")
                if d.rank == rank:
                    digests[rank] = d
        found = self.find(digests)
        now = max((d.taken_ns for d in digests.values()), default=0)
        lines = [self._rank_line(found, now)]
        lines += self._shapes.check(digests, self._pendings, self._stages, self._times, bool(found))
        return "".join(line for line in lines if line) or None

    def _rank_line(self, found: list[Slowness], now: int) -> str | None:
        """The line about late ranks this check, if any (named, changed, or over)."""
        opt = self.options
        confirmed = []
        for s in found:
            checks, since = self._streak[(s.rank, s.group)]
            if checks >= opt.confirm and now - since >= opt.min_persist_s * 1e9:
                confirmed.append(s)
        if confirmed:
            self._clear = 0
            s = confirmed[0]
            shape = s.trend.shape if s.trend is not None else ""
            # A growing rank's lateness doubles again and again: its line says so once.
            size = -1 if shape == GROWING else round(math.log2(max(s.median_ms, 1.0)))
            said = (s.rank, s.group, shape, size)
            if said == self._said:
                return None
            self._said, self._named = said, s
            return slow_line(s, len({c.rank for c in confirmed} - {s.rank}))
        named = self._named
        if named is None:
            return None
        if any((s.rank, s.group) == (named.rank, named.group) for s in found):
            return None  # still late, though not confirmed again yet
        self._clear += 1
        if self._clear < self.options.confirm:
            return None
        self._said, self._named, self._clear = None, None, 0
        return over_line(named)


def _first_causes(found: list[Slowness], members: Mapping[str, set[int]]) -> list[Slowness]:
    """Leave out ranks late only because they waited for another late rank.

    A rank that waits for a slow peer in one group (tensor parallel) arrives late at its next
    collective in another group (data parallel), where it looks slow itself. It is left out
    when another rank is late in a group it belongs to and it is not late there itself.
    """
    late_in = {(s.rank, s.group) for s in found}
    return [
        s
        for s in found
        if not any(
            t.rank != s.rank
            and s.rank in members.get(t.group, ())
            and (s.rank, t.group) not in late_in
            for t in found
        )
    ]


def _who(s: Slowness) -> str:
    where = ", ".join(x for x in (s.host, s.device) if x)
    return f"rank {s.rank}" + (f" ({where})" if where else "")


def slow_line(s: Slowness, more: int = 0) -> str:
    """The log line naming a late rank."""
    trend = f"; {trend_phrase(s.trend)}" if s.trend is not None else ""
    others = f" ({more} more rank{'s' if more > 1 else ''} late too)" if more else ""
    worker = f"; a slow worker{s.worker}" if s.worker else ""
    return (
        f"flightrec: slow rank: {_who(s)} is persistently late in group {s.group} "
        f"({s.members} ranks){others}: last by {s.median_ms:.1f} ms (median; p90 "
        f"{s.p90_ms:.1f} ms) at {s.late} of the newest {s.collectives} collectives{trend}"
        f"{worker}; the others spend {100 * s.cost:.0f}% of their time waiting for it. "
        "Nothing hangs.\n"
    )


def over_line(s: Slowness) -> str:
    """The log line saying a late rank is no longer late."""
    return f"flightrec: slow rank: {_who(s)} is no longer late in group {s.group}.\n"


class SlowReporter:
    """What the recorder's slow check calls on the reporting rank, once per check, with the
    digests it gathered: judges them and prints a line to stderr when there is one. Never
    raises."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.judge = SlowJudge(since_ns=time.time_ns())
        self._write = write
        self._warned = False

    def __call__(self, raw: Mapping[int, bytes]) -> None:
        try:
            line = self.judge.check(raw)
        except Exception as exc:  # one warning for the job, then quiet
            if not self._warned:
                self._warned = True
                log.warning("flightrec: the slow check failed: %s", exc)
            return
        if line:
            self._write(line)
