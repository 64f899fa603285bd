"""Who arrived last at each of a group's recent collectives: the straggler pass's per-group
work, over every member of every group.

One call per group (``tally``) takes each member's entry columns and window, and returns the
members' arrivals on the anchor's clock (``clocks.align_lanes``) and, per collective, who
arrived last and whether by a margin that counts. It runs in C where the optional extension
``flightrec.analysis.timing._arrivals`` is built: at 131,072 ranks (tp=8, pp=8) that is 262,144
lanes of 64 collectives, about 17 s in Python. ``tally_py`` is the definition, composed of
the Python steps (``clocks.lane``, ``clocks.align_lanes``, ``last_arrivals``); the C path
returns the same values (``tests/unit/test_lastarrivals.py`` compares them on arbitrary
groups), and runs the Python path itself for times it does not compute in (beyond 2**61 ns).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.timing.clocks import (
    GroupArrivals,
    Lane,
    Window,
    align_lanes,
    base_ns,
    jitter_ns,
    lane,
    window_of,
)
from flightrec.format import flightrec_pb2 as pb

try:
    import flightrec.analysis.timing._arrivals as _arrivals
except ImportError:  # not built: the Python path (same results)
    _arrivals = None  # type: ignore[assignment]

_COMPLETED = pb.COMPLETED

Member = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int], Sequence[int], int]
"""One member: its ring's ``enqueue_ns``, ``complete_ns`` and ``state`` columns, its group
index's newest ``positions`` and their ``seqs``, and ``base_ns`` (what puts its times on its
host's wall clock)."""

Late = tuple[int, int, int]
"""(collective index, member index, margin in ns behind the next-latest member)."""


class Rows:
    """Rows of integers, one per member: sequences, or int64 bytes laid out row by row (what
    the C path returns; a row is then a view, made when asked for)."""

    __slots__ = ("_flat", "_rows", "_width")

    def __init__(self, rows: Sequence[Sequence[int]] = (), flat: bytes = b"", width: int = 0):
        self._rows = rows
        self._flat = memoryview(flat).cast("q") if flat else None
        self._width = width

    def __getitem__(self, j: int) -> Sequence[int]:
        if self._flat is None:
            return self._rows[j]
        w = self._width
        return self._flat[j * w : (j + 1) * w]


@dataclass(frozen=True, slots=True)
class GroupTally:
    """One group's recent completed collectives: arrivals, and who arrived last.

    Members are numbered as in the list given to ``tally``; ``kept`` names those with a
    usable lane, and every per-member field below is indexed like ``kept``.
    """

    kept: tuple[int, ...]
    seqs: tuple[int, ...]
    """Collectives every kept member completed, increasing."""
    arrivals: Rows
    """Per member, arrival per collective on the anchor's clock (ns)."""
    positions: Rows
    """Per member, ring position per collective."""
    spread: Callable[[int], float]
    """Member j's clock jitter against the anchor (ns): ``clocks.jitter_ns`` of its
    completion differences, computed when asked for."""
    lasts: Sequence[int]
    """Per member, collectives it arrived last at (ties to the highest member)."""
    late: Sequence[Late]
    """The collectives whose last member arrived later than the next-latest by at least the
    floor and by three times the two members' combined clock jitter, in collective order."""


def last_arrivals(
    arrivals: Sequence[Sequence[int]], spread: Callable[[int], float], floor_ns: float
) -> tuple[list[int], list[Late]]:
    """Per member (``arrivals`` rows, rank order), collectives it arrived last at; and the
    late arrivals (see ``GroupTally.late``). ``spread(j)`` is member j's clock jitter (ns)."""
    n = len(arrivals)
    lasts = [0] * n
    late: list[Late] = []
    # Per collective, the members' arrivals in rank order: sorting and searching these runs
    # at C speed.
    for i, col in enumerate(zip(*arrivals, strict=True)):
        ordered = sorted(col)
        a_last, a_second = ordered[-1], ordered[-2]
        # The last arrival; on a tie the highest member (as sorting (arrival, rank) pairs does).
        backwards = col[::-1]
        j_last = n - 1 - backwards.index(a_last)
        lasts[j_last] += 1
        margin = a_last - a_second
        if margin < floor_ns:
            continue
        j_second = n - 1 - backwards.index(a_second, n - j_last if a_second == a_last else 0)
        # Alignment jitter of the two members compared bounds what a margin can mean.
        if margin < 3.0 * (spread(j_last) ** 2 + spread(j_second) ** 2) ** 0.5:
            continue
        late.append((i, j_last, margin))
    return lasts, late


def tally_py(members: Sequence[Member], floor_ns: float) -> GroupTally | None:
    """``tally`` in Python: the definition the C path follows."""
    lanes: dict[int, Lane] = {}
    # Members of one shared index share their window objects (``members``, which holds them,
    # keeps their identities for the call).
    windows: dict[tuple[int, int], Window] = {}
    for j, (enq, comp, state, pos, seqs, base) in enumerate(members):
        key = (id(pos), id(seqs))
        window = windows.get(key)
        if window is None:
            window = windows[key] = window_of(pos, seqs)
        got = lane(enq, comp, state, window, base)
        if got is not None:
            lanes[j] = got
    ga = align_lanes("", lanes)
    if ga is None:
        return None
    return tally_arrivals(ga, floor_ns)


def tally_arrivals(ga: GroupArrivals, floor_ns: float) -> GroupTally:
    """``tally``'s counting over arrivals already lined up (``clocks.align_lanes``, or
    ``clocks.enqueue_arrivals``): ``kept`` then holds the keys of ``ga``'s members."""
    ranks = ga.ranks
    rows = [ga.arrivals[r] for r in ranks]

    def spread(j: int) -> float:
        return ga.spread_ns[ranks[j]]

    lasts, late = last_arrivals(rows, spread, floor_ns)
    return GroupTally(
        kept=ranks,
        seqs=ga.seqs,
        arrivals=Rows(rows),
        positions=Rows([ga.positions[r] for r in ranks]),
        spread=spread,
        lasts=lasts,
        late=late,
    )


def tally(members: list[Member], floor_ns: float) -> GroupTally | None:
    """One group's members' lanes, aligned on the lowest member's clock, and who arrived last.

    Args:
        members: the members with a dump that records completion times and a non-empty window, in
            rank order (the first with a lane is the anchor).
        floor_ns: the least margin behind the next-latest member that counts as late.

    Returns:
        The tally; None when fewer than two members have ``MIN_LINK_SAMPLES`` completed
        collectives in common (as ``clocks.group_arrivals``).
    """
    if _arrivals is not None:
        got = _arrivals.tally(members, _COMPLETED, floor_ns)
        if got is None:
            return None
        if got is not False:
            kept, seqs, arrivals, positions, diffs, lasts, late, spreads = got
            width = len(seqs)
            diff_rows = Rows(flat=diffs, width=width)

            def spread(j: int) -> float:
                known = spreads[j]  # (computed in C where the tally needed it)
                return jitter_ns(list(diff_rows[j])) if known is None else known

            return GroupTally(
                kept=kept,
                seqs=seqs,
                arrivals=Rows(flat=arrivals, width=width),
                positions=Rows(flat=positions, width=width),
                spread=spread,
                lasts=lasts,
                late=late,
            )
    return tally_py(members, floor_ns)


def members_of(
    m: Matched,
    group: str,
    recent: int,
    windows: dict[int, tuple[array[int], array[int]]],
) -> tuple[list[int], list[Member]]:
    """The members ``tally`` takes for ``group``, and their ranks (increasing).

    Members without a dump, or whose dump records no completion times, are left out (as
    ``clocks.completed_lanes``). ``windows`` (per group index) keeps what several groups'
    calls share.
    """
    ranks: list[int] = []
    members: list[Member] = []
    dumps = m.run.dumps
    for r in sorted(m.groups[group].ranks):
        gi = m.index.get(r, {}).get(group)
        d = dumps.get(r)
        if gi is None or d is None or not gi.seqs or not d.completion_times:
            continue
        window = windows.get(id(gi))
        if window is None:
            window = windows[id(gi)] = (
                _wide(gi.positions[-recent:]),
                _wide(gi.seqs[-recent:]),
            )
        e = d.dump.entries
        members.append((e.enqueue_ns, e.complete_ns, e.state, window[0], window[1], base_ns(m, r)))
        ranks.append(r)
    return ranks, members


def _wide(values: Sequence[int]) -> array[int]:
    """``values`` as 8-byte integers (unsigned beyond 2**63: the C path then declines)."""
    try:
        return array("q", values)
    except OverflowError:
        return array("Q", values)
