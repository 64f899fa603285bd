"""The wait-for graph: who is blocked, in what, waiting on whom.

Nodes are ranks (``("rank", r)``) and the operations they are blocked in: a collective
(``("coll", group, seq)``) or one P2P transfer (``("p2p", group, sender, receiver, n)``). A
blocked rank points at its operation; the operation points at the ranks that have not issued
their part of it. Operation nodes keep the graph linear in the number of ranks even when
thousands wait on thousands.

End points of the graph are root causes: a rank waiting on nobody (stalled outside
collectives, exited, or without a dump), or a collective every member entered yet nobody
completed (mismatch, or stuck). Cycles are deadlocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from flightrec.analysis.kinds import KINDS
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import BelowTimeout, Finding, ProcessGroupInfo, RankDump, op_label
from flightrec.analysis.waitgraph.graph import DiGraph
from flightrec.format import flightrec_pb2 as pb

Node = tuple[object, ...]

# Dumps asked for by a person or by code, not by a hang.
_SNAPSHOTS = frozenset({pb.API_CALL, pb.SIGNAL_USR1, pb.CLI_TRIGGER})
SNAPSHOT_MIN_WAIT_S = 5.0
"""In a requested snapshot, an operation in flight for less than this is ordinary work in
progress, not a wait: a healthy running job is caught mid-collective all the time."""


def rank_node(rank: int) -> Node:
    """Graph node of a rank."""
    return ("rank", rank)


@dataclass(frozen=True, slots=True)
class Wait:
    """One rank blocked in one operation."""

    rank: int
    position: int
    """Entry position in the rank's ring."""
    node: Node
    """The operation node it waits in."""
    waited_s: float
    """How long the entry had been outstanding when the rank dumped."""
    since_wall_ns: int
    """When the rank entered it, on the wall clock (its dump's anchor applied)."""
    below_timeout_s: float = 0.0
    """The job's hang timeout where this wait, seen in a requested snapshot, is shorter than
    it (the job may still be progressing); 0.0 for a wait the timeout already judged a hang."""


def _current_incomplete(m: Matched, rank: int) -> list[int]:
    """Incomplete entries that still hold the rank.

    In-flight entries (enqueued, started) count, except those queued behind an earlier one
    (``_not_queued``). A failed entry counts only when nothing completed after it: a rank
    whose collective raised and then went on is not blocked. Without completion tracking
    (PyTorch's gloo recorder) every entry reads ``ENQUEUED``: only the newest can hold the
    rank, since it issued every other one after returning from it.
    """
    d = m.dump(rank)
    states = d.columns["state"]
    positions = m.incomplete[rank]
    if not positions:
        return []
    if not d.tracks_completion:
        return [max(positions)]
    if any(states[p] == pb.FAILED for p in positions):
        last_completed = next(
            (i for i in range(len(states) - 1, -1, -1) if states[i] == pb.COMPLETED), -1
        )
        positions = tuple(p for p in positions if states[p] != pb.FAILED or p > last_completed)
    return _not_queued(d, positions)


def _not_queued(d: RankDump, positions: Sequence[int]) -> list[int]:
    """``positions`` without the entries queued behind an earlier incomplete one.

    On NCCL the CPU issues collectives ahead of the GPU: when one never completes, the
    collectives issued after it wait in the queue, and every member's queue holds them. They
    are not where the rank waits (it never got to them), and taken as waits they would read
    as collectives every member entered and none completed. So a collective behind an
    earlier incomplete collective of its group (one stream, in order) is left out; and where
    the dump says which entries the GPU started (PyTorch's recorder does), an entry it never
    started behind one it did is left out too, whatever its group.
    """
    cols = d.columns
    states, flags, groups = cols["state"], cols["flags"], cols["group"]
    started = d.records_gpu_start and any(states[p] == pb.STARTED for p in positions)
    held: set[int] = set()
    busy = False
    out: list[int] = []
    for p in sorted(positions):
        collective = not flags[p] & pb.IS_P2P
        if collective and groups[p] in held:
            continue
        if started and busy and states[p] == pb.ENQUEUED:
            continue
        out.append(p)
        if collective:
            held.add(groups[p])
        busy = busy or states[p] == pb.STARTED
    return out


def _someone_missing(m: Matched, info: ProcessGroupInfo | None, seq: int) -> bool:
    if info is None:
        return False
    for q in info.ranks:
        last = m.last_seq(q, info.key) if q in m.run.dumps else None
        if last is None or last < seq:
            return True
    return False


class WaitGraph(NamedTuple):
    """The wait-for graph and every blocked entry behind it."""

    graph: DiGraph
    waits: list[Wait]


def build_wait_graph(m: Matched) -> WaitGraph:
    """Build the wait-for graph of the run.

    Args:
        m: the lined-up histories.

    Returns:
        The graph (node attributes: ``kind``, ``group``, ``seq``, ``op``...) and every wait.
    """
    graph = DiGraph()
    waits: list[Wait] = []
    present = m.run.dumps
    seen = m.run.seen  # (ranks not analysed here, and not missing: no node of their own)
    for rank in range(m.run.world_size):
        if rank not in seen:
            graph.add_node(rank_node(rank), kind="rank", rank=rank, present=rank in present)
    for rank in present:
        d = m.dump(rank)
        cols = d.columns
        for pos in _current_incomplete(m, rank):
            group = d.group_keys[cols["group"][pos]]
            info = m.groups.get(group)
            op = d.string(cols["op"][pos])
            label = op_label(op, cols["flags"][pos])
            enq = d.dump.entries.enqueue_ns[pos]
            waited = d.age_s(enq)
            below = 0.0
            if d.header.reason in _SNAPSHOTS and waited < d.header.timeout_s:
                # A dump taken on request from a running job catches operations in flight;
                # one younger than the job's own hang timeout may not be a hang yet. A short
                # one is work in progress; a long one is still reported, as below the timeout.
                if waited < SNAPSHOT_MIN_WAIT_S:
                    continue
                below = d.header.timeout_s
            if cols["flags"][pos] & pb.IS_P2P:
                peer, n = cols["peer"][pos], cols["p2p_seq"][pos]
                sending = bool(cols["flags"][pos] & pb.SEND)
                sender, receiver = (rank, peer) if sending else (peer, rank)
                if not sending:  # (numbered as the sender numbers it)
                    n = m.sender_ordinal(group, sender, receiver, n)
                node: Node = ("p2p", group, sender, receiver, n)
                if peer in present:
                    sends = m.p2p_counts.get((group, sender, receiver), (0, 0))[0]
                    issued = m.received(group, sender, receiver) if sending else sends
                    if issued >= n or not m.judged(group, sender, receiver):
                        # The peer issued its side: the transfer is in progress, not a wait on
                        # a person.
                        continue
                graph.add_node(
                    node, kind="p2p", group=group, seq=n, op=op, sender=sender, receiver=receiver
                )
                graph.add_edge(rank_node(rank), node)
                graph.add_edge(node, rank_node(peer))
            else:
                seq = cols["seq"][pos]
                node = ("coll", group, seq)
                if not d.tracks_completion and not _someone_missing(m, info, seq):
                    # Without completion tracking, a collective every member entered is taken
                    # as done: only a member that never arrived proves a wait.
                    continue
                if node not in graph:
                    members = info.ranks if info else ()
                    graph.add_node(
                        node,
                        kind="coll",
                        group=group,
                        seq=seq,
                        op=op,
                        label=label,
                        pg_ranks=members,
                    )
                    for q in members:
                        last = m.last_seq(q, group) if q in present else None
                        if q not in present or last is None or last < seq:
                            graph.add_edge(node, rank_node(q))
                graph.add_edge(rank_node(rank), node)
            waits.append(Wait(rank, pos, node, waited, d.wall_ns(enq), below))
    return WaitGraph(graph, waits)


def _key(node: Node) -> tuple[str, int]:
    """(group, seq) of an operation node; a P2P node's per-pair ordinal stands for its seq."""
    return (str(node[1]), int(node[2] if node[0] == "coll" else node[4]))  # type: ignore[call-overload]


def mark_below_timeout(waits: Sequence[Wait], findings: list[Finding]) -> list[Finding]:
    """Say so where every wait behind a finding is shorter than the job's hang timeout.

    A snapshot requested from a running job (``flightrec trigger``, SIGUSR1, the API) before
    the timeout fired may show a hang in the making or a slow step: who waits for whom is
    still reported, with low confidence and both durations in the summary. A mismatch stays
    as it is: ranks that disagree are wrong however long they have waited.

    Args:
        waits: every blocked entry (``build_wait_graph``).
        findings: the ordered findings.

    Returns:
        The findings, those built on such waits rewritten.
    """
    by_key: dict[tuple[str, int], list[Wait]] = {}
    for w in waits:
        by_key.setdefault(_key(w.node), []).append(w)
    if not any(w.below_timeout_s for w in waits):
        return findings
    out: list[Finding] = []
    for f in findings:
        keys = {(c.process_group, c.seq) for c in f.consequences}
        if f.process_group is not None and f.seq is not None:
            keys.add((f.process_group, f.seq))
        behind = [w for k in keys for w in by_key.get(k, ())]
        if (
            not KINDS[f.kind].low_confidence_below_timeout
            or not behind
            or not all(w.below_timeout_s for w in behind)
        ):
            out.append(f)
            continue
        longest = max(w.waited_s for w in behind)
        timeout = min(w.below_timeout_s for w in behind)
        out.append(
            replace(
                f,
                summary=(
                    f"{f.summary}; the longest wait ({longest:.1f} s) is shorter than the "
                    f"{timeout:g} s timeout: the job may still be progressing (low confidence)"
                ),
                below_timeout=BelowTimeout("low", round(longest, 3), timeout),
            )
        )
    return out
