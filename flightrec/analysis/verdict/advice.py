"""What to do next: each finding's recommendation, and how sure the analysis is of it.

Two answers cover what a person on call decides first:

* **restart** (``Action.RESTART``) when the job stopped on something outside its code: a rank
  stalled or died without an error of its own, a node left no dump, a GPU stopped completing
  work, a collective is stuck in NCCL or the network, a worker is slow. The code is fine; if
  it happens again on the same node, leave that node out.
* **stop and fix the code** (``Action.FIX_CODE``) when a restart would fail the same way:
  ranks disagree about a collective, a rank skipped or added one, raised an exception,
  left the order of calls it always followed, ranks wait on each other in a cycle, groups
  fall out of step, or the work is split unevenly (a slow stage, spread imbalance).

A kind's row gives the usual answer (``KindSpec.action``); the finding's own evidence can
change it (a dead rank that died of an exception, a rank that skipped a call). Confidence
starts ``high`` and drops a step for each thing the verdict had to do without: dumps that
are missing, rings that wrapped past the collective it is about, clocks that could not be
aligned (for findings built on times compared across ranks), transfers of wrapped rings
that could not be lined up. A verdict on waits shorter than the hang timeout, or one the
finding itself calls uncertain (rank 0's extra work), is ``low``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from flightrec.analysis.facts.culprits import RankEvidence
from flightrec.analysis.facts.lateness import StragglerEvidence
from flightrec.analysis.findings.stuck import FailedAloneEvidence
from flightrec.analysis.kinds import KINDS
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Action, Advice, Finding, FindingKind, user_frame
from flightrec.text import ranks_phrase

_LEVELS: tuple[Literal["high", "medium", "low"], ...] = ("high", "medium", "low")

_WHY: dict[FindingKind, str] = {
    FindingKind.NOT_ARRIVED: "{who} stopped outside the collective its peers wait in (a stall, "
    "not a disagreement)",
    FindingKind.DEAD_RANK: "{who}'s process ended while its peers waited",
    FindingKind.MISSING_DUMP: "{who} left no dump: its process or its node is gone",
    FindingKind.MISMATCH: "the ranks disagree about what they pass to one collective",
    FindingKind.P2P_DEADLOCK: "ranks wait on each other in a cycle of sends and receives",
    FindingKind.DEADLOCK: "ranks wait on each other in a cycle of collectives",
    FindingKind.STUCK: "the collective is stuck on the GPUs, in NCCL or the network: no rank "
    "is missing or wrong",
    FindingKind.STACK_HANG: "{who} stopped outside the collective the others wait in (read from "
    "their stacks alone)",
    FindingKind.P2P_UNMATCHED: "sends and receives do not pair up",
    FindingKind.DESYNC: "a group's ranks issued different numbers of collectives (uneven data, "
    "a loop left early)",
    FindingKind.STRAGGLER: "{who} is slow itself (its GPU or node): if it stays slow, move the "
    "job off that node",
    FindingKind.SLOW_STAGE: "the model is split unevenly across the pipeline stages: move work "
    "off the slow stage",
    FindingKind.IMBALANCE: "the work differs from rank to rank and step to step: balance it "
    "(batches of even length)",
}


def _action(f: Finding) -> tuple[Action, str]:
    """The action and its reason, from the kind's row and the finding's own evidence."""
    who = ranks_phrase(f.ranks) if f.ranks else "a rank"
    x = f.exception
    if x is not None and x.rank in f.ranks and x.main_thread:
        where = x.location or user_frame(x.traceback)
        at = f" at {where.where()}" if where is not None else ""
        return Action.FIX_CODE, f"rank {x.rank} died of {x.type}{at}"
    if f.call_shift is not None:
        shift = f.call_shift
        return Action.FIX_CODE, (
            f"{who} {'skipped' if shift.kind == 'skipped' else 'added'} a collective at "
            f"{shift.rank_site if shift.kind == 'extra' else shift.peer_site}"
        )
    ev = f.evidence
    if isinstance(ev, RankEvidence) and ev.routine:
        return Action.FIX_CODE, f"{who} left the order of calls it had always followed"
    if isinstance(ev, FailedAloneEvidence):
        return Action.FIX_CODE, f"{who}'s own call failed at once (a local error, not the network)"
    if isinstance(ev, StragglerEvidence) and ev.likely_cause is not None:
        return Action.FIX_CODE, "rank 0's extra work between steps holds the others up"
    if f.kind is FindingKind.STUCK and f.ranks:
        return Action.RESTART, f"{who}'s GPU stopped completing work"
    if f.kind is FindingKind.STACK_HANG and not f.ranks:
        return Action.RESTART, "the stacks alone cannot tell which rank holds the others up"
    return KINDS[f.kind].action, _WHY[f.kind].format(who=who)


def _wrapped(m: Matched, f: Finding) -> list[str]:
    """Where the rings of the finding's group's members no longer reach its collective."""
    info = m.groups.get(f.process_group or "")
    if info is None or f.seq is None:
        return []
    wrapped = sorted(
        r
        for r, p in info.progress.items()
        if r in info.ranks and p.first_in_ring > f.seq and r in m.run.dumps
    )
    if not wrapped:
        return []
    rings = "the ring of" if len(wrapped) == 1 else "the rings of"
    return [f"{rings} {ranks_phrase(wrapped)} wrapped past {f.op or 'it'} #{f.seq}"]


def _untimed(m: Matched, f: Finding) -> list[str]:
    """What a finding built on times compared across ranks did without: aligned clocks, or
    completion times."""
    run = m.run
    ev = f.evidence
    involved = (set(f.ranks) | set(f.pg_ranks)) or set(run.dumps)
    untimed = any(r in run.dumps and not run.dumps[r].completion_times for r in involved)
    hosts = {run.dumps[r].header.hostname for r in involved if r in run.dumps}
    unaligned = (
        sorted(set(ev.clock.unaligned_ranks) & involved)
        if isinstance(ev, StragglerEvidence) and len(hosts) > 1
        else []
    )
    if unaligned:
        return [f"the clocks of {ranks_phrase(unaligned)} could not be aligned"]
    if untimed:
        return ["the dumps record no completion times: taken from the ranks' arrivals"]
    return []


def _lowered(m: Matched, f: Finding) -> tuple[list[str], bool]:
    """What the verdict did without, and whether that makes it low outright."""
    out: list[str] = []
    low = False
    run = m.run
    blamed = set(f.ranks) if f.kind is FindingKind.MISSING_DUMP else set()
    missing = [r for r in run.missing_ranks if r not in blamed]
    if missing:
        out.append(f"no dump from {ranks_phrase(missing)}")
    out += _wrapped(m, f)
    p2p = f.kind is FindingKind.P2P_UNMATCHED or f.kind is FindingKind.P2P_DEADLOCK
    if p2p and any(set(pair[1:]) & set(f.ranks) for pair in m.transfers.unjudged):
        out.append("transfers of wrapped rings could not be lined up")
    if KINDS[f.kind].timed:
        out += _untimed(m, f)
        ev = f.evidence
        if isinstance(ev, StragglerEvidence) and ev.confidence == "low":
            low = True
    if f.kind is FindingKind.STACK_HANG:
        out.append("read from stacks alone, without the operations' ring")
        low = low or not f.ranks
    if f.below_timeout is not None:
        out.append(
            f"the longest wait ({f.below_timeout.longest_wait_s:.1f} s) is shorter than the "
            f"{f.below_timeout.timeout_s:g} s timeout"
        )
        low = True
    return out, low


def advise(m: Matched, findings: list[Finding]) -> list[Finding]:
    """Give every finding its recommendation and confidence (see the module's doc).

    Args:
        m: the lined-up histories.
        findings: the findings, in their final order.

    Returns:
        The same findings, each with ``advice`` set.
    """
    out: list[Finding] = []
    for f in findings:
        action, why = _action(f)
        lowered, low = _lowered(m, f)
        level = 2 if low else min(len(lowered), 2)
        out.append(
            dataclasses.replace(f, advice=Advice(action, _LEVELS[level], why, tuple(lowered)))
        )
    return out


def advice_line(a: Advice) -> str:
    """``restart the job: rank 2 stopped ... Confidence: high``, as the reports say it (after
    ``Next: ``)."""
    what = "restart the job" if a.action is Action.RESTART else "stop and fix the code"
    because = f" ({'; '.join(a.lowered_by)})" if a.lowered_by else ""
    return f"{what}: {a.why}. Confidence: {a.confidence}{because}"
