"""Ranks that died: of an exception (the exception, where it was raised, and what it
explains), or whose process ended without one while others waited for them.

What a rank died of, and whether its process is gone, is ``facts.deaths``'.

Which crashes explain the job:
* the earliest, raised before the hang (or in a job without a hang) in the program's own
  code, is the root cause: "rank 2 died of ValueError: ... at train.py:57 in compute_loss";
* later ones (gloo's "Connection closed by peer" on the peers of a rank that left, timeouts)
  are consequences, listed after the other findings;
* one raised after the hang event is what happened next: evidence on the finding that
  blames that rank, never its verdict.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages, blamed_by
from flightrec.analysis.facts.culprits import chain_end, named, whereabouts
from flightrec.analysis.facts.deaths import (
    HANG_SLACK_NS,
    RecordedException,
    died_of,
    thread_deaths,
)
from flightrec.analysis.kinds import kinds_where
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    Consequence,
    Evidence,
    ExceptionEvidence,
    Finding,
    FindingKind,
    RankDump,
    is_library_frame,
    user_frame,
)
from flightrec.analysis.waitgraph.waits import Wait
from flightrec.format import flightrec_pb2 as pb
from flightrec.readers.blackbox import died as blackbox_died
from flightrec.readers.blackbox import ended as blackbox_ended

KINDS = (FindingKind.DEAD_RANK,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class CrashEvidence(Evidence):
    """Evidence of a ``dead_rank`` finding for ranks that died of an exception (the exception
    itself is ``Finding.exception``)."""

    in_collective: bool
    """Raised from inside torch.distributed (a collective that failed or timed out), or at
    the line of an operation the rank never completed (``work.wait()``)."""
    raised_after_hang: bool
    """Raised after the hang event: what happened next, not why the job hung."""
    exceptions: Mapping[int, ExceptionEvidence] | None = None
    """Per rank, when several ranks died of the same exception at the same line."""


def find_deaths(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """Ranks that died: those whose black box says so though nobody waited on them and
    nothing above blames them (``find_quiet_deaths``), then every exception ranks died of
    (``find_crashes``), which ``place_crashes`` puts where each explains most once every
    finder has run.

    Args:
        s: the stages before (every blocked entry: ``Stages.wait_graph``).
        above: the findings listed before these.

    Returns:
        The ``dead_rank`` findings, in that order.
    """
    return find_quiet_deaths(s.m, blamed_by(above)) + find_crashes(s.m, s.wait_graph.waits)


def find_crashes(m: Matched, waits: Sequence[Wait]) -> list[Finding]:
    """One ``dead_rank`` finding per exception (type and line) ranks died of, earliest first.

    ``place_crashes`` then puts each where it explains most (after every candidate has run).

    Args:
        m: the lined-up histories.
        waits: every blocked entry (``waits.build_wait_graph``).

    Returns:
        The crashes, earliest first.
    """
    hang = m.run.hang_wall_ns
    # Where each rank waits in an operation it never completed: an exception raised at that
    # very line came out of the operation (``work.wait()`` of an irecv raises with no frame of
    # torch's Python code on the stack), as gloo's timeouts and resets do.
    raised = {rank: x for rank in sorted(m.run.dumps) if (x := died_of(m, rank)) is not None}
    pending: dict[int, set[str]] = defaultdict(set)
    for w in waits if raised else ():
        if w.rank in raised:  # (a record is materialised only for a rank that raised)
            frame = user_frame(m.dump(w.rank).record(w.position).stack)
            if frame is not None:
                pending[w.rank].add(frame.where())
    by_cause: dict[tuple[str, str, bool], list[RecordedException]] = defaultdict(list)
    for rank, x in raised.items():
        loc = x.location
        where = loc.where() if loc else ""
        in_op = x.in_collective or where in pending.get(rank, ()) or _in_unseen_call(m, rank, x)
        by_cause[(x.type, where, in_op)].append(x)
    findings: list[Finding] = []
    for (_, _, in_op), xs in sorted(
        by_cause.items(), key=lambda kv: min(x.wall_time_ns for x in kv[1])
    ):
        first = min(xs, key=lambda x: x.wall_time_ns)
        ranks = tuple(sorted(x.rank for x in xs))
        after = bool(hang) and first.wall_time_ns > hang + HANG_SLACK_NS
        never = "" if any(_issued_any(m.dump(r)) for r in ranks) else ", before any collective"
        if after:  # a consequence: said so where it is listed
            never += f", {(first.wall_time_ns - hang) / 1e9:.0f} s after the hang was declared"
        evidence = CrashEvidence(
            in_collective=in_op,
            raised_after_hang=after,
            exceptions={x.rank: x.to_evidence() for x in xs} if len(xs) > 1 else None,
        )
        findings.append(
            Finding(
                kind=FindingKind.DEAD_RANK,
                ranks=ranks,
                summary=f"{named(m, ranks)} died of {first.headline()}{never}",
                evidence=evidence,
                exception=first.to_evidence(),
            )
        )
    return findings


def _issued_any(d: RankDump) -> bool:
    """Whether the rank issued any collective: its ring holds one, or a group's counter says
    so (a black box keeps only the calls flightrec's hooks saw)."""
    return len(d) > 0 or any(g.last_seq for g in d.dump.groups)


def exited_finding(
    m: Matched,
    ranks: Sequence[int],
    primary: Consequence | None,
    consequences: Sequence[Consequence],
) -> Finding:
    """The ``dead_rank`` finding for culprit ``ranks`` whose process ended (an exit dump, or
    a black box that says so) and that share one primary wait (or none: ``find_quiet_deaths``).

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
    summary = w.verdict("exited without entering", end)
    if len(end.ranks) == 1 and blackbox_ended(m.dump(end.ranks[0]).header):
        # "Rank 1 (host, pid) died after completing all_reduce #4; its last call was at
        # train.py:30; it never entered all_reduce #5 ..."
        summary = f"{w.named} {w.phrases[0].removeprefix('it ')}" + (
            f"; it never entered {end.what}" if end.what else ""
        )
    return Finding(kind=FindingKind.DEAD_RANK, summary=summary, **end.blame(w.culprits))


def find_quiet_deaths(m: Matched, blamed: Set[int]) -> list[Finding]:
    """Ranks whose black box says they died, though nobody was left waiting on them.

    A death is news even then; ranks an earlier finding already blames are not repeated.

    Args:
        m: the lined-up histories.
        blamed: ranks the findings listed above blame (``candidates.blamed_by``).

    Returns:
        One ``dead_rank`` finding per such rank, in rank order.
    """
    return [
        exited_finding(m, [rank], None, ())
        for rank, d in sorted(m.run.dumps.items())
        if rank not in blamed and blackbox_died(d.header)
    ]


def place_crashes(m: Matched, findings: list[Finding]) -> list[Finding]:
    """Put each crash ``find_crashes`` found where it explains most.

    The earliest crash, raised in the program's own code before any hang, is why the job
    ended: it comes first, as the verdict of the finding that already blames that rank (which
    moves to the front) or as a finding of its own. Every later crash (peers failing once it
    was gone, timeouts after a hang) is a consequence: the evidence of the finding that blames
    that rank alone, else a finding after the others. A rank blamed alone whose other
    thread died of an exception (its data loader, say) gets that said in its verdict.

    Args:
        m: the lined-up histories.
        findings: every candidate's findings, most likely root cause first.

    Returns:
        All findings, most likely root cause first.
    """
    crashes = [f for f in findings if isinstance(f.evidence, CrashEvidence)]
    out = [f for f in findings if not isinstance(f.evidence, CrashEvidence)]
    root: Finding | None = None
    last: list[Finding] = []
    for n, crash in enumerate(crashes):
        assert isinstance(crash.evidence, CrashEvidence)
        is_root = (
            n == 0
            and not crash.evidence.raised_after_hang
            and not crash.evidence.in_collective
            and not _raised_in_blamed_call(m, crash, out)
        )
        same = [i for i, f in enumerate(out) if f.ranks == crash.ranks and f.kind in _BLAMES]
        if same:
            f = out[same[0]]
            if is_root:
                owed = f"; it never entered {_what(f)}" if f.op else ""
                root = dataclasses.replace(
                    f, summary=crash.summary + owed, exception=crash.exception
                )
                del out[same[0]]
            else:
                out[same[0]] = dataclasses.replace(f, exception=crash.exception)
        elif is_root:
            root = crash
        else:
            last.append(crash)
    out = [_with_thread_deaths(m, f) for f in out]
    return ([root] if root else []) + out + last


def _raised_in_blamed_call(m: Matched, crash: Finding, findings: list[Finding]) -> bool:
    """Whether every rank of ``crash`` died inside the collective a finding blames on other
    ranks (a mismatch, a rank that never arrived), or in a later one on that group: the
    backend failed the group's calls under them ("Connection reset by peer" once the culprit
    was aborted, a timeout while it stayed away). The traceback need not show it: DDP's
    bucket all-reduces fail inside ``backward()``, with no torch.distributed frame.
    """
    for f in findings:
        if f.process_group is None or f.seq is None or set(f.ranks) & set(crash.ranks):
            continue
        if all(_failed_from(m, r, f.process_group, f.seq) for r in crash.ranks):
            return True
    return False


def _failed_from(m: Matched, rank: int, group: str, seq: int) -> bool:
    """Whether ``rank`` was inside collective ``seq`` of ``group``, or a later one of that
    group, when its exception ended it."""
    e = m.record(rank, group, seq)
    # The call itself, unfinished or the last the rank issued on the group: gloo's own
    # recorder marks a failed call retired, like a finished one.
    if e is not None and (e.state != pb.COMPLETED or m.last_seq(rank, group) == seq):
        return True
    d = m.dump(rank)
    cols = d.columns
    for p in m.incomplete.get(rank, ()):  # a later call of the group that never completed
        if d.group_keys[cols["group"][p]] == group and cols["seq"][p] > seq:
            return True
    # A ring without the group's calls from there on (a black box holds only what flightrec's
    # hooks saw), whose counter went past it.
    progress = m.groups[group].progress.get(rank) if group in m.groups else None
    return (
        e is None
        and progress is not None
        and progress.last_seq >= seq
        and _in_unseen_call(m, rank, died_of(m, rank))
    )


def _in_unseen_call(m: Matched, rank: int, x: RecordedException | None) -> bool:
    """Whether exception ``x``, raised inside torch's code, ended ``rank`` while a group's
    counter stood past the calls its ring holds (nothing says those completed): it came out
    of a collective flightrec's hooks never saw (DDP's C++ bucket all-reduces, in a black box
    that holds only what the hooks saw)."""
    if x is None or not x.traceback or not is_library_frame(x.traceback[0]):
        return False
    d = m.dump(rank)
    for local, group in enumerate(d.group_keys):
        gi = m.index.get(rank, {}).get(group)
        newest = gi.seqs[-1] if gi is not None and gi.seqs else 0
        # (calls the ring overwrote are older than those it holds, and counted as dropped)
        if d.dump.groups[local].last_seq > max(newest, d.dump.groups[local].dropped):
            return True
    return False


def _with_thread_deaths(m: Matched, f: Finding) -> Finding:
    if len(f.ranks) != 1 or f.kind not in _BLAMES or f.exception is not None:
        return f
    deaths = thread_deaths(m, f.ranks[0])
    if not deaths:
        return f
    x = deaths[0]
    return dataclasses.replace(
        f,
        summary=f"{f.summary}; its thread {x.thread!r} had died of {x.headline()}",
        thread_exceptions=tuple(d.to_evidence() for d in deaths),
    )


_BLAMES = kinds_where("crash_explains")
"""Findings that blame ranks for what they did instead of arriving: a crash can explain it."""


def _what(f: Finding) -> str:
    group = f" on group {f.process_group}" if f.process_group else ""
    return f"{f.op} #{f.seq}{group}" if f.seq is not None else f"{f.op}{group}"
