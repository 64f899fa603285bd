"""Stuck: every member entered a collective and none completed it.

Where some members' own call failed at once, those members alone (a local error, not the
transport); where some entered long after the others, they did not arrive in time; where
the dumps say which members' GPUs started it (PyTorch's recorder does), those whose GPU
never did are still busy with earlier work (a hung kernel, a GPU fault). Otherwise the
collective itself is stuck: nobody is missing and nobody disagrees, so no rank is blamed,
and the finding points at what is left (the GPUs, NCCL, the network) with what the dumps
show: where each member's GPU got to, and each member's last progress.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages, blamed_by
from flightrec.analysis.facts.culprits import named
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Consequence, Evidence, Finding, FindingKind
from flightrec.analysis.waitgraph.graph import DiGraph
from flightrec.analysis.waitgraph.waits import Node
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.STUCK,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""

UNSTARTED_S = 5.0
"""A collective issued this long before a rank's dump that its GPU never started, while
other members' GPUs are inside it: that GPU is stuck on earlier work (``find_unstarted``)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where some members of a stuck collective last made progress."""

    ranks: tuple[int, ...]
    last_completed: str
    """Their newest completed operation (``all_reduce #11 on group 0``); "" where none."""
    seconds_before_dump: float | None
    """How long before their dumps it completed (the longest of them); None unknown."""


@dataclass(frozen=True, slots=True)
class StuckEvidence(Evidence):
    """Evidence of a ``stuck`` finding where every member entered and none completed."""

    started_ranks: tuple[int, ...]
    """Members whose GPU started it (the recorder says so); empty where it does not tell."""
    not_started_ranks: tuple[int, ...]
    """Members whose entry was issued by the CPU and never started on the GPU."""
    last_progress: tuple[Progress, ...]
    """Each member's last progress, members alike together."""


@dataclass(frozen=True, slots=True)
class FailedAloneEvidence(Evidence):
    """Evidence of a ``stuck`` finding where only some members' entries failed (raised)."""

    failed_ranks: tuple[int, ...]
    """The members whose entry failed: their own call raised."""
    waiting_ranks: tuple[int, ...]
    """The members still inside the collective."""
    errors: Mapping[int, str]
    """Per failed rank with an error dump (reason COLLECTIVE_ERROR), what it says."""


def _failed_alone(m: Matched, group: str, seq: int, members: tuple[int, ...]) -> list[int]:
    """Members whose entry at (group, seq) FAILED while the other members' are in flight.

    A collective that fails on one member alone, at once, failed there before any exchange:
    a local validation error (wrong output size, wrong device), not the transport. One that
    failed after half the timeout or more timed out first, which says nothing about who is
    wrong. Empty when none failed that way, or when they are not a strict minority.
    """
    failed: list[int] = []
    for rank in members:
        d = m.run.dumps.get(rank)
        gi = m.index.get(rank, {}).get(group)
        pos = gi.position_of(seq) if gi else None
        if d is None or pos is None or not d.tracks_completion:
            return []
        if d.columns["state"][pos] != pb.FAILED:
            continue
        e = d.dump.entries
        took_s = (e.complete_ns[pos] - e.enqueue_ns[pos]) / 1e9
        if not e.complete_ns[pos] or took_s >= max(1.0, 0.5 * d.header.timeout_s):
            return []
        failed.append(rank)
    # Only a minority: where most members failed, the peers of the first one to fail were
    # cut off by it (connection closed) before their own dumps were taken.
    return failed if len(failed) * 2 < len(members) else []


def stuck_finding(
    m: Matched,
    graph: DiGraph,
    node: Node,
    consequences: list[Consequence],
    late: Finding | None,
) -> Finding:
    """The finding for a collective every member entered and none completed.

    The root-cause arbitration calls it for such an end of the wait-for graph. Members whose
    own call failed at once are blamed alone (``stuck``, a local error); members that entered
    long after the others did not arrive in time (``not_arrived``); otherwise the whole group
    is ``stuck``.

    Args:
        m: the lined-up histories.
        graph: the wait-for graph.
        node: the collective's node.
        consequences: the waits that lead to it.
        late: the ``not_arrived`` finding for members that entered long after the others
            (``not_arrived.late_arrival_finding``), None where none did: the finding where
            no member failed alone and none started it.

    Returns:
        The finding.
    """
    attrs = graph.nodes[node]
    members = tuple(attrs["pg_ranks"])
    group, seq, op = str(attrs["group"]), int(attrs["seq"]), str(attrs["op"])
    failed = _failed_alone(m, group, seq, members)
    if failed:
        staying = tuple(r for r in members if r not in failed)
        who = ranks_phrase(failed)
        errors = {
            r: h.reason_detail
            for r in failed
            if (h := m.dump(r).header).reason == pb.COLLECTIVE_ERROR and h.reason_detail
        }
        said = f": {next(iter(errors.values()))}" if len(errors) == 1 else ""
        return _finding(
            (group, seq, op),
            members,
            tuple(failed),
            f"{named(m, failed)} failed {op} #{seq} on group {group} "
            f"[ranks {compress(members)}] on its own while {ranks_phrase(staying)} entered "
            f"it and wait: a local error on {who}, not the transport{said}",
            consequences,
            FailedAloneEvidence(tuple(failed), staying, errors),
        )
    states = _states(m, group, seq, members)
    started = tuple(r for r, st in states.items() if st == pb.STARTED)
    waiting = tuple(r for r, st in states.items() if st == pb.ENQUEUED)
    progress = _progress(m, members)
    if started and waiting:
        return _not_started(m, (group, seq, op), members, started, waiting, progress, consequences)
    if late is not None and not started:
        return late
    devices = [m.dump(r).header.device for r in members if r in m.run.dumps]
    on_gpu = bool(devices) and all(d.startswith("cuda") for d in devices)
    if started:
        why = (
            "every member's GPU started it and none finished: not a rank that is missing or "
            "wrong, but NCCL, the network between them, or a GPU inside the collective"
        )
    elif on_gpu:
        why = (
            "issued by the CPU on every member and not completed on the GPU: work queued before "
            "it on the stream that never ends (a spinning or hung kernel), a GPU fault, or NCCL "
            "and the network"
        )
    else:
        why = "a transport failure or a collective issued from outside the recorder"
    return _finding(
        (group, seq, op),
        members,
        (),
        f"The collective itself is stuck: every member of group {group} [ranks "
        f"{compress(members)}] entered {op} #{seq} and none completed it, with no "
        f"disagreement in what they passed ({why}); last progress: {_progress_phrase(progress)}",
        consequences,
        StuckEvidence(started, waiting if started else (), progress),
    )


def find_unstarted(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """Members whose GPU never started a collective other members' GPUs are inside, where
    not every member entered it (the arbitration names who did not; ``stuck_finding`` takes
    the collectives every member entered): a second fault in the same collective.

    Only where the dumps say which entries the GPU started (PyTorch's recorder), the entry
    was issued ``UNSTARTED_S`` or more before the rank's dump, and nothing older of the rank
    is still incomplete (then it waits there, and its queue is behind that).

    Args:
        s: the stages before (the wait graph: who waits on whom).
        above: the findings listed before these (their ranks are not blamed again).

    Returns:
        One ``stuck`` finding per such collective.
    """
    m, blamed = s.m, blamed_by(above)
    graph, waits = s.wait_graph
    waiting: dict[Node, list[int]] = {}
    longest: dict[Node, float] = {}
    for w in waits:
        if w.node[0] == "coll":
            waiting.setdefault(w.node, []).append(w.rank)
            longest[w.node] = max(longest.get(w.node, 0.0), w.waited_s)
    out: list[Finding] = []
    for node, ranks in waiting.items():
        if graph.out_degree(node) == 0:
            continue  # every member entered it: stuck_finding's
        attrs = graph.nodes[node]
        group, seq, op = str(attrs["group"]), int(attrs["seq"]), str(attrs["op"])
        members = tuple(attrs["pg_ranks"])
        states = _states(m, group, seq, members)
        started = tuple(r for r, st in states.items() if st == pb.STARTED)
        idle = tuple(
            r
            for r, st in states.items()
            if st == pb.ENQUEUED and r not in blamed and _long_unstarted(m, r, group, seq)
        )
        if not started or not idle:
            continue
        wait = Consequence(group, members, seq, op, tuple(sorted(ranks)), longest[node])
        at = (group, seq, op)
        out.append(_not_started(m, at, members, started, idle, _progress(m, members), [wait]))
    return out


def _long_unstarted(m: Matched, rank: int, group: str, seq: int) -> bool:
    """Whether ``rank``'s entry at (group, seq) was issued ``UNSTARTED_S`` or more before its
    dump with nothing older still incomplete."""
    gi = m.index.get(rank, {}).get(group)
    pos = gi.position_of(seq) if gi else None
    if pos is None:
        return False
    d = m.dump(rank)
    if any(p < pos for p in m.incomplete.get(rank, ())):
        return False
    return d.age_s(d.dump.entries.enqueue_ns[pos]) >= UNSTARTED_S


def _finding(
    at: tuple[str, int, str],
    members: tuple[int, ...],
    ranks: tuple[int, ...],
    summary: str,
    consequences: list[Consequence],
    evidence: Evidence,
) -> Finding:
    """A ``stuck`` finding at ``at`` (group, seq, op) of a group of ``members``."""
    group, seq, op = at
    return Finding(
        kind=FindingKind.STUCK,
        ranks=ranks,
        summary=summary,
        process_group=group,
        pg_ranks=members,
        seq=seq,
        op=op,
        consequences=tuple(consequences),
        evidence=evidence,
    )


def _states(m: Matched, group: str, seq: int, members: tuple[int, ...]) -> dict[int, int]:
    """Each member's state at (group, seq), where its dump holds the entry and says whether
    its GPU started it (``RankDump.records_gpu_start``)."""
    out: dict[int, int] = {}
    for r in members:
        gi = m.index.get(r, {}).get(group)
        pos = gi.position_of(seq) if gi else None
        d = m.run.dumps.get(r)
        if d is not None and pos is not None and d.records_gpu_start:
            out[r] = d.columns["state"][pos]
    return out


def _progress(m: Matched, members: tuple[int, ...]) -> tuple[Progress, ...]:
    """Each member's newest completed operation and how long before its dump, members
    alike together (the longest age among them)."""
    ranks_of: dict[str, list[int]] = {}
    age_of: dict[str, float | None] = {}
    for r in members:
        d = m.run.dumps.get(r)
        rec = m.last_completed_entry(r) if d is not None else None
        call, age = "", None
        if d is not None and rec is not None and rec.state == pb.COMPLETED:
            call = rec.call + ("" if rec.is_p2p else f" on group {rec.group}")
            done = rec.complete_ns or rec.enqueue_ns
            age = round(d.age_s(done), 1) if done else None
        ranks_of.setdefault(call, []).append(r)
        known = age_of.get(call)
        age_of[call] = age if known is None or (age is not None and age > known) else known
    return tuple(
        Progress(tuple(sorted(rs)), call, age_of[call])
        for call, rs in sorted(ranks_of.items(), key=lambda kv: min(kv[1]))
    )


def _progress_phrase(progress: tuple[Progress, ...]) -> str:
    parts = []
    for p in progress[:4]:
        if not p.last_completed:
            parts.append(f"{ranks_phrase(p.ranks)} completed nothing the dumps hold")
            continue
        age = f", {p.seconds_before_dump:.1f} s before the dump" if p.seconds_before_dump else ""
        parts.append(f"{ranks_phrase(p.ranks)} completed {p.last_completed}{age}")
    if len(progress) > 4:
        parts.append(f"and {len(progress) - 4} more")
    return "; ".join(parts)


def _not_started(
    m: Matched,
    at: tuple[str, int, str],
    members: tuple[int, ...],
    started: tuple[int, ...],
    waiting: tuple[int, ...],
    progress: tuple[Progress, ...],
    consequences: list[Consequence],
) -> Finding:
    """The members whose GPU never started a collective the others' GPUs are inside."""
    group, seq, op = at
    mine = [p for p in progress if set(p.ranks) & set(waiting)]
    return _finding(
        at,
        members,
        waiting,
        f"{named(m, waiting)} issued {op} #{seq} on group {group} [ranks "
        f"{compress(members)}] and {'its GPU' if len(waiting) == 1 else 'their GPUs'} "
        f"never started it, while {ranks_phrase(started)} started it and wait: still busy "
        f"with earlier work (a hung kernel, a GPU fault); last progress: "
        f"{_progress_phrase(tuple(mine))}",
        consequences,
        StuckEvidence(started, waiting, progress),
    )
