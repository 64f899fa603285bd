"""A rank that left its own routine: the way out of a wait cycle.

In a wait cycle every rank waits for another one, so the wait-for graph alone blames all of
them. Training code repeats itself, though: step after step, each thread of each rank calls
the same lines in the same order. A rank-dependent branch (a skipped collective, an extra
one, a loop left early on uneven data) shows up on the rank that took it as a call that
followed a line it never followed before, where that line had always been followed by one
other call. When that happened to some ranks of a cycle while the others are still doing what
they always did, the ranks that left their routine are the cause, and the others wait for them.

The reasoning stays within each rank's own history, so it holds for ranks with different
roles (first and last pipeline stages call different lines) and needs no clock alignment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flightrec.analysis.model import RankDump, user_frame

# The call before the departure must have been made this often before, always followed by
# the same call: one earlier occurrence is not yet a routine.
MIN_REPEATS = 2
# Only a departure among a thread's newest entries explains the hang; an old one is history.
RECENT = 8


@dataclass(frozen=True, slots=True)
class Departure:
    """Where one rank's calls left the order they had always followed."""

    rank: int = field(metadata={"json": False})
    """(Not written in JSON: evidence lists departures by rank already.)"""
    position: int
    """Entry index (oldest first) of the first call off the routine."""
    after: str
    """The call before it: ``op at file:line``."""
    expected: str
    """The call that had always followed ``after``."""
    actual: str
    """The call made this time."""
    repeats: int
    """How many times ``after`` was followed by ``expected`` before."""

    def sentence(self) -> str:
        """``after send at train.py:65 it had always called ... (3 times); this time ...``."""
        return (
            f"it left its routine: after {self.after} it had always called {self.expected} "
            f"({self.repeats} times), this time it called {self.actual}"
        )


@dataclass(frozen=True, slots=True)
class Routine:
    """What a rank's newest calls say: a departure, or that it kept its routine."""

    departure: Departure | None
    kept: bool
    """No departure, and its newest calls repeat transitions seen at least MIN_REPEATS times."""


def _site(d: RankDump, i: int, cache: dict[int, str]) -> str:
    """``all_reduce at train.py:74``: the operation and the user line that issued it."""
    cols = d.dump.entries
    stack_id = int(cols.stack[i])
    where = cache.get(stack_id)
    if where is None:
        frame = user_frame(d.stack(stack_id)) if stack_id else None
        where = frame.where() if frame is not None else ""
        cache[stack_id] = where
    op = d.string(int(cols.op[i]))
    # Without a stack the group tells calls apart (rank-local index: this compares a rank
    # only with itself).
    return f"{op} at {where}" if where else f"{op} on group {int(cols.group[i])}"


def routine(d: RankDump, rank: int) -> Routine:
    """Whether ``rank``'s newest calls follow the order its earlier calls always did.

    Args:
        d: the rank's dump.
        rank: its global rank.

    Returns:
        The first departure among each thread's newest ``RECENT`` entries (the earliest
        over threads), or none, and whether the rank visibly kept its routine.
    """
    cols = d.dump.entries
    by_thread: dict[int, list[int]] = {}
    for i, thread in enumerate(cols.thread):
        by_thread.setdefault(int(thread), []).append(i)
    cache: dict[int, str] = {}
    found: Departure | None = None
    kept = False
    for positions in by_thread.values():
        sites = [_site(d, i, cache) for i in positions]
        follow: dict[str, Counter[str]] = {}
        recent_from = len(sites) - RECENT
        for k in range(1, len(sites)):
            before, now = sites[k - 1], sites[k]
            seen = follow.setdefault(before, Counter())
            if k >= recent_from:
                total = sum(seen.values())
                if total >= MIN_REPEATS and len(seen) == 1 and now not in seen:
                    if found is None or positions[k] < found.position:
                        expected = next(iter(seen))
                        found = Departure(rank, positions[k], before, expected, now, total)
                    break
                if seen[now] >= MIN_REPEATS:
                    kept = True
            seen[now] += 1
    return Routine(found, kept and found is None)
