"""Time outside communication: how long a rank computes between its operations.

A rank in a synchronous job alternates between its own work and operations it waits in. The
time between completing one operation and entering the next is its own (compute, data
loading, anything outside ``torch.distributed``); the rest it spends inside operations,
mostly waiting for slower peers. Comparing that own time across ranks that do the same work
tells a slow worker from the ranks that merely wait for it, and a slow pipeline stage from
its neighbours.

Entries are in the order the rank issued them. Asynchronous operations make it less simple
than "enqueue of the next minus completion of this one": a pipeline stage posts its sends and
computes on while they are in flight, and a batch of sends and receives is issued at once
and waited for together. So for each pair of consecutive entries, the rank's own time is
from the latest completion that falls between them (what released it) to the next entry;
when nothing completed between them, all of it. An asynchronous send releases a rank only
when it entered its next operation at once after the send completed (``ASYNC_RELEASE_NS``: a
pipeline schedule waiting for its sends before the backward pass); otherwise the send
completed while the rank computed on.

Used by the recorder's slow-check digest (its own ring) and by the analysis (every dump).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from flightrec.format import flightrec_pb2 as pb

_ASYNC_SEND = pb.ASYNC_OP | pb.IS_P2P | pb.SEND
ASYNC_RELEASE_NS = 2_000_000
"""An asynchronous send that completed at most this long before the rank's next entry
released it (the rank waited for it)."""


class Gap(NamedTuple):
    """The time between two consecutive entries, split into own time and blocked time."""

    own_ns: int
    """From the release (or the earlier entry, when nothing released it) to the later entry."""
    blocked_ns: int
    """From the earlier entry to the release: spent inside operations."""
    released_by: int
    """Index of the entry whose completion released the rank; -1 when none did."""


def releases(
    completions: Sequence[int], flags: Sequence[int]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(completion, index) of the completed entries, each list sorted: every one but the
    asynchronous sends, and the asynchronous sends."""
    done: list[tuple[int, int]] = []
    sent: list[tuple[int, int]] = []
    for i, (c, f) in enumerate(zip(completions, flags, strict=True)):
        if c:
            (sent if f & _ASYNC_SEND == _ASYNC_SEND else done).append((c, i))
    done.sort()
    sent.sort()
    return done, sent


def _latest(done: list[tuple[int, int]], times: list[int], lo: int, hi: int, i: int) -> int:
    """Position in ``done`` of the latest completion in (lo, hi] of an entry up to ``i``."""
    k = bisect_right(times, hi) - 1
    while k >= 0 and times[k] > lo and done[k][1] > i:
        k -= 1  # (a later entry that completed at once: it released nothing before it)
    return k if k >= 0 and times[k] > lo else -1


def _windows(
    enqueue: Sequence[int], completions: Sequence[int], flags: Sequence[int]
) -> Iterator[tuple[int, int, int, int]]:
    """Per consecutive pair of entries with both enqueue times: (i, start of own time, its
    end, releasing entry or -1); the definition ``gaps`` and ``own_time`` share."""
    done, sent = releases(completions, flags)
    times = [c for c, _ in done]
    sent_times = [c for c, _ in sent]
    for i in range(len(enqueue) - 1):
        lo, hi = enqueue[i], enqueue[i + 1]
        if not lo or not hi or hi < lo:
            continue
        at, by = lo, -1
        k = _latest(done, times, lo, hi, i)
        if k >= 0:
            at, by = done[k]
        if sent:
            k = _latest(sent, sent_times, max(lo, hi - ASYNC_RELEASE_NS), hi, i)
            if k >= 0 and sent[k][0] > at:
                at, by = sent[k]
        yield i, at, hi, by


def gaps(
    enqueue: Sequence[int], completions: Sequence[int], flags: Sequence[int]
) -> list[Gap | None]:
    """Per consecutive pair of entries (``i``, ``i + 1``), its ``Gap``; None where either
    entry has no enqueue time.

    Args:
        enqueue: when each entry was issued, in issue order, on one clock (ns).
        completions: when each completed on the same clock; 0 where unknown.
        flags: each entry's ``EntryFlag`` bits.

    Returns:
        ``len(enqueue) - 1`` gaps.
    """
    out: list[Gap | None] = [None] * max(0, len(enqueue) - 1)
    for i, at, hi, by in _windows(enqueue, completions, flags):
        out[i] = Gap(hi - at, at - enqueue[i], by)
    return out


def own_time(
    enqueue: Sequence[int], completions: Sequence[int], flags: Sequence[int]
) -> tuple[int, int]:
    """Own time and the span it was measured over (ns), over every consecutive pair of
    entries with both times (``gaps``, summed)."""
    own = span = 0
    for i, at, hi, _ in _windows(enqueue, completions, flags):
        own += hi - at
        span += hi - enqueue[i]
    return own, span


def signature(op: int, group: int, flags: int, peer: int) -> int:
    """One value naming an entry's operation for ``step_period``: its op and group (indices
    of one ring's tables), direction and peer."""
    return (op << 24) ^ (group << 16) ^ (flags & (pb.IS_P2P | pb.SEND)) ^ ((peer + 1) << 32)


def step_period(signature: Sequence[int], agreement: float = 0.97) -> int | None:
    """Entries per training step: the smallest period ``P`` at which the newest operations
    repeat (``signature[i] == signature[i + P]`` for at least ``agreement`` of them, over
    the newest two thirds of the sequence and at least three repetitions: a ring's oldest
    entries may be the job's start, which never repeats, and its newest few its end); None
    when nothing repeats that regularly.

    Args:
        signature: one value per entry that names the operation (``signature``).
        agreement: the share of positions that must repeat.
    """
    for skip in range(4):  # (the very newest may be the job's end: a barrier, a dump)
        found = _period(list(reversed(signature))[skip:], agreement)
        if found is not None:
            return found
    return None


def _period(newest: list[int], agreement: float) -> int | None:
    n = len(newest)
    for p in range(1, n // 3 + 1):
        if newest[p] != newest[0] or newest[p + 1 : p + 4] != newest[1:4]:
            continue
        span = min(n, max(3 * p, (2 * n) // 3)) - p
        allowed = int((1.0 - agreement) * span)
        misses = 0
        for a, b in zip(newest[:span], newest[p : p + span], strict=True):
            if a != b:
                misses += 1
                if misses > allowed:
                    break
        else:
            return p
    return None


WINDOW = 512
"""Newest entries of a ring whose gaps are measured (the analysis and the digest alike)."""
MAX_PEERS = 8
"""Point-to-point peers a ring summary keeps (a pipeline stage has two)."""


class RingActivity(NamedTuple):
    """What one rank's ring says of its own time and its pipeline neighbours."""

    own_ns: int
    """Time outside communication over its newest entries (``own_time``)."""
    span_ns: int
    """The time that was measured over."""
    entries: int
    """Entries measured."""
    period: int
    """Entries per step (``step_period``); 0 when no step repeats."""
    peers: tuple[int, ...]
    """Global ranks it sent to or received from, at most ``MAX_PEERS``, increasing."""


def ring_activity(
    enqueue: Sequence[int],
    completions: Sequence[int],
    flags: Sequence[int],
    signature: Sequence[int],
    peers: Sequence[int],
) -> RingActivity:
    """Own time, step period and P2P peers of a ring's entries (issue order, newest last;
    completions 0 where an entry did not complete; ``peers`` -1 for collectives)."""
    first = max(0, len(enqueue) - WINDOW)
    own, span = own_time(enqueue[first:], completions[first:], flags[first:])
    period = step_period(signature[first:]) or 0
    mine = sorted({p for p, f in zip(peers, flags, strict=True) if f & pb.IS_P2P and p >= 0})
    return RingActivity(own, span, len(enqueue) - first, period, tuple(mine[:MAX_PEERS]))
