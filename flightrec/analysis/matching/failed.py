"""Calls that read as finished but failed: the collective an exception came out of.

A recorder that cannot tell a finished collective from a failed one marks both alike: torch's
gloo recorder "retires" a work when it ends either way and records no completion time, so
DDP's gradient-bucket all-reduces (issued from C++, seen by that recorder only) read as
completed in a rank that gloo's own timeout killed inside one. The collective that timed out
is then the hang itself, yet it looks done, and a rank that never issued it looks merely
"behind" (a desync) instead of the rank everyone waited for.

The dump says more than the entry: the exception that ended the rank's main thread, and the
call site it left the program's code at. A collective issued at that very site, before the
exception, and never seen to complete (no completion time) did not end normally: the
exception came out of it. So, per rank whose main thread died of an exception:

* its newest such entry on each group, issued at the exception's call site, failed;
* so did every earlier one at that site that some member of the group never issued: no
  member completes a collective before every member has entered it.

Those entries are marked ``FAILED`` in the rank's dump (what a recorder that saw the failure
would have written), so every pass and renderer reads them alike: the ranks were blocked in
that collective when they died, and the members that never issued it are what they waited
for. Nothing here depends on the exception's type or message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flightrec.analysis.model import RankDump, user_frame
from flightrec.format import flightrec_pb2 as pb

_RETIRED = pb.COMPLETED
_FAILED = pb.FAILED
_IS_P2P = pb.IS_P2P


def settle_failed_calls(dumps: Mapping[int, RankDump]) -> dict[int, tuple[int, ...]]:
    """Mark ``FAILED`` the entries an exception came out of (see the module's rules).

    Only ranks whose main thread died of an exception are looked at closely (a few in any
    job), and each group's fewest issued collectives is worked out once, when asked for.
    Marking is idempotent: a second pass over the same dumps marks nothing more.

    Args:
        dumps: each rank's chosen dump.

    Returns:
        Per rank, the positions newly marked (none: the rank is absent).
    """
    fewest = _Fewest(dumps)
    marked: dict[int, tuple[int, ...]] = {}
    for rank, d in dumps.items():
        positions = _failed_in(d, fewest) if d.dump.meta.exceptions else ()
        if positions:
            states = d.dump.entries.state
            for p in positions:
                states[p] = _FAILED
            marked[rank] = positions
    return marked


class _Fewest:
    """Per group key, the fewest collectives any member with a dump issued on it."""

    def __init__(self, dumps: Mapping[int, RankDump]) -> None:
        self._dumps = dumps
        self._known: dict[str, int | None] = {}

    def __call__(self, key: str, members: Sequence[int]) -> int | None:
        if key not in self._known:
            counts = [n for q in members if (n := self._issued(q, key)) is not None]
            self._known[key] = min(counts, default=None)
        return self._known[key]

    def _issued(self, rank: int, key: str) -> int | None:
        d = self._dumps.get(rank)
        if d is None or key not in d.group_keys:
            return None
        local = d.group_keys.index(key)
        e = d.dump.entries
        ring = max((s for g, s in zip(e.group, e.seq, strict=True) if g == local), default=0)
        return max(d.dump.groups[local].last_seq, ring)


def _failed_in(d: RankDump, fewest: _Fewest) -> tuple[int, ...]:
    raised = next((x for x in d.dump.meta.exceptions if x.is_main), None)
    if raised is None:
        return ()
    site = user_frame(d.stack(raised.stack))
    if site is None:
        return ()
    e = d.dump.entries
    h = d.header
    # The exception's time on the ring's clock (the dump's own anchor).
    before = raised.wall_time_ns - (h.wall_time_ns - h.mono_time_ns)
    # Per group: the entries at the site, newest first, up to one seen to end (or failed).
    runs: dict[int, list[int]] = {}
    ended: set[int] = set()
    here: dict[int, bool] = {}
    for p in range(len(e.state) - 1, -1, -1):
        group = e.group[p]
        if group in ended or e.flags[p] & _IS_P2P or e.enqueue_ns[p] > before:
            continue
        s = e.stack[p]
        at = here.get(s)
        if at is None:
            at = here[s] = user_frame(d.stack(s)) == site
        if not at:
            continue
        if e.state[p] != _RETIRED or e.complete_ns[p]:
            ended.add(group)
            continue
        runs.setdefault(group, []).append(p)
    found: list[int] = []
    for local, run in runs.items():
        found.append(run[0])  # the newest: the call the exception came out of
        least = fewest(d.group_keys[local], d.dump.groups[local].ranks)
        if least is not None:
            found += [p for p in run[1:] if e.seq[p] > least]
    return tuple(sorted(found))
