"""Findings about ranks at the end of a wait chain: they never arrived, exited, or left no dump.

For a rank with a dump, the evidence is what it was doing instead: its last completed
operation and its threads' stacks at dump time, reduced to the line of user code. For a rank
without one, the evidence is what its peers were waiting for from it.
"""

from __future__ import annotations

from collections.abc import Sequence

from flightrec.analysis.matching import Matched
from flightrec.analysis.model import (
    Consequence,
    Culprit,
    Finding,
    FindingKind,
    FrameInfo,
    user_frame,
)
from flightrec.format import flightrec_pb2 as pb
from flightrec.readers.blackbox import died, ended
from flightrec.text import compress, ranks_phrase


def frame_json(frame: FrameInfo) -> dict[str, object]:
    """A frame as JSON."""
    out: dict[str, object] = {"file": frame.file, "function": frame.function, "line": frame.line}
    if frame.code:
        out["code"] = frame.code
    return out


# The operation a P2P peer owes to a rank blocked in the key.
_COUNTERPART = {"send": "recv", "recv": "send", "isend": "irecv", "irecv": "isend"}


def culprit_state(m: Matched, rank: int) -> Culprit:
    """Why nothing else explains this rank: alive elsewhere, exited, or no dump."""
    d = m.run.dumps.get(rank)
    if d is None:
        return Culprit.NO_DUMP
    if d.header.reason == pb.PROCESS_EXIT or ended(d.header):
        return Culprit.EXITED
    return Culprit.OUTSIDE


def doing(m: Matched, rank: int) -> tuple[str, dict[str, object]]:
    """One phrase saying where ``rank`` was at dump time, and the evidence behind it."""
    d = m.dump(rank)
    last = m.last_completed_entry(rank)
    stack = d.current_stack()
    # An exit dump whose main thread has no frame left: the program had returned from main.
    returned = not stack and bool(d.dump.threads) and d.header.reason == pb.PROCESS_EXIT
    if not stack and last is not None and not returned:
        # No thread stacks (converted native dumps): the last call's stack is the best clue.
        stack = last.stack
    frame = user_frame(stack)
    last_key = "last_completed" if d.tracks_completion else "last_issued"
    evidence: dict[str, object] = {
        "host": d.header.hostname,
        "pid": d.header.pid,
        "device": d.header.device,
        "dump": d.path,
        "dump_reason": pb.DumpReason.Name(d.header.reason),
        "stack": [frame_json(f) for f in stack],
    }
    if d.header.reason_detail:
        evidence["reason_detail"] = d.header.reason_detail
    if frame is not None:
        evidence["location"] = frame_json(frame)
    if last is not None:
        lf = user_frame(last.stack)
        evidence[last_key] = {
            "op": last.op,
            "process_group": last.group,
            "seq": last.seq,
            "location": frame_json(lf) if lf else None,
            "seconds_before_dump": round(d.age_s(last.complete_ns), 3),
        }
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
    elif frame is not None:
        phrase = f"it was in {frame.function} at {frame.where()}"
    elif last is not None:
        word = "completed" if d.tracks_completion else "issued"
        phrase = f"its last {word} call was {last.call} on group {last.group}"
    else:
        phrase = "it recorded no completed call"
    return phrase, evidence


def rank_finding(
    m: Matched,
    ranks: Sequence[int],
    state: Culprit,
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
            f"{primary.op} #{primary.seq} on group {primary.process_group} "
            f"[ranks {compress(primary.pg_ranks)}]"
        )
    evidence: dict[str, object] = {"waiting_ranks": waiting}
    if primary is not None:
        evidence["waited_s"] = round(max(c.waited_s for c in consequences), 3)
    if state is Culprit.NO_DUMP:
        kind = FindingKind.MISSING_DUMP
        if primary is not None:
            summary = (
                f"{who} left no dump; {ranks_phrase(primary.waiting)} "
                f"{'waits' if len(primary.waiting) == 1 else 'wait'} for "
                f"{'it' if len(ranks) == 1 else 'them'} in {what} (a process killed hard, by a "
                "crash, the OOM killer or an abort, leaves no dump)"
            )
        else:
            summary = (
                f"{who} left no dump; no peer was waiting on {'it' if len(ranks) == 1 else 'them'}"
            )
    else:
        phrases: list[str] = []
        per_rank: dict[str, object] = {}
        for r in ranks:
            phrase, ev = doing(m, r)
            per_rank[str(r)] = ev
            if len(ranks) == 1:
                phrases.append(phrase)
            else:
                phrases.append(f"rank {r}: {phrase.removeprefix('it ')}")
        evidence["culprits"] = per_rank
        d = m.dump(ranks[0])
        ident = f" ({d.describe()})" if len(ranks) == 1 else ""
        kind = FindingKind.DEAD_RANK if state is Culprit.EXITED else FindingKind.NOT_ARRIVED
        verb = "exited without entering" if state is Culprit.EXITED else "never entered"
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
        kind=kind.value,
        ranks=ranks,
        summary=summary,
        process_group=primary.process_group if primary else None,
        pg_ranks=primary.pg_ranks if primary else (),
        seq=primary.seq if primary else None,
        op=primary.op if primary else None,
        consequences=tuple(consequences),
        evidence=evidence,
    )
