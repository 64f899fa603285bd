"""Findings about ranks at the end of a wait chain that never arrived or left no dump.

For a rank with a dump, the evidence is what it was doing instead: its last completed
operation and its threads' stacks at dump time, reduced to the line of user code. For a rank
without one, the evidence is what its peers were waiting for from it. A rank that entered a
collective far too late, after every other member, did not arrive either. What these findings
share with ``dead_rank`` (a culprit whose process ended, ``crashes``) is in
``facts.culprits``: ``chain_end``, ``whereabouts`` and ``ChainEnd.blame``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages, blamed_by
from flightrec.analysis.facts.culprits import chain_end, named, whereabouts
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Consequence, Evidence, Finding, FindingKind
from flightrec.format.blackbox import SOURCE as BLACKBOX_SOURCE
from flightrec.format.schema import RECORDER_SOURCE, SUMMARY_SOURCE
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.NOT_ARRIVED, FindingKind.MISSING_DUMP)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class LateArrivalEvidence(Evidence):
    """Evidence of a ``not_arrived`` finding where the culprits did arrive, far too late."""

    late_by_s: float
    """How long after the others the late ranks entered."""
    waiting_ranks: tuple[int, ...]
    """The members that were on time."""


def not_arrived_finding(
    m: Matched,
    ranks: Sequence[int],
    primary: Consequence | None,
    consequences: Sequence[Consequence],
) -> Finding:
    """The ``not_arrived`` finding for culprit ``ranks``, alive and elsewhere, that share one
    primary wait (the arbitration's end of a chain whose ``culprit_state`` is ``OUTSIDE``).

    Args:
        m: the lined-up histories.
        ranks: the culprits (global ranks).
        primary: the operation their peers wait in most directly; None when nobody waits.
        consequences: every wait that leads to them.

    Returns:
        The finding.
    """
    end = chain_end(ranks, primary, consequences)
    w = whereabouts(m, end)
    return Finding(
        kind=FindingKind.NOT_ARRIVED,
        summary=w.verdict("never entered", end),
        **end.blame(w.culprits),
    )


def missing_dump_finding(
    m: Matched,
    ranks: Sequence[int],
    primary: Consequence | None,
    consequences: Sequence[Consequence],
) -> Finding:
    """The ``missing_dump`` finding for culprit ``ranks`` without a dump that share one
    primary wait (or none: ``find_quiet_missing``).

    Args:
        m: the lined-up histories.
        ranks: the culprits (global ranks).
        primary: the operation their peers wait in most directly; None when nobody waits.
        consequences: every wait that leads to them.

    Returns:
        The finding.
    """
    end = chain_end(ranks, primary, consequences)
    who, what = end.who, end.what
    ranks = end.ranks
    if primary is not None and set(ranks) <= m.run.exited:
        # No dump, but the rank said it ended: its loop or its data ran out before the
        # others' (uneven shards), or it took a branch that ends the program.
        summary = (
            f"{who} exited cleanly without entering {what}; "
            f"{ranks_phrase(primary.waiting)} {'waits' if len(primary.waiting) == 1 else 'wait'}"
            f" for {'it' if len(ranks) == 1 else 'them'} ({'it' if len(ranks) == 1 else 'they'}"
            " said so through the job's store as the process ended; a clean exit leaves no "
            "dump unless FLIGHTREC_DUMP_ON_EXIT=1)"
        )
    elif primary is not None:
        sources = {d.header.source for d in m.run.dumps.values()}
        if sources <= {RECORDER_SOURCE, BLACKBOX_SOURCE}:
            why = (
                "no dump and no black box: it most likely exited cleanly, which keeps "
                "neither unless FLIGHTREC_DUMP_ON_EXIT=1; a process killed hard keeps its "
                "black box, unless FLIGHTREC_BLACKBOX=0 or its files are not in this folder"
            )
        elif SUMMARY_SOURCE in sources:
            why = (
                "no summary through the store: its process was killed hard (SIGKILL, the "
                "OOM killer, an abort), or it is stuck where flightrec's threads cannot "
                "run, such as C code holding the GIL; its files on its host may say which"
            )
        else:
            why = "a process killed hard, by a crash, the OOM killer or an abort, leaves no dump"
        summary = (
            f"{who} left no dump; {ranks_phrase(primary.waiting)} "
            f"{'waits' if len(primary.waiting) == 1 else 'wait'} for "
            f"{'it' if len(ranks) == 1 else 'them'} in {what} ({why})"
        )
    else:
        summary = (
            f"{who} left no dump; no peer was waiting on {'it' if len(ranks) == 1 else 'them'}"
        )
    return Finding(kind=FindingKind.MISSING_DUMP, summary=summary, **end.blame(None))


def find_quiet_missing(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """Ranks without a dump that no finding above blames (nobody waited on them).

    Args:
        s: the stages before (of them, the lined-up histories).
        above: the findings listed before these.

    Returns:
        One ``missing_dump`` finding for all of them, or none.
    """
    blamed = blamed_by(above)
    quiet = [r for r in s.m.run.missing_ranks if r not in blamed]
    return [missing_dump_finding(s.m, quiet, None, ())] if quiet else []


def _late_arrivals(m: Matched, group: str, seq: int) -> tuple[list[int], float] | None:
    """Ranks that entered collective ``seq`` long after the others, and by how much.

    Arrival times are compared on the wall clock (each rank's monotonic time shifted by its
    dump's wall/monotonic anchor). Only a gap far above clock skew and ordinary jitter counts:
    one second, or half the watchdog timeout when that is longer.
    """
    arrivals: list[tuple[int, int]] = []
    timeouts: list[float] = []
    for rank in m.groups[group].ranks:
        d = m.run.dumps.get(rank)
        gi = m.index.get(rank, {}).get(group)
        pos = gi.position_of(seq) if gi else None
        if d is None or pos is None:
            return None
        enq = d.dump.entries.enqueue_ns[pos]
        if not enq or not d.header.wall_time_ns:
            return None
        arrivals.append((d.wall_ns(enq), rank))
        if d.header.timeout_s > 0:
            timeouts.append(d.header.timeout_s)
    arrivals.sort()
    threshold_ns = int(max(1.0, 0.5 * min(timeouts, default=0.0)) * 1e9)
    gaps = [(arrivals[i + 1][0] - arrivals[i][0], i) for i in range(len(arrivals) - 1)]
    if not gaps:
        return None
    gap, at = max(gaps)
    if gap < threshold_ns:
        return None
    return sorted(r for _, r in arrivals[at + 1 :]), gap / 1e9


def late_arrival_finding(
    m: Matched,
    group: str,
    seq: int,
    op: str,
    members: tuple[int, ...],
    consequences: Sequence[Consequence],
) -> Finding | None:
    """The ``not_arrived`` finding for members of a collective every member entered and none
    completed, where some entered long after the others (``stuck.stuck_finding`` asks).

    Args:
        m: the lined-up histories.
        group: the collective's group key.
        seq: its sequence number.
        op: its operation.
        members: the group's global ranks.
        consequences: the waits that lead to it.

    Returns:
        The finding; None when nobody entered that late.
    """
    late = _late_arrivals(m, group, seq)
    if late is None:
        return None
    # Everyone is in the collective now, but some arrived long after the others: in a
    # later dump (after timeouts fired) that is what a rank that did not arrive looks like.
    ranks, gap = late
    others = [r for r in members if r not in ranks]
    return Finding(
        kind=FindingKind.NOT_ARRIVED,
        ranks=tuple(ranks),
        summary=(
            f"{named(m, ranks)} entered {op} #{seq} on group {group} "
            f"[ranks {compress(members)}] {gap:.1f} s after {ranks_phrase(others)}, too late: "
            "none completed it"
        ),
        process_group=group,
        pg_ranks=members,
        seq=seq,
        op=op,
        consequences=tuple(consequences),
        evidence=LateArrivalEvidence(round(gap, 3), tuple(others)),
    )
