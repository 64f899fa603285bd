"""Ranks that died: of an exception (the exception, where it was raised, and what it
explains), or whose process ended without one while others waited for them.

A dump (or black box) carries every exception that ended one of its process's threads. An
exception that ended the main thread is what the rank died of. Read from the rank's chosen
dump and from the dumps its process wrote after it (``Run.later``): a rank that raised after
the hang snapshot still says what it died of.

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
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from flightrec.analysis.findings.not_arrived import chain_end, whereabouts
from flightrec.analysis.kinds import kinds_where
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    Consequence,
    Evidence,
    ExceptionEvidence,
    Finding,
    FindingKind,
    FrameInfo,
    RankDump,
    is_library_frame,
    user_frame,
)
from flightrec.analysis.waitgraph.waits import Wait
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.ending import is_gone
from flightrec.readers.blackbox import died as blackbox_died
from flightrec.readers.blackbox import ended as blackbox_ended
from flightrec.text import ranks_phrase

KINDS = (FindingKind.DEAD_RANK,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""

SUMMARY_MESSAGE_CHARS = 160
"""An exception's message in a verdict line is cut here; the evidence has it whole."""
_COLLECTIVE_FRAME = re.compile(r"(/|^)torch/distributed/|^<flightrec ")
# Not a crash of the program: an interrupt (Ctrl-C, or the SIGINT torch.multiprocessing's
# children get when their parent goes) is how a stuck rank is ended, not why it was stuck.
_NOT_A_CRASH = frozenset({"KeyboardInterrupt", "SystemExit", "GeneratorExit"})
HANG_SLACK_NS = 2_000_000_000
"""Clocks of ranks on other hosts disagree by this much at most (as in the loader)."""


@dataclass(frozen=True, slots=True)
class RecordedException:
    """An exception that ended a thread of a rank's process, as a dump of it records it
    (``exceptions_of``)."""

    rank: int
    type: str
    message: str
    thread: str
    is_main: bool
    traceback: tuple[FrameInfo, ...]
    """Raising frame first."""
    wall_time_ns: int
    via: str
    dump: str

    @property
    def location(self) -> FrameInfo | None:
        """The innermost frame of the program's own code (else the raising frame)."""
        return user_frame(self.traceback)

    @property
    def in_collective(self) -> bool:
        """Raised from inside torch.distributed (a collective that failed or timed out)."""
        return any(_COLLECTIVE_FRAME.search(f.file.replace("\\", "/")) for f in self.traceback)

    def headline(self) -> str:
        """``ValueError: loss is NaN at train.py:57 in compute_loss``."""
        message = self.message.strip()
        if len(message) > SUMMARY_MESSAGE_CHARS:
            message = message[: SUMMARY_MESSAGE_CHARS - 1] + "…"
        text = f"{self.type}: {message}" if message else self.type
        loc = self.location
        return text + (f" at {loc.where()} in {loc.function}" if loc else "")

    def to_evidence(self) -> ExceptionEvidence:
        """The exception and its traceback, as a finding carries them."""
        return ExceptionEvidence(
            rank=self.rank,
            type=self.type,
            message=self.message,
            thread=self.thread,
            main_thread=self.is_main,
            seen_by=self.via,
            dump=self.dump,
            traceback=self.traceback,
            location=self.location,
        )


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


def exceptions_of(d: RankDump) -> list[RecordedException]:
    """Every exception a dump records, oldest first."""
    return [
        RecordedException(
            rank=d.rank,
            type=x.type,
            message=x.message,
            thread=x.thread,
            is_main=x.is_main,
            traceback=d.stack(x.stack),
            wall_time_ns=x.wall_time_ns,
            via=x.via,
            dump=d.path,
        )
        for x in d.dump.meta.exceptions
    ]


def died_of(m: Matched, rank: int) -> RecordedException | None:
    """The exception that ended ``rank``'s main thread, from any dump of its process."""
    run = m.run
    chosen = run.dumps.get(rank)
    if chosen is None:
        return None
    for d in (chosen, *run.later.get(rank, ())):
        for x in exceptions_of(d):
            if x.is_main and x.type not in _NOT_A_CRASH:
                return x
    return None


def process_ended(m: Matched, rank: int) -> bool:
    """Whether ``rank``'s process is gone: it died of an exception, wrote its exit dump (the
    chosen dump or one after it), or left a black box of a process that ended."""
    if rank in m.run.exited:
        return True
    chosen = m.run.dumps.get(rank)
    if chosen is None:
        return False
    for d in (chosen, *m.run.later.get(rank, ())):
        if is_gone(d.header):
            return True
    return died_of(m, rank) is not None


def thread_deaths(m: Matched, rank: int) -> list[RecordedException]:
    """Exceptions that ended other threads of ``rank``'s process (a data loader, a
    checkpoint writer): the main thread may wait for them forever."""
    d = m.run.dumps.get(rank)
    return [x for x in exceptions_of(d) if not x.is_main] if d is not None else []


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
        who = ranks_phrase(ranks)
        ident = f" ({m.dump(ranks[0]).describe()})" if len(ranks) == 1 else ""
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
                summary=f"{who[0].upper()}{who[1:]}{ident} died of {first.headline()}{never}",
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
    summary = (
        f"{w.named} exited without entering {end.what or 'the operation its peers wait in'}; "
        + "; ".join(w.phrases)
    )
    if len(end.ranks) == 1 and blackbox_ended(m.dump(end.ranks[0]).header):
        # "Rank 1 (host, pid) died after completing all_reduce #4; its last call was at
        # train.py:30; it never entered all_reduce #5 ..."
        summary = f"{w.named} {w.phrases[0].removeprefix('it ')}" + (
            f"; it never entered {end.what}" if end.what else ""
        )
    return Finding(
        kind=FindingKind.DEAD_RANK,
        ranks=end.ranks,
        summary=summary,
        process_group=end.process_group,
        pg_ranks=end.pg_ranks,
        seq=end.seq,
        op=end.op,
        consequences=end.consequences,
        evidence=end.evidence(w.culprits),
    )


def find_quiet_deaths(m: Matched, blamed: Set[int]) -> list[Finding]:
    """Ranks whose black box says they died, though nobody was left waiting on them.

    A death is news even then; ranks an earlier finding already blames are not repeated.

    Args:
        m: the lined-up histories.
        blamed: ranks the findings of higher priority blame (``pipeline.blamed_by``).

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
