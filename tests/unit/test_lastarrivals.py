"""The straggler pass's per-group tally: the C loops (``_arrivals.c``) against the Python
definition (``lastarrivals.tally_py``) on arbitrary groups, and what the tally finds."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec.analysis.timing import lastarrivals
from flightrec.analysis.timing.clocks import STABLE_NS
from flightrec.analysis.timing.lastarrivals import (
    GroupTally,
    Member,
    last_arrivals,
    tally,
    tally_py,
)
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.view import narrow

C_LOOPS = lastarrivals._arrivals
_STATES = (pb.COMPLETED,) * 12 + (pb.ENQUEUED, pb.STARTED, pb.FAILED)
_MS = 1_000_000


def _needs_c() -> None:
    if C_LOOPS is None:
        pytest.skip("flightrec.analysis.timing._arrivals is not built")


def _as_lists(t: GroupTally | None) -> object:
    """Everything a tally says, as plain values (spreads of every member included)."""
    if t is None:
        return None
    k = len(t.kept)
    return (
        tuple(t.kept),
        tuple(t.seqs),
        [list(t.arrivals[j]) for j in range(k)],
        [list(t.positions[j]) for j in range(k)],
        [t.spread(j) for j in range(k)],
        list(t.lasts),
        [tuple(x) for x in t.late],
    )


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[Member], float]:
    """A group's members as ``tally`` takes them: rings of a few collectives with clocks
    apart, jitter that is small or not, a late member, outstanding or untimed entries,
    repeated seqs, and times on coarse steps so that ties happen."""
    n_members = draw(st.integers(2, 6))
    n_coll = draw(st.integers(3, 14))
    grid = draw(st.sampled_from([_MS, 250_000, 1, 3 * _MS]))
    start = draw(st.sampled_from([10**12, 1_790_000_000 * 10**9]))
    late_member = draw(st.integers(-1, n_members - 1))
    members: list[Member] = []
    for j in range(n_members):
        base = draw(st.sampled_from([0, 123_456_789, start // 2, start]))
        offset = draw(st.integers(-20, 20)) * grid
        wobble = draw(st.sampled_from([0, 1, 3, 400]))  # in grid steps per collective
        length = draw(st.sampled_from([n_coll, n_coll, n_coll + 1, n_coll + 3, 0, 2]))
        seqs, enq, comp, state = [], [], [], []
        for p in range(length):
            s = p + 1 if p < n_coll else draw(st.integers(0, n_coll))  # some repeated
            done = start + s * 50 * grid + offset + draw(st.integers(0, wobble)) * grid - base
            wait = draw(st.integers(0, 30)) * grid + (40 * grid if j == late_member else 0)
            seqs.append(s)
            comp.append(draw(st.sampled_from([done] * 12 + [0])))
            enq.append(draw(st.sampled_from([done - wait] * 12 + [0])))
            state.append(draw(st.sampled_from(_STATES)))
        if draw(st.integers(0, 4)) == 0:
            order = draw(st.permutations(range(length)))
            seqs = [seqs[i] for i in order]
        window = length - draw(st.sampled_from([0, 0, 0, 1, 2, length]))
        positions = list(range(length))[length - window :]
        members.append(
            (
                narrow(enq),
                narrow(comp),
                narrow(state),
                array("q", positions),
                array("q", seqs[length - window :]),
                base,
            )
        )
    floor = draw(st.sampled_from([0.0, 5e6, 1.5 * grid, 2.5e5]))
    return members, floor


_ALIKE = settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@_ALIKE
@given(group=groups())
def test_the_c_tally_returns_what_the_python_tally_returns(
    group: tuple[list[Member], float],
) -> None:
    _needs_c()
    assert C_LOOPS is not None
    members, floor = group
    got = C_LOOPS.tally(members, pb.COMPLETED, floor)
    assert got is not False  # (every time lies in the range the C loops compute in)
    assert _as_lists(tally(members, floor)) == _as_lists(tally_py(members, floor))


def test_the_generated_groups_reach_every_branch() -> None:
    """The comparison above is only as good as its examples: they include groups with no
    common collectives, late arrivals counted, drifting clocks and repeated seqs."""
    seen = {"none": 0, "late": 0, "tally": 0, "drift": 0, "repeated": 0}

    @_ALIKE
    @given(group=groups())
    def count(group: tuple[list[Member], float]) -> None:
        t = tally_py(*group)
        seen["none" if t is None else "tally"] += 1
        if t is None:
            return
        seen["late"] += bool(t.late)
        diffs = [
            [a - b for a, b in zip(group[0][j][1], group[0][t.kept[0]][1], strict=False)]
            for j in t.kept
        ]
        seen["drift"] += any(max(d) - min(d) > 2 * STABLE_NS for d in diffs if d)
        seen["repeated"] += any(list(group[0][j][4]) != sorted(set(group[0][j][4])) for j in t.kept)

    count()
    assert min(seen.values()) >= 30, seen


def _member(times: Sequence[tuple[int, int]], base: int = 0) -> Member:
    enq = array("q", [e for e, _ in times])
    comp = array("q", [c for _, c in times])
    n = len(times)
    return (
        enq,
        comp,
        array("B", [pb.COMPLETED] * n),
        array("q", range(n)),
        array("q", range(1, n + 1)),
        base,
    )


@pytest.mark.parametrize("c", [True, False])
def test_a_late_member_is_counted_on_the_anchor_clock(
    c: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if c:
        _needs_c()
    else:
        monkeypatch.setattr(lastarrivals, "_arrivals", None)
    # Member 1's clock runs 7 ms ahead; member 2 arrives 20 ms late at every collective.
    step = 100 * _MS
    m0 = _member([(i * step, i * step + 30 * _MS) for i in range(1, 6)])
    m1 = _member([(i * step + 7 * _MS, i * step + 37 * _MS) for i in range(1, 6)])
    m2 = _member([(i * step + 20 * _MS, i * step + 30 * _MS) for i in range(1, 6)])
    t = tally([m0, m1, m2], 5e6)
    assert t is not None
    assert t.kept == (0, 1, 2) and t.seqs == (1, 2, 3, 4, 5)
    assert list(t.arrivals[1]) == list(t.arrivals[0])  # 7 ms taken off
    assert list(t.lasts) == [0, 0, 5]
    assert [(i, j, margin) for i, j, margin in t.late] == [(i, 2, 20 * _MS) for i in range(5)]
    assert t.spread(2) == 0.0


def test_times_beyond_the_c_range_take_the_python_path() -> None:
    _needs_c()
    assert C_LOOPS is not None
    huge = 1 << 62
    members = [_member([(huge + i, huge + i + 5) for i in range(1, 5)]) for _ in range(2)]
    assert C_LOOPS.tally(members, pb.COMPLETED, 5e6) is False
    assert _as_lists(tally(members, 5e6)) == _as_lists(tally_py(members, 5e6))
    assert tally(members, 5e6) is not None


def test_ties_go_to_the_highest_member() -> None:
    lasts, late = last_arrivals([[5, 1], [5, 9], [3, 9]], lambda j: 0.0, 0.0)
    # Collective 0: members 0 and 1 tie last (member 1); collective 1: members 1 and 2 tie.
    assert lasts == [0, 1, 1]
    assert late == [(0, 1, 0), (1, 2, 0)]


def test_seqs_beyond_63_bits_take_the_python_path() -> None:
    _needs_c()
    assert C_LOOPS is not None
    top = (1 << 64) - 10
    members = [
        (
            array("q", [10, 20, 30, 40]),
            array("q", [15, 25, 35, 45]),
            array("B", [pb.COMPLETED] * 4),
            array("q", range(4)),
            lastarrivals._wide([top + i for i in range(4)]),
            0,
        )
        for _ in range(2)
    ]
    assert members[0][4].typecode == "Q"
    assert C_LOOPS.tally(members, pb.COMPLETED, 0.0) is False
    got = tally(members, 0.0)
    assert got is not None and got.seqs == tuple(top + i for i in range(4))
