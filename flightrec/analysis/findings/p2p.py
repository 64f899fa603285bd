"""P2P: wait cycles (deadlocks) and sends or receives that were never matched.

Sends and receives match by (group, sender, receiver, n): the n-th send from sender to
receiver on a group pairs with the n-th receive there. The per-peer counters in each dump's
group table say how many each side issued even when the ring overwrote the entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages
from flightrec.analysis.model import Consequence, Evidence, Finding, FindingKind
from flightrec.analysis.waitgraph.graph import DiGraph, NoCycle, find_cycle
from flightrec.analysis.waitgraph.routine import Departure
from flightrec.analysis.waitgraph.waits import Node
from flightrec.text import ranks_phrase

KINDS = (FindingKind.P2P_DEADLOCK, FindingKind.DEADLOCK, FindingKind.P2P_UNMATCHED)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class CycleEvidence(Evidence):
    """Evidence of ``p2p_deadlock`` and ``deadlock`` findings."""

    cycle: tuple[Node, ...]
    """One cycle of the wait-for graph in order: rank, operation, rank, operation..."""
    routine: Mapping[int, Departure] | None = None
    """Per rank on the cycle, the call where it left its routine, where one did."""


@dataclass(frozen=True, slots=True)
class UnmatchedEvidence(Evidence):
    """Evidence of a ``p2p_unmatched`` finding: the two counters that disagree."""

    sender: int
    receiver: int
    sends: int
    """Sends the sender issued to the receiver on the group."""
    recvs: int
    """Receives from the sender the receiver issued there."""
    extra_side: int
    """The rank that issued more."""


def _node_key(node: Node) -> tuple[int, int, str]:
    """Ranks first, by number; then operations, by their text."""
    if node[0] == "rank":
        return (0, int(node[1]), "")  # type: ignore[call-overload]
    return (1, 0, repr(node))


def cycle_finding(
    graph: DiGraph,
    members: Sequence[Node],
    waits: dict[Node, float],
    where: Mapping[Node, str] | None = None,
) -> Finding:
    """A deadlock finding for one strongly connected set of the wait-for graph.

    Args:
        graph: the wait-for graph.
        members: the nodes of one cycle component (ranks and operations).
        waits: longest wait per operation node.
        where: ``file:line`` of the user code that issued each operation node, where known.

    Returns:
        ``p2p_deadlock`` when a P2P operation is on the cycle, else ``deadlock``.
    """
    ranks = tuple(sorted(int(n[1]) for n in members if n[0] == "rank"))  # type: ignore[call-overload]
    # Spell one actual cycle in order: rank -> op -> rank -> ..., the same one on every run
    # (the members come from a set): walk a graph built in sorted order, from the lowest rank,
    # and start the cycle at its lowest rank.
    order = sorted(members, key=_node_key)
    sub = DiGraph()
    sub.add_nodes_from(order)
    edges = graph.subgraph(members).edges()
    sub.add_edges_from(sorted(edges, key=lambda e: (_node_key(e[0]), _node_key(e[1]))))
    try:
        cycle = [u for u, _ in find_cycle(sub, order[0])]
    except NoCycle:  # pragma: no cover - a component of size > 1 has a cycle
        cycle = order
    first_at = min(range(len(cycle)), key=lambda i: _node_key(cycle[i]))
    cycle = cycle[first_at:] + cycle[:first_at]
    steps: list[str] = []
    consequences: list[Consequence] = []
    is_p2p = False
    for node in cycle:
        if node[0] == "rank":
            continue
        attrs = graph.nodes[node]
        waiters = tuple(sorted(int(p[1]) for p in graph.predecessors(node) if p[0] == "rank"))  # type: ignore[call-overload]
        at = f" at {where[node]}" if where and node in where else ""
        if node[0] == "p2p":
            is_p2p = True
            sender, receiver = int(attrs["sender"]), int(attrs["receiver"])
            waiter = waiters[0] if waiters else receiver
            other, word = (sender, "from") if waiter == receiver else (receiver, "to")
            steps.append(
                f"rank {waiter} waits in {attrs['op']} {word} rank {other} "
                f"(#{attrs['seq']} on group {attrs['group']}){at}"
            )
            pg: tuple[int, ...] = (sender, receiver)
        else:
            missing = sorted(int(s[1]) for s in graph.successors(node))
            steps.append(
                f"{ranks_phrase(waiters)} wait in {attrs['op']} #{attrs['seq']} on group "
                f"{attrs['group']}{at} for {ranks_phrase(missing)}"
            )
            pg = tuple(attrs["pg_ranks"])
        consequences.append(
            Consequence(
                str(attrs["group"]),
                pg,
                int(attrs["seq"]),
                str(attrs["op"]),
                waiters,
                waits.get(node, 0.0),
                p2p=(pg[0], pg[1]) if node[0] == "p2p" else None,
            )
        )
    kind = FindingKind.P2P_DEADLOCK if is_p2p else FindingKind.DEADLOCK
    first = consequences[0] if consequences else None
    return Finding(
        kind=kind,
        ranks=ranks,
        summary=f"{'P2P ' if is_p2p else ''}deadlock: {ranks_phrase(ranks)} wait on each other: "
        + "; ".join(steps),
        process_group=first.process_group if first else None,
        pg_ranks=first.pg_ranks if first else (),
        seq=first.seq if first else None,
        op=first.op if first else None,
        consequences=tuple(consequences),
        evidence=CycleEvidence(tuple(cycle)),
    )


def find_unmatched(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """Sends without receives and receives without sends, where nobody is blocked on them.

    Blocked transfers are already in the wait-for graph and explained through it; this
    candidate reports what the counters show once no wait explains the difference.

    Args:
        s: the stages before (transfers in the wait-for graph are skipped).
        above: the findings listed before these (not read).

    Returns:
        ``p2p_unmatched`` findings blaming the side that issued fewer operations.
    """
    m, graph = s.m, s.wait_graph.graph
    blocked = {(n[1], n[2], n[3]) for n in graph.nodes if n[0] == "p2p"}
    findings: list[Finding] = []
    for (group, rank, peer), (sends, _) in sorted(m.p2p_counts.items()):
        if peer not in m.run.dumps or (group, rank, peer) in blocked:
            continue
        if not m.judged(group, rank, peer):
            continue  # wrapped rings whose times cannot line the transfers up
        # (in the sender's numbering: rings that wrapped count from different points)
        recvs = m.received(group, rank, peer)
        if sends == recvs:
            continue
        short, extra = (peer, rank) if sends > recvs else (rank, peer)
        summary = (
            f"rank {rank} issued {sends} send(s) to rank {peer} on group {group} and rank {peer} "
            f"issued {recvs} matching receive(s): rank {short} is short of "
            f"{abs(sends - recvs)} {'receive' if sends > recvs else 'send'}(s)"
        )
        findings.append(
            Finding(
                kind=FindingKind.P2P_UNMATCHED,
                ranks=(short,),
                summary=summary,
                process_group=group,
                pg_ranks=tuple(sorted((rank, peer))),
                op="send" if sends < recvs else "recv",
                evidence=UnmatchedEvidence(rank, peer, sends, recvs, extra),
            )
        )
    return findings
