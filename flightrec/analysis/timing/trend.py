"""How a straggler's lateness changed over time: when it began and what shape it has.

Input is one rank's lateness per collective, in time order: its arrival minus the median
arrival of the group's other members (``lateness_series``, from aligned arrivals). Two models
are fitted to that series: a step (one level before the onset, another after) and a hinge
(flat, then growing linearly from the onset). The better fit gives the onset, where the
change is clear; the samples after it give the shape:

- ``growing``: the last third after the onset is clearly later than the first third;
- ``intermittent``: late at only some of the collectives after the onset (a slow step every
  few steps, a periodic neighbour);
- ``steady``: late at most of them, by about the same margin.

The same functions serve ``flightrec analyze`` (over a ring's history, ``straggler_trend``)
and the in-job slow check (``flightrec.live.slow``, over the history it gathers check by
check), so both say the same thing of the same data.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flightrec.analysis.matching.matching import Matched
    from flightrec.analysis.timing.clocks import GroupArrivals

STEADY = "steady"
GROWING = "growing"
INTERMITTENT = "intermittent"

MAX_POINTS = 256
"""Longer series are averaged down to this many points before fitting (the fits are
quadratic in the points; a ring of 2,000 entries is then about 30 ms of work)."""
SPARK_WIDTH = 24
_BARS = "▁▂▃▄▅▆▇█"
MIN_SEGMENT = 3
"""Fewest points on either side of an onset."""
LATE_SHARE_STEADY = 0.6
"""At or above this share of late collectives after the onset, lateness is steady (or
growing); below, intermittent."""
GROWTH = 1.5
"""The last third after the onset this many times later than the first (plus the floor):
growing."""


@dataclass(frozen=True, slots=True)
class Trend:
    """A straggler's lateness over the history looked at.

    Attributes:
        shape: ``steady``, ``growing`` or ``intermittent``.
        onset_ns: when the lateness began: the arrival time of the first late collective
            after the change (ns, on the aligned clock of the series, wall-anchored).
        onset_seen: False when no change is visible: late from the start of the history,
            so the onset is at or before ``onset_ns``.
        before_ms: median lateness before the onset (0.0 when none is seen).
        after_ms: median lateness after the onset.
        late_ms: median lateness of the late collectives after the onset (for an
            intermittent straggler, how late it is when it is late).
        late_share: share of the collectives after the onset at which it was late.
        latest_ms: median lateness over the last third of the collectives after the onset.
        growth_ms_per_min: how fast the lateness grows after the onset (least squares).
        samples: collectives in the series.
        span_s: seconds the series covers.
        sparkline: the lateness over the series, one bar per slice of it.
    """

    shape: str
    onset_ns: int
    onset_seen: bool
    before_ms: float
    after_ms: float
    late_ms: float
    late_share: float
    latest_ms: float
    growth_ms_per_min: float
    samples: int
    span_s: float
    sparkline: str


def median_rule(ordered: Sequence[int]) -> tuple[int, float, int, float, float]:
    """How the median of the *other* members follows from one member's arrival ``a``.

    Removing any copy of a value from a multiset leaves the same multiset, so the median of
    the others depends only on ``a``, through the sorted arrivals ``ordered``:
    ``hi if a > t1 else (mid if a > t2 else lo)``, returned as ``(t1, hi, t2, mid, lo)``.
    """
    n = len(ordered) - 1  # the others
    h = n // 2
    if n % 2:  # odd count of others: one middle value
        return (ordered[h], float(ordered[h]), ordered[h], 0.0, float(ordered[h + 1]))
    return (
        ordered[h],
        (ordered[h - 1] + ordered[h]) / 2,
        ordered[h - 1],
        (ordered[h - 1] + ordered[h + 1]) / 2,
        (ordered[h] + ordered[h + 1]) / 2,
    )


def lateness_rows(ga: GroupArrivals) -> dict[int, list[float]]:
    """Per member of ``ga``, its lateness (ms) per collective: its arrival minus the median
    arrival of the other members (one sort per collective, whatever the group's size)."""
    rows = [ga.arrivals[r] for r in ga.ranks]
    rules = [median_rule(sorted(col)) for col in zip(*rows, strict=True)]
    return {
        r: [
            (a - (hi if a > t1 else (mid if a > t2 else lo))) / 1e6
            for a, (t1, hi, t2, mid, lo) in zip(row, rules, strict=True)
        ]
        for r, row in zip(ga.ranks, rows, strict=True)
    }


def lateness_series(ga: GroupArrivals, rank: int) -> list[tuple[int, float]]:
    """``rank``'s (arrival ns, lateness ms) per collective of ``ga``, in collective order
    (``lateness_rows``)."""
    return list(zip(ga.arrivals[rank], lateness_rows(ga)[rank], strict=True))


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """``values`` (negative read as 0) as bars, averaged into at most ``width`` slices."""
    if not values:
        return ""
    n = len(values)
    k = min(width, n)
    means = []
    for b in range(k):
        part = values[b * n // k : (b + 1) * n // k] or values[b * n // k : b * n // k + 1]
        means.append(sum(max(0.0, v) for v in part) / len(part))
    top = max(means)
    if top <= 0:
        return _BARS[0] * k
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * (len(_BARS) - 1) + 0.5))] for v in means)


def _downsample(series: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    n = len(series)
    if n <= MAX_POINTS:
        return list(series)
    out = []
    for b in range(MAX_POINTS):
        part = series[b * n // MAX_POINTS : (b + 1) * n // MAX_POINTS]
        out.append((part[0][0], sum(v for _, v in part) / len(part)))
    return out


def _sse(s: float, s2: float, n: int) -> float:
    return s2 - s * s / n if n else 0.0


def _step(y: Sequence[float]) -> tuple[int, float, float]:
    """The best single mean shift: (index of the first point after it, its SSE, t score)."""
    n = len(y)
    cs, cs2 = [0.0], [0.0]
    for v in y:
        cs.append(cs[-1] + v)
        cs2.append(cs2[-1] + v * v)
    best = (0, _sse(cs[n], cs2[n], n), 0.0)
    for k in range(MIN_SEGMENT, n - MIN_SEGMENT + 1):
        a = _sse(cs[k], cs2[k], k)
        b = _sse(cs[n] - cs[k], cs2[n] - cs2[k], n - k)
        if a + b < best[1]:
            var = (a + b) / max(1, n - 2)
            diff = (cs[n] - cs[k]) / (n - k) - cs[k] / k
            t = diff / max(1e-9, (var * (1 / k + 1 / (n - k))) ** 0.5)
            best = (k, a + b, t)
    return best


def _hinge(t: Sequence[float], y: Sequence[float]) -> tuple[int, float, float]:
    """The best "flat, then linear in ``t`` from point k" fit: (k, its SSE, the slope)."""
    n = len(y)
    sy = sum(y)
    best = (0, _sse(sy, sum(v * v for v in y), n), 0.0)
    for k in range(MIN_SEGMENT, n - MIN_SEGMENT + 1):
        z = [max(0.0, ti - t[k - 1]) for ti in t]
        sz = sum(z)
        szz = sum(v * v for v in z)
        szy = sum(a * b for a, b in zip(z, y, strict=True))
        det = n * szz - sz * sz
        if det <= 0:
            continue
        slope = (n * szy - sz * sy) / det
        level = (sy - slope * sz) / n
        sse = sum((yi - level - slope * zi) ** 2 for yi, zi in zip(y, z, strict=True))
        if sse < best[1]:
            best = (k, sse, slope)
    return best


def _slope(t: Sequence[float], y: Sequence[float]) -> float:
    n = len(y)
    if n < 2:
        return 0.0
    mt, my = sum(t) / n, sum(y) / n
    den = sum((a - mt) ** 2 for a in t)
    return sum((a - mt) * (b - my) for a, b in zip(t, y, strict=True)) / den if den else 0.0


def describe_trend(series: Sequence[tuple[int, float]], floor_ms: float = 5.0) -> Trend | None:
    """The onset and shape of a rank's lateness.

    Args:
        series: (time ns, lateness ms) per collective, in time order.
        floor_ms: the least lateness that counts as late at one collective (and the least
            change of level that counts as an onset).

    Returns:
        The trend; None for fewer than ``2 * MIN_SEGMENT`` points, or a series never late.
    """
    pts = _downsample(series)
    n = len(pts)
    if n < 2 * MIN_SEGMENT:
        return None
    t0 = pts[0][0]
    ts = [(p[0] - t0) / 1e9 for p in pts]
    y = [max(0.0, p[1]) for p in pts]
    k_step, sse_step, score = _step(y)
    # On the collectives' order, not on time: a rank slower by a little more at each step
    # also makes the steps longer, and on time its lateness would bend (and the hinge's
    # onset move early).
    k_hinge, sse_hinge, slope = _hinge([float(i) for i in range(n)], y)
    total = _sse(sum(y), sum(v * v for v in y), n)
    onset = 0
    if k_hinge and slope > 0 and sse_hinge < sse_step and sse_hinge < 0.5 * total:
        grown = slope * (n - k_hinge)
        if grown >= floor_ms:
            onset = k_hinge
    if not onset and k_step and score >= 4.0:
        before = y[:k_step]
        after = y[k_step:]
        if sum(after) / len(after) - sum(before) / len(before) >= floor_ms / 2:
            onset = k_step
    after = y[onset:]
    late = [v for v in after if v >= floor_ms]
    if not late:
        return None
    # When it began: the first late collective of the full series from the point (averaged
    # or not) before the change on.
    since = pts[onset - 1][0] if onset else pts[0][0]
    onset_ns = next(
        (ts_ for ts_, v in series if ts_ >= since and v >= floor_ms), int(pts[onset][0])
    )
    share = len(late) / len(after)
    third = max(1, len(after) // 3)
    head, tail = median(after[:third]), median(after[-third:])
    if share < LATE_SHARE_STEADY:
        shape = INTERMITTENT
    elif tail >= GROWTH * head + floor_ms:
        shape = GROWING
    else:
        shape = STEADY
    if shape == GROWING and onset:
        onset_ns = int(pts[onset - 1][0])  # a ramp begins where the hinge is, below the floor
    raw = [p[1] for p in series]
    return Trend(
        shape=shape,
        onset_ns=int(onset_ns),
        onset_seen=onset > 0,
        before_ms=round(median(y[:onset]), 3) if onset else 0.0,
        after_ms=round(median(after), 3),
        late_ms=round(median(late), 3) if late else 0.0,
        late_share=round(share, 3),
        latest_ms=round(tail, 3),
        growth_ms_per_min=round(60.0 * _slope(ts[onset:], after), 3),
        samples=len(series),
        span_s=round((series[-1][0] - series[0][0]) / 1e9, 3),
        sparkline=sparkline(raw),
    )


def straggler_trend(
    m: Matched, group: str, rank: int, floor_ms: float = 5.0, history: int = 1 << 16
) -> Trend | None:
    """The trend of ``rank``'s lateness in ``group`` over the whole history the dumps hold.

    Args:
        m: the lined-up histories.
        group: the group it was found late in.
        rank: the straggler.
        floor_ms: as ``describe_trend``.
        history: newest collectives looked at (the ring's whole history by default).

    Returns:
        The trend; None when the group's arrivals cannot be lined up on one clock.
    """
    from flightrec.analysis.timing.clocks import group_arrivals

    ga = group_arrivals(m, group, history)
    if ga is None or rank not in ga.arrivals:
        return None
    return describe_trend(lateness_series(ga, rank), floor_ms)


def clock_time(ns: int) -> str:
    """A wall-clock time in ns as ``HH:MM:SS UTC`` (the date is left out: logs carry it)."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(ns / 1e9))


def trend_phrase(t: Trend) -> str:
    """The trend in words, as the finding's summary and the log line put it."""
    since = (
        f"since {clock_time(t.onset_ns)}"
        if t.onset_seen
        else (f"since at least {clock_time(t.onset_ns)} (the start of the history)")
    )
    how = {
        STEADY: f"steady, about {t.after_ms:.1f} ms",
        GROWING: f"growing, {t.growth_ms_per_min:+.1f} ms a minute, now about {t.latest_ms:.1f} ms",
        INTERMITTENT: f"intermittent, late at {100 * t.late_share:.0f}% of collectives by "
        f"about {t.late_ms:.1f} ms",
    }[t.shape]
    return f"late {since}, {how} [{t.sparkline}]"
