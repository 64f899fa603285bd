"""Root cause first: follow the wait-for graph to its ends and collapse consequences under them.

A rank that did not arrive on one group may itself be blocked in another group's collective,
waiting for a third rank. Condensing the graph's cycles and taking the components nobody in
them waits beyond gives the root causes; every wait that leads to a root is listed under it
as a consequence rather than reported on its own. One stalled rank in a job with tensor-,
pipeline- and data-parallel groups therefore yields one finding.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple

from flightrec.analysis.facts.culprits import RankEvidence, culprit_state
from flightrec.analysis.findings.crashes import exited_finding
from flightrec.analysis.findings.mismatch import exchange_mismatch, relation_mismatch
from flightrec.analysis.findings.not_arrived import (
    late_arrival_finding,
    missing_dump_finding,
    not_arrived_finding,
)
from flightrec.analysis.findings.p2p import CycleEvidence, cycle_finding
from flightrec.analysis.findings.stuck import stuck_finding
from flightrec.analysis.kinds import kinds_where
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    Consequence,
    Finding,
    FindingKind,
    Status,
    user_frame,
)
from flightrec.analysis.waitgraph.graph import DiGraph, condensation
from flightrec.analysis.waitgraph.graph import ancestors as graph_ancestors
from flightrec.analysis.waitgraph.routine import Departure, routine
from flightrec.analysis.waitgraph.waits import Node, Wait, WaitGraph

_GONE = kinds_where("gone")
"""Kinds that say the blamed ranks' processes are gone (a mismatch may have ended them)."""

# Ranks of one wait cycle whose histories are read to find who left its routine.
MAX_ROUTINE_CHECKS = 64


class Tie(enum.IntEnum):
    """Order among root causes that hold up equally many ranks (more held up goes first)."""

    MISMATCH = 0
    """A disagreement at the very collective its group is stuck in: the clearest cause."""
    CYCLE = 1
    """A wait cycle (deadlock), or the ranks that closed it by leaving their routine."""
    RANK = 2
    """A rank with a dump that never arrived, or exited."""
    NO_DUMP = 3
    """A rank without a dump: known only from its peers, so less certain."""
    STUCK = 4
    """Every member entered and none completed, with no disagreement seen."""


_CULPRIT_FINDING = {
    Status.OUTSIDE: not_arrived_finding,
    Status.EXITED: exited_finding,
    Status.NO_DUMP: missing_dump_finding,
}
"""Per ``culprit_state``, what culprits at the end of a wait chain are found to be: alive
elsewhere (``not_arrived``), ended (``dead_rank``), or without a dump (``missing_dump``)."""


class RootCauses(NamedTuple):
    """The root-cause arbitration's findings and the groups they account for."""

    findings: list[Finding]
    """Most explanatory first, mismatches placed among them."""
    explained: set[str]
    """Keys of the groups whose waits lead to one of the findings."""


def _consequence(graph: DiGraph, node: Node, longest: dict[Node, float]) -> Consequence:
    attrs = graph.nodes[node]
    waiters = tuple(sorted(int(p[1]) for p in graph.predecessors(node) if p[0] == "rank"))  # type: ignore[call-overload]
    pair: tuple[int, int] | None = None
    if attrs["kind"] == "p2p":
        pair = (int(attrs["sender"]), int(attrs["receiver"]))
        pg: tuple[int, ...] = tuple(sorted(pair))
    else:
        pg = tuple(attrs["pg_ranks"])
    return Consequence(
        str(attrs["group"]),
        pg,
        int(attrs["seq"]),
        str(attrs["op"]),
        waiters,
        longest.get(node, 0.0),
        str(attrs.get("label", "")),
        p2p=pair,
    )


def _op_nodes(nodes: Iterable[Node]) -> list[Node]:
    return sorted((n for n in nodes if n[0] != "rank"), key=repr)


def explained_groups(roots: RootCauses, mismatches: Sequence[Finding]) -> frozenset[str]:
    """Groups a root cause or a mismatch already accounts for (the desync candidate skips them).

    Args:
        roots: what ``root_causes`` returned.
        mismatches: every mismatch (``mismatch.find_mismatches``).

    Returns:
        The group keys.
    """
    found = {f.process_group for f in mismatches if f.process_group}
    return frozenset(roots.explained | found)


def root_causes(m: Matched, wait_graph: WaitGraph, mismatches: Sequence[Finding]) -> RootCauses:
    """Findings for the ends of the wait-for graph, most explanatory first.

    A mismatch at a stuck collective becomes that collective's root; the other mismatches go
    before the roots when they blame the first root's culprit (a skipped call shifts every
    later collective) or sit where a dead rank's peers wait, after them otherwise.

    Args:
        m: the lined-up histories.
        wait_graph: who waits on whom (``waits.build_wait_graph``).
        mismatches: every group's first disagreement (``mismatch.find_mismatches``).

    Returns:
        The ordered findings, and the group keys they explain.
    """
    ends = _Ends(m, wait_graph, mismatches)
    for c in ends.cond.nodes:
        members = ends.members_of[c]
        if len(members) > 1:
            ends.cycle(c)
        elif ends.cond.out_degree(c) == 0 and ends.cond.in_degree(c) > 0:
            ends.end(c)
    ends.culprits()
    ends.scored.sort(key=lambda t: (-t[0], t[1]))
    roots = [f for _, _, f in ends.scored]
    rest = [f for f in mismatches if id(f) not in ends.used_mismatches]
    leading = _leading_mismatches(roots, rest)
    roots = [f for f in roots if f not in leading]
    trailing = [f for f in rest if f not in leading]
    return RootCauses(leading + roots + trailing, ends.explained)


class _Ends:
    """The ends of the condensed wait-for graph, scored as ``root_causes`` finds them: each
    cycle and each operation at an end scored at once, the ranks at an end gathered by what
    they are and where their peers wait (``culprits`` scores them)."""

    def __init__(self, m: Matched, wait_graph: WaitGraph, mismatches: Sequence[Finding]) -> None:
        self.m = m
        self.graph, self.waits = wait_graph
        self.longest: dict[Node, float] = defaultdict(float)
        self.earliest: dict[Node, int] = {}
        for w in self.waits:
            self.longest[w.node] = max(self.longest[w.node], w.waited_s)
            self.earliest[w.node] = min(self.earliest.get(w.node, w.since_wall_ns), w.since_wall_ns)
        self.cond = condensation(self.graph)
        self.members_of = {c: list(self.cond.nodes[c]["members"]) for c in self.cond.nodes}
        self.mismatch_at = {(f.process_group, f.seq): f for f in mismatches if f.seq is not None}
        self.scored: list[tuple[int, Tie, Finding]] = []
        self.used_mismatches: set[int] = set()
        self.rank_roots: dict[tuple[Status, bool, Node | None], list[int]] = defaultdict(list)
        self.explained: set[str] = set()
        self._ancestors: dict[int, set[Node]] = {}

    def ancestors(self, c: int) -> set[Node]:
        """Every node that waits, directly or not, on component ``c``."""
        if c not in self._ancestors:
            members_of = self.members_of
            self._ancestors[c] = {n for a in graph_ancestors(self.cond, c) for n in members_of[a]}
        return self._ancestors[c]

    def _held_up(self, c: int, members: list[Node]) -> tuple[list[Consequence], int]:
        """The waits that lead to component ``c`` (their groups explained now), and how many
        ranks it holds up, its own included."""
        above = self.ancestors(c)
        ops = _op_nodes(list(above) + (members if len(members) > 1 else []))
        self.explained.update(str(self.graph.nodes[n]["group"]) for n in ops)
        consequences = [_consequence(self.graph, n, self.longest) for n in ops]
        weight = len({n for n in above if n[0] == "rank"} | {n for n in members if n[0] == "rank"})
        return consequences, weight

    def cycle(self, c: int) -> None:
        """A wait cycle: a deadlock, or the ranks that closed it by leaving their routine."""
        members = self.members_of[c]
        _, weight = self._held_up(c, members)
        cycle = cycle_finding(self.graph, members, self.longest, _locations(self.m, self.waits))
        broken = _break_cycle(self.m, self.graph, members, cycle, self.longest)
        self.scored.append((weight, Tie.CYCLE, broken or cycle))

    def end(self, c: int) -> None:
        """A rank or an operation nobody in it waits beyond."""
        members = self.members_of[c]
        consequences, weight = self._held_up(c, members)
        node = members[0]
        if node[0] == "rank":
            rank = int(node[1])  # type: ignore[call-overload]
            # Ranks known to have exited cleanly are told apart from ranks that left nothing.
            gone = rank in self.m.run.exited
            key = (culprit_state(self.m, rank), gone, self._primary(node))
            self.rank_roots[key].append(rank)
            return
        at = (str(self.graph.nodes[node]["group"]), int(self.graph.nodes[node]["seq"]))
        mismatch = self.mismatch_at.get(at)
        if mismatch is None and at[0] in self.m.groups:
            # Sizes an all-to-all may differ in rank by rank, as long as the totals add up;
            # and a buffer can be wrong on its own terms (a gather root's list one short).
            info = self.m.groups[at[0]]
            mismatch = exchange_mismatch(self.m, info, at[1]) or relation_mismatch(
                self.m, info, at[1]
            )
        if mismatch is not None:
            self.used_mismatches.add(id(mismatch))
            found = _with_consequences(mismatch, consequences)
            self.scored.append((weight, Tie.MISMATCH, found))
        else:
            found = _stuck(self.m, self.graph, node, consequences)
            self.scored.append((weight, Tie.STUCK, found))

    def _primary(self, node: Node) -> Node | None:
        """The wait that points at rank ``node`` most directly: an operation waiting on nobody
        else that is itself waiting; among those, the one entered first (the call the rank
        should have made first), then the one most ranks wait in."""
        graph = self.graph

        def directness(op: Node) -> tuple[bool, int, int]:
            others = [s for s in graph.successors(op) if s != node]
            direct = all(graph.out_degree(s) == 0 for s in others)
            return (direct, -self.earliest.get(op, 0), graph.in_degree(op))

        preds = list(graph.predecessors(node))
        return max(preds, key=directness) if preds else None

    def culprits(self) -> None:
        """The ranks at the ends, one finding per what they are and where their peers wait."""
        for (state, _, primary), ranks in self.rank_roots.items():
            nodes = [n for r in ranks for n in self.ancestors(_component(self.cond, ("rank", r)))]
            ops = _op_nodes(set(nodes))
            consequences = [_consequence(self.graph, n, self.longest) for n in ops]
            waiting = {n for n in nodes if n[0] == "rank"}
            prim = _consequence(self.graph, primary, self.longest) if primary is not None else None
            finding = _CULPRIT_FINDING[state](self.m, ranks, prim, consequences)
            order = Tie.NO_DUMP if state is Status.NO_DUMP else Tie.RANK
            self.scored.append((len(waiting) + len(ranks), order, finding))


def _leading_mismatches(roots: list[Finding], rest: list[Finding]) -> list[Finding]:
    """The mismatches no end of the graph took (``rest``) and the mismatch roots that go
    before the first root."""
    # A mismatch elsewhere in the history that blames a root's culprit most likely caused the
    # hang (a skipped or extra call shifts every later collective): it goes first.
    leading = [f for f in rest if roots and set(f.ranks) & set(roots[0].ranks)]
    # A rank that left no dump, or exited, while its peers disagree about the very collective
    # they wait in most likely died of that disagreement (gloo aborts on some mismatches):
    # the mismatch is the cause, the death its consequence. So is one earlier on that group:
    # the peers went on past it, and the rank it killed never came.
    # That holds for a mismatch some ranks wait at too (a root of its own, holding up fewer
    # ranks than the death that came of it).
    if roots and roots[0].kind in _GONE:
        group, seq = roots[0].process_group, roots[0].seq
        leading += [
            f
            for f in rest + [r for r in roots[1:] if r.kind is FindingKind.MISMATCH]
            if f.process_group == group
            and f.seq is not None
            and seq is not None
            and f.seq <= seq
            and f not in leading
        ]
    return leading


def _break_cycle(
    m: Matched,
    graph: DiGraph,
    members: list[Node],
    cycle: Finding,
    longest: dict[Node, float],
) -> Finding | None:
    """The ranks of a wait cycle that left their routine while the others kept theirs.

    A skipped or extra collective, or a loop left early, closes a cycle through a collective
    that blames every rank on it; the ranks whose newest calls departed from the order they
    always followed are the cause (see ``routine``). A cycle of sends and receives alone stays
    a P2P deadlock of all its ranks, with the departure added to its summary. Ranks most waited for are checked first, at most
    ``MAX_ROUTINE_CHECKS`` of them, so a cycle through thousands of ranks stays cheap.

    Returns:
        A finding blaming the departed ranks, with the cycle as evidence; None when the
        histories do not single anyone out.
    """
    in_cycle = [n for n in members if n[0] == "rank"]
    in_cycle.sort(key=lambda n: (-graph.in_degree(n), n))
    departed: list[Departure] = []
    kept = 0
    for node in in_cycle[:MAX_ROUTINE_CHECKS]:
        rank = int(node[1])  # type: ignore[call-overload]
        if rank not in m.run.dumps:
            continue
        r = routine(m.dump(rank), rank)
        if r.departure is not None:
            departed.append(r.departure)
        kept += r.kept
    if not departed or kept < len(departed):
        return None
    culprits = sorted(d.rank for d in departed)
    ops = _op_nodes(members)
    first = min(departed, key=lambda d: d.rank)
    routines = {d.rank: d for d in departed}
    # Finding.evidence is typed by its base; cycle_finding and the culprit findings always give these.
    cycle_evidence = cycle.evidence
    assert isinstance(cycle_evidence, CycleEvidence)
    if all(n[0] == "p2p" for n in ops):
        # Sends and receives alone: both sides really do wait on each other, and the fix may
        # be on either; the departure says which line changed.
        return replace(
            cycle,
            summary=f"{cycle.summary}; rank {first.rank} {first.sentence().removeprefix('it ')}",
            evidence=replace(cycle_evidence, routine=routines),
        )
    waits_on = [n for n in ops if ("rank", culprits[0]) in graph.successors(n)]
    if not waits_on:
        return None
    primary = max(waits_on, key=lambda n: (longest.get(n, 0.0), graph.in_degree(n)))
    consequences = [_consequence(graph, n, longest) for n in ops]
    finding = _CULPRIT_FINDING[culprit_state(m, culprits[0])](
        m, culprits, _consequence(graph, primary, longest), consequences
    )
    assert isinstance(finding.evidence, RankEvidence)
    return replace(
        finding,
        summary=f"{finding.summary}; {first.sentence()}",
        evidence=replace(
            finding.evidence,
            routine=routines,
            cycle=cycle_evidence.cycle,
            cycle_summary=cycle.summary,
        ),
    )


def _locations(m: Matched, waits: list[Wait]) -> dict[Node, str]:
    """``file:line`` of the user code behind each blocked operation (first waiter's)."""
    out: dict[Node, str] = {}
    for w in waits:
        if w.node not in out:
            frame = user_frame(m.dump(w.rank).record(w.position).stack)
            if frame is not None:
                out[w.node] = frame.where()
    return out


def _component(cond: DiGraph, node: Node) -> int:
    return int(cond.graph["mapping"][node])


def _with_consequences(f: Finding, consequences: list[Consequence]) -> Finding:
    return replace(f, consequences=tuple(consequences))


def _stuck(m: Matched, graph: DiGraph, node: Node, consequences: list[Consequence]) -> Finding:
    """The finding for a collective every member entered and none completed: ``stuck``, or
    ``not_arrived`` for members that entered it far too late (``stuck.stuck_finding``)."""
    attrs = graph.nodes[node]
    late = late_arrival_finding(
        m,
        str(attrs["group"]),
        int(attrs["seq"]),
        str(attrs["op"]),
        tuple(attrs["pg_ranks"]),
        consequences,
    )
    return stuck_finding(m, graph, node, consequences, late)
