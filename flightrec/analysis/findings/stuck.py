"""Stuck: every member entered a collective and none completed it.

Where some members' own call failed at once, those members alone (a local error, not the
transport); where some entered long after the others, they did not arrive in time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flightrec.analysis.findings.not_arrived import late_arrival_finding
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Consequence, Evidence, Finding, FindingKind
from flightrec.analysis.waitgraph.graph import DiGraph
from flightrec.analysis.waitgraph.waits import Node
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.STUCK,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


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
    m: Matched, graph: DiGraph, node: Node, consequences: list[Consequence]
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
        ident = f" ({m.dump(failed[0]).describe()})" if len(failed) == 1 else ""
        errors = {
            r: h.reason_detail
            for r in failed
            if (h := m.dump(r).header).reason == pb.COLLECTIVE_ERROR and h.reason_detail
        }
        said = f": {next(iter(errors.values()))}" if len(errors) == 1 else ""
        return Finding(
            kind=FindingKind.STUCK,
            ranks=tuple(failed),
            summary=(
                f"{who[0].upper()}{who[1:]}{ident} failed {op} #{seq} on group {group} "
                f"[ranks {compress(members)}] on its own while {ranks_phrase(staying)} entered "
                f"it and wait: a local error on {who}, not the transport{said}"
            ),
            process_group=group,
            pg_ranks=members,
            seq=seq,
            op=op,
            consequences=tuple(consequences),
            evidence=FailedAloneEvidence(tuple(failed), staying, errors),
        )
    late = late_arrival_finding(m, group, seq, op, members, consequences)
    if late is not None:
        return late
    devices = [m.dump(r).header.device for r in members if r in m.run.dumps]
    on_gpu = bool(devices) and all(d.startswith("cuda") for d in devices)
    why = (
        "issued by the CPU on every member and not completed on the GPU: work queued before it "
        "on the stream that never ends (a spinning or hung kernel), a GPU fault, or NCCL and the "
        "network"
        if on_gpu
        else "a transport failure or a collective issued from outside the recorder"
    )
    return Finding(
        kind=FindingKind.STUCK,
        ranks=members,
        summary=(
            f"every member of group {group} [ranks {compress(members)}] entered "
            f"{op} #{seq} and none completed it, with no disagreement in what "
            f"they passed ({why})"
        ),
        process_group=group,
        pg_ranks=members,
        seq=seq,
        op=op,
        consequences=tuple(consequences),
    )
