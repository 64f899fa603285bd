"""Stack hang: a hang told from stacks alone, in snapshots ``flightrec attach`` took of a job
that flightrec never traced and that served no ring of torch's.

Without a ring there are no sequence numbers to line up: each rank's place comes from its
frames (``place_of``): inside a collective (which one: a ``torch.distributed`` call, DDP's or
FSDP's or pipelining's machinery, autograd's backward where DDP and FSDP reduce gradients) or
outside any (the user's line), and whether its stack stayed the same over the samples attach
took (``still``). The ranks that wait, still, inside a collective are held up; the odd ones out
are the ranks that are elsewhere: outside any collective, or in another one than most. Where
every rank waits in the same collective, or none is in one, the stacks cannot tell who holds
the job up, and the finding says so with no rank blamed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages
from flightrec.analysis.facts.places import (
    Place,
    is_stack_snapshot,
    place_of,
    rank_thread,
)
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    Evidence,
    Finding,
    FindingKind,
    ThreadInfo,
    user_frame,
)
from flightrec.text import ranks_phrase

KINDS = (FindingKind.STACK_HANG,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""

BUSY = 0.02
"""The share of a CPU above which a thread whose stack stood still is taken to be working
(a long call into C: a matmul, a loop of all_reduces that the samples all caught at one line)
rather than waiting: a thread blocked in a gloo collective, a sleep or a lock uses none."""


@dataclass(frozen=True, slots=True)
class RanksAt:
    """Ranks whose stacks stand at one place."""

    ranks: tuple[int, ...]
    collective: str | None
    """None: outside any collective."""
    location: str
    """``file:line`` of the user's frame ("" when the stack has none)."""
    function: str
    moving: bool
    """They are running, not stuck: their stacks changed between attach's samples, or
    their threads used a CPU (``BUSY``) meanwhile."""


@dataclass(frozen=True, slots=True)
class StackHangEvidence(Evidence):
    """Evidence of a ``stack_hang`` finding."""

    places: tuple[RanksAt, ...]
    """Every place ranks stand at, the blamed ranks' first."""
    still_s: float
    """The shortest time over which the waiting ranks' stacks stayed the same."""
    undecided: str | None = None
    """Why no rank is blamed: ``same_collective`` (every rank waits in one), ``no_collective``
    (none is in one), ``even_split`` (as many wait in one collective as in another)."""
    children: tuple[str, ...] = ()
    """Where the blamed ranks' child processes are (DataLoader workers): ``rank 2's child pid
    123 is in __getitem__ at job.py:20``."""
    without_snapshot: tuple[int, ...] = ()
    """Ranks of the world with no snapshot here (on nodes attach was not run on)."""


@dataclass(frozen=True, slots=True)
class _Seen:
    rank: int
    place: Place
    still_ms: int
    cpu_ms: int

    @property
    def idle(self) -> bool:
        """Its thread used under ``BUSY`` of a CPU while its stack stood still: it waits."""
        return self.cpu_ms < BUSY * self.still_ms


def _who(m: Matched, ranks: Sequence[int]) -> str:
    who = ranks_phrase(list(ranks))
    who = who[0].upper() + who[1:]
    return f"{who} ({m.dump(ranks[0]).describe_process()})" if len(ranks) == 1 else who


def _children(m: Matched, ranks: Sequence[int]) -> tuple[str, ...]:
    out: list[str] = []
    for rank in ranks:
        by_pid: dict[int, ThreadInfo] = {}
        for t in m.dump(rank).threads():
            if t.pid and (t.pid not in by_pid or t.name == "MainThread"):
                by_pid[t.pid] = t
        for pid, t in sorted(by_pid.items()):
            at = user_frame(t.stack)
            if at is not None:
                out.append(f"rank {rank}'s child pid {pid} is in {at.function} at {at.where()}")
    return tuple(out)


def _group(seen: Sequence[_Seen], moving: frozenset[int]) -> list[RanksAt]:
    by: dict[tuple[str | None, str, str, bool], list[int]] = defaultdict(list)
    for s in seen:
        at = s.place.location
        key = (
            s.place.collective,
            at.where() if at else "",
            at.function if at else "",
            s.rank in moving,
        )
        by[key].append(s.rank)
    return [RanksAt(tuple(rs), c, loc, fn, mv) for (c, loc, fn, mv), rs in by.items()]


def find_stack_hangs(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """The stack hang of a folder of stack-only snapshots (``is_stack_snapshot``), if any.

    Args:
        s: the stages before; of them, the lined-up histories (here: no entries, only the
            ranks' threads).
        above: the findings listed before these (not read).

    Returns:
        One finding, or none: where every rank's stack moved (the job runs); where no rank
        stands apart and some rank's thread used a CPU (``BUSY``) while its stack stood
        still (a job caught at one line each time); or where some rank's dump is not such a
        snapshot (the ring's analysis speaks then).
    """
    m = s.m
    dumps = m.run.dumps
    if not dumps or not all(is_stack_snapshot(d.header, len(d)) for d in dumps.values()):
        return []
    seen: list[_Seen] = []
    for rank, d in sorted(dumps.items()):
        thread = rank_thread(d.threads())
        if thread is not None:
            seen.append(_Seen(rank, place_of(thread.stack), thread.still_ms, thread.cpu_ms))
    # Running: its stack changed between samples, or stood still while its thread worked
    # (a long call into C, a loop of collectives every sample caught at one line). Waiting:
    # still and idle inside a collective (blocked in gloo, a sleep or a lock uses no CPU).
    moving = frozenset(s.rank for s in seen if not s.still_ms or not s.idle)
    waiting = [s for s in seen if s.place.collective is not None and s.rank not in moving]
    outside = [s for s in seen if s.place.collective is None]
    missing = m.run.missing_ranks
    if waiting and outside:
        return [_odd_ones(m, waiting, outside, moving, missing)]
    if len(waiting) + len(outside) < len(seen) or moving:
        return []  # a rank goes on through collectives, or nobody waits while some run
    if not waiting:
        return [_undecided(m, seen, moving, "no_collective", missing)]
    # Everyone waits in a collective: the odd ones are in another than most.
    counts = Counter((s.place.collective, s.place.location) for s in waiting)
    (top, n), *rest = counts.most_common()
    if not rest:
        return [_undecided(m, seen, moving, "same_collective", missing)]
    if rest[0][1] == n:
        return [_undecided(m, seen, moving, "even_split", missing)]
    norm = [s for s in waiting if (s.place.collective, s.place.location) == top]
    odd = [s for s in waiting if (s.place.collective, s.place.location) != top]
    return [_odd_ones(m, norm, odd, moving, missing)]


def _still_s(waiting: Sequence[_Seen]) -> float:
    return min((s.still_ms for s in waiting), default=0) / 1000.0


def _odd_ones(
    m: Matched,
    waiting: Sequence[_Seen],
    odd: Sequence[_Seen],
    moving: frozenset[int],
    missing: Sequence[int],
) -> Finding:
    """The finding that blames the ranks in ``odd`` while those in ``waiting`` wait."""
    blamed = tuple(s.rank for s in odd)
    odd_places, norm = _group(odd, moving), _group(waiting, moving)
    first = odd_places[0]
    lines = [f"{_who(m, first.ranks)} {_is(first)}"]
    lines += [f"{ranks_phrase(list(p.ranks))} {_is(p)}" for p in odd_places[1:]]
    held = "; ".join(f"{ranks_phrase(list(p.ranks))} {_is(p)}" for p in norm)
    still = _still_s(waiting)
    children = _children(m, blamed)
    summary = f"{'; '.join(lines)}, while {held} (from stacks alone, still for {still:.1f} s)"
    if children:
        summary += f"; {'; '.join(children)}"
    return Finding(
        kind=FindingKind.STACK_HANG,
        ranks=blamed,
        summary=summary,
        op=waiting[0].place.collective,
        evidence=StackHangEvidence(
            (*odd_places, *norm), still, children=children, without_snapshot=tuple(missing)
        ),
    )


def _is(p: RanksAt) -> str:
    """``is in all_reduce at train.py:88``, ``is outside any collective, in f at x.py:3``."""
    where = f" at {p.location}" if p.location else ""
    verb = "is" if len(p.ranks) == 1 else "are"
    if p.collective is None:
        running = (
            " (running: its stack changed or its thread used a CPU between samples)"
            if p.moving
            else ""
        )
        inside = f", in {p.function}{where}" if p.function else ""
        return f"{verb} outside any collective{inside}{running}"
    return f"{'waits' if len(p.ranks) == 1 else 'wait'} in {p.collective}{where}"


_WHY = {
    "same_collective": (
        "the stacks cannot tell which rank holds them up (a rank without a snapshot, a "
        "disagreement in shapes or groups that only a ring shows, or the network)"
    ),
    "no_collective": "no rank is inside a collective: the hang, if it is one, is not in communication",
    "even_split": "as many ranks wait in one collective as in another: the stacks cannot tell which side is wrong",
}


def _undecided(
    m: Matched, seen: Sequence[_Seen], moving: frozenset[int], why: str, missing: Sequence[int]
) -> Finding:
    """The finding that blames no rank: the stacks cannot tell (``why``)."""
    places = _group(seen, moving)
    where = "; ".join(f"{ranks_phrase(list(p.ranks))} {_is(p)}" for p in places)
    lacking = (
        f"; {ranks_phrase(list(missing))} have no snapshot here: attach on their nodes too"
        if missing
        else ""
    )
    return Finding(
        kind=FindingKind.STACK_HANG,
        ranks=(),
        summary=f"From stacks alone: {where}; {_WHY[why]}{lacking}",
        op=next((p.collective for p in places if p.collective), None),
        evidence=StackHangEvidence(
            tuple(places),
            _still_s([s for s in seen if s.still_ms]),
            undecided=why,
            without_snapshot=tuple(missing),
        ),
    )
