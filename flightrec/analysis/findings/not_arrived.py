"""Findings about ranks at the end of a wait chain: they never arrived, exited, or left no dump.

For a rank with a dump, the evidence is what it was doing instead: its last completed
operation and its threads' stacks at dump time, reduced to the line of user code. For a rank
without one, the evidence is what its peers were waiting for from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    CollectiveRecord,
    Consequence,
    Evidence,
    Finding,
    FindingKind,
    FrameInfo,
    Status,
    user_frame,
)
from flightrec.analysis.waitgraph.routine import Departure
from flightrec.analysis.waitgraph.waits import Node
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import SOURCE as BLACKBOX_SOURCE
from flightrec.format.schema import RECORDER_SOURCE, SUMMARY_SOURCE
from flightrec.readers.blackbox import died, ended
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.NOT_ARRIVED, FindingKind.DEAD_RANK, FindingKind.MISSING_DUMP)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class LastCall:
    """A culprit's last completed (or, without completion tracking, issued) call."""

    op: str
    process_group: str
    seq: int
    location: FrameInfo | None
    """The user code that issued it; None when its stack has none."""
    seconds_before_dump: float


@dataclass(frozen=True, slots=True)
class CulpritEvidence:
    """Where one culprit with a dump was, from its dump."""

    host: str
    pid: int
    device: str
    dump: str
    """The dump file it was read from."""
    dump_reason: str
    """``HANG_DETECTED``, ``PROCESS_EXIT``, ``BLACKBOX``...: why (or how) the dump was taken."""
    stack: tuple[FrameInfo, ...]
    """Where it was at dump time, innermost frame first."""
    reason_detail: str = ""
    location: FrameInfo | None = None
    """The innermost user frame of ``stack``."""
    last_completed: LastCall | None = None
    """Its last completed call, where its dump tracks completion."""
    last_issued: LastCall | None = None
    """Its last issued call, where its dump does not track completion."""


@dataclass(frozen=True, slots=True)
class RankEvidence(Evidence):
    """Evidence of ``not_arrived``, ``dead_rank`` and ``missing_dump`` findings."""

    waiting_ranks: tuple[int, ...]
    """Every rank whose wait leads to the culprits."""
    waited_s: float | None = None
    """The longest of those waits; None when nobody waits."""
    culprits: Mapping[int, CulpritEvidence] | None = None
    """Per culprit with a dump, where it was (None for ``missing_dump``)."""
    routine: Mapping[int, Departure] | None = None
    """Per culprit, the call that left its routine, where that closed a wait cycle."""
    cycle: tuple[Node, ...] | None = None
    """The wait cycle that departure closed (rank and operation nodes, in order)."""
    cycle_summary: str | None = None
    """The cycle in words."""


@dataclass(frozen=True, slots=True)
class LateArrivalEvidence(Evidence):
    """Evidence of a ``not_arrived`` finding where the culprits did arrive, far too late."""

    late_by_s: float
    """How long after the others the late ranks entered."""
    waiting_ranks: tuple[int, ...]
    """The members that were on time."""


# The operation a P2P peer owes to a rank blocked in the key.
_COUNTERPART = {"send": "recv", "recv": "send", "isend": "irecv", "irecv": "isend"}


_PENDING = (pb.ENQUEUED, pb.STARTED)
_LOOK_BACK = 64
"""Entries of the peer's ring searched for the other end of a transfer."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """A blocking send or receive a rank sits in, and the other end where the peer entered it."""

    mine: CollectiveRecord
    theirs: CollectiveRecord | None


def stuck_transfer(m: Matched, rank: int) -> Transfer | None:
    """The blocking ``send``/``recv`` that is ``rank``'s newest entry and has not completed.

    Such a rank is in no wait the graph can explain when its peer entered the other end too
    (both ends present, neither done: tags that differ, or a transport that failed); its own
    call is still where it is. Asynchronous ``isend``/``irecv`` are left out: a rank that
    posted one goes on with its work, and where it is is its stack.
    """
    d = m.run.dumps.get(rank)
    if d is None or not len(d) or not d.tracks_completion:
        return None
    mine = d.record(len(d) - 1)
    if not mine.is_p2p or mine.flags & pb.ASYNC_OP or mine.state not in _PENDING:
        return None
    pd = m.run.dumps.get(mine.peer)
    theirs = None
    want = _COUNTERPART.get(mine.op)
    if pd is not None and want is not None:
        for i in range(len(pd) - 1, max(-1, len(pd) - 1 - _LOOK_BACK), -1):
            rec = pd.record(i)
            if (rec.is_p2p and rec.op.lstrip("i") == want and rec.peer == rank
                    and rec.group == mine.group and rec.p2p_seq == mine.p2p_seq):  # fmt: skip
                theirs = rec
                break
    return Transfer(mine, theirs)


def transfer_phrase(t: Transfer) -> str:
    """``waits in send #1 to rank 1 at train.py:21, whose recv ... entered too: ...``."""
    mine = t.mine
    word = "to" if "send" in mine.op else "from"
    frame = user_frame(mine.stack)
    at = f" at {frame.where()}" if frame else ""
    phrase = f"waits in {mine.op} #{mine.p2p_seq} {word} rank {mine.peer}{at}"
    theirs = t.theirs
    if theirs is not None and theirs.state in _PENDING:
        f2 = user_frame(theirs.stack)
        at2 = f" at {f2.where()}" if f2 else ""
        phrase += (
            f", and rank {mine.peer} waits in the other end ({theirs.op} #{theirs.p2p_seq}"
            f"{at2}): both entered the transfer and neither completed (a tag that differs, "
            "or a transport that failed)"
        )
    return phrase


def stuck_pair(rank: int, transfers: Mapping[int, Transfer | None]) -> int | None:
    """The other culprit sitting in the other end of ``rank``'s stuck transfer, if any
    (``transfers``: ``stuck_transfer`` of every culprit)."""
    t = transfers.get(rank)
    if t is None or t.theirs is None or t.theirs.state not in _PENDING:
        return None
    other = transfers.get(t.mine.peer)
    return t.mine.peer if other is not None and other.mine.peer == rank else None


def transfer_pair_phrase(a: Transfer, b: Transfer) -> str:
    """Two culprits stuck in the two ends of one transfer, said once."""

    def end(t: Transfer) -> str:
        frame = user_frame(t.mine.stack)
        word = "to" if "send" in t.mine.op else "from"
        at = f" at {frame.where()}" if frame else ""
        return f"rank {t.mine.rank} in {t.mine.op} #{t.mine.p2p_seq} {word} rank {t.mine.peer}{at}"

    return (
        f"they wait in the two ends of one transfer, {end(a)} and {end(b)}: both entered it and "
        "neither completed (a tag that differs, or a transport that failed)"
    )


def culprit_state(m: Matched, rank: int) -> Status:
    """Why nothing else explains this rank: alive elsewhere, exited, or no dump."""
    d = m.run.dumps.get(rank)
    if d is None:
        return Status.NO_DUMP
    if d.header.reason == pb.PROCESS_EXIT or ended(d.header):
        return Status.EXITED
    return Status.OUTSIDE


def doing(m: Matched, rank: int) -> tuple[str, CulpritEvidence]:
    """One phrase saying where ``rank`` was at dump time, and the evidence behind it."""
    d = m.dump(rank)
    last = m.last_completed_entry(rank)
    stack = d.current_stack()
    # An exit dump whose main thread has no frame left: the program had returned from main.
    returned = not stack and bool(d.dump.threads) and d.header.reason == pb.PROCESS_EXIT
    # A dump without thread stacks (a native one) shows no place the rank is now; its last
    # call's stack says where that call was made, and the verdict says no more than that.
    frame = user_frame(stack)
    last_call = None
    if last is not None:
        last_call = LastCall(
            op=last.op,
            process_group=last.group,
            seq=last.seq,
            location=user_frame(last.stack),
            seconds_before_dump=round(d.age_s(last.complete_ns), 3),
        )
    evidence = CulpritEvidence(
        host=d.header.hostname,
        pid=d.header.pid,
        device=d.header.device,
        dump=d.path,
        dump_reason=pb.DumpReason.Name(d.header.reason),
        stack=tuple(stack),
        reason_detail=d.header.reason_detail,
        location=frame or (user_frame(last.stack) if last is not None and not returned else None),
        last_completed=last_call if d.tracks_completion else None,
        last_issued=None if d.tracks_completion else last_call,
    )
    if d.header.reason == pb.BLACKBOX and last is not None:
        # Read back from its black box: no stacks at death, only its last recorded calls.
        lf = user_frame(last.stack)
        at = f"; its last call was at {lf.where()}" if lf else ""
        if ended(d.header):
            verb = "died" if died(d.header) else "exited"
            phrase = f"it {verb} after completing {last.call}{at}"
        else:  # alive but it never dumped: its ring, read from the file, is all there is
            phrase = f"it wrote no dump; its black box shows {last.call} done{at}"
    elif returned:
        phrase = "it had returned from main" + (f" after {last.call}" if last else "")
    elif (transfer := stuck_transfer(m, rank)) is not None:
        phrase = f"it {transfer_phrase(transfer)}"
    elif frame is not None:
        phrase = f"it was in {frame.function} at {frame.where()}"
    elif last is not None:
        # Where the last call was made, never "it was in": the rank may have left that line.
        lf = user_frame(last.stack)
        at = f" at {lf.where()}" if lf else ""
        word = "completed call" if d.tracks_completion else "call"
        phrase = f"its last {word} was {last.call} on group {last.group}{at}"
    else:
        phrase = "it recorded no completed call"
    return phrase, evidence


def rank_finding(
    m: Matched,
    ranks: Sequence[int],
    state: Status,
    primary: Consequence | None,
    consequences: Sequence[Consequence],
) -> Finding:
    """The finding for culprit ``ranks`` that share one state and one primary wait.

    Args:
        m: the lined-up histories.
        ranks: the culprits (global ranks).
        state: why they are at the end of the chain.
        primary: the operation their peers wait in most directly; None when nobody waits.
        consequences: every wait that leads to them.

    Returns:
        A ``not_arrived``, ``dead_rank`` or ``missing_dump`` finding.
    """
    ranks = tuple(sorted(ranks))
    # The most direct wait first, then the longest-standing ones.
    consequences = sorted(
        consequences, key=lambda c: (c != primary, -c.waited_s, c.process_group, c.seq)
    )
    who = ranks_phrase(ranks)
    who = who[0].upper() + who[1:]
    waiting = sorted({r for c in consequences for r in c.waiting})
    what = ""
    if primary is not None and primary.op in _COUNTERPART and primary.waiting:
        # A P2P wait: the culprit owes the other side of it, not the same operation.
        what = (
            f"the {_COUNTERPART[primary.op]} matching {ranks_phrase(primary.waiting)}'s "
            f"{primary.op} #{primary.seq} on group {primary.process_group}"
        )
    elif primary is not None:
        what = (
            f"{primary.label or primary.op} #{primary.seq} on group {primary.process_group} "
            f"[ranks {compress(primary.pg_ranks)}]"
        )
    waited_s = round(max(c.waited_s for c in consequences), 3) if primary is not None else None
    culprits: dict[int, CulpritEvidence] | None = None
    if state is Status.NO_DUMP:
        kind = FindingKind.MISSING_DUMP
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
                why = (
                    "a process killed hard, by a crash, the OOM killer or an abort, leaves no dump"
                )
            summary = (
                f"{who} left no dump; {ranks_phrase(primary.waiting)} "
                f"{'waits' if len(primary.waiting) == 1 else 'wait'} for "
                f"{'it' if len(ranks) == 1 else 'them'} in {what} ({why})"
            )
        else:
            summary = (
                f"{who} left no dump; no peer was waiting on {'it' if len(ranks) == 1 else 'them'}"
            )
    else:
        phrases: list[str] = []
        culprits = {}
        transfers = {r: stuck_transfer(m, r) for r in ranks} if len(ranks) > 1 else {}
        told: set[int] = set()  # ranks already named as the other end of a transfer
        for r in ranks:
            phrase, ev = doing(m, r)
            culprits[r] = ev
            if r in told:
                continue
            pair = stuck_pair(r, transfers)
            if pair is not None:
                told.add(pair)
                a, b = transfers[r], transfers[pair]
                assert a is not None and b is not None
                phrases.append(transfer_pair_phrase(a, b))
            elif len(ranks) == 1:
                phrases.append(phrase)
            else:
                phrases.append(f"rank {r}: {phrase.removeprefix('it ')}")
        d = m.dump(ranks[0])
        ident = f" ({d.describe()})" if len(ranks) == 1 else ""
        kind = FindingKind.DEAD_RANK if state is Status.EXITED else FindingKind.NOT_ARRIVED
        verb = "exited without entering" if state is Status.EXITED else "never entered"
        summary = f"{who}{ident} {verb} {what or 'the operation its peers wait in'}; " + "; ".join(
            phrases
        )
        if len(ranks) == 1 and ended(d.header):
            # "Rank 1 (host, pid) died after completing all_reduce #4; its last call was at
            # train.py:30; it never entered all_reduce #5 ..."
            summary = f"{who}{ident} {phrases[0].removeprefix('it ')}" + (
                f"; it never entered {what}" if what else ""
            )
    return Finding(
        kind=kind,
        ranks=ranks,
        summary=summary,
        process_group=primary.process_group if primary else None,
        pg_ranks=primary.pg_ranks if primary else (),
        seq=primary.seq if primary else None,
        op=primary.op if primary else None,
        consequences=tuple(consequences),
        evidence=RankEvidence(tuple(waiting), waited_s, culprits),
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
        rank_finding(m, [rank], Status.EXITED, None, ())
        for rank, d in sorted(m.run.dumps.items())
        if rank not in blamed and died(d.header)
    ]


def find_quiet_missing(m: Matched, blamed: Set[int]) -> list[Finding]:
    """Ranks without a dump that no earlier finding blames (nobody waited on them).

    Args:
        m: the lined-up histories.
        blamed: ranks the findings of higher priority blame (``pipeline.blamed_by``).

    Returns:
        One ``missing_dump`` finding for all of them, or none.
    """
    quiet = [r for r in m.run.missing_ranks if r not in blamed]
    return [rank_finding(m, quiet, Status.NO_DUMP, None, ())] if quiet else []
