"""The wait-for graph's data structure and the three questions the analysis asks of it.

A directed graph keeping insertion order (nodes, and each node's successors and predecessors),
with an attribute dict per node; its strongly connected components as networkx numbers them
(Tarjan's algorithm with Nuutila's changes, nodes and edges taken in insertion order), the
ancestors of a node, and one cycle through a node of a strongly connected graph. This used to
be networkx, whose import took about 0.1 s of every ``flightrec analyze`` (a sixth of the
command at 256 ranks) for these few calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Any, TypeAlias

Node: TypeAlias = Any
"""Any hashable value (the analysis uses tuples such as ``("rank", 3)``)."""


class NoCycle(Exception):
    """``find_cycle`` found no cycle from its source."""


class DiGraph:
    """A directed graph: ``nodes`` iterates in insertion order, ``nodes[n]`` is ``n``'s
    attributes; ``graph`` holds attributes of the graph itself."""

    __slots__ = ("_pred", "_succ", "graph", "nodes")

    def __init__(self) -> None:
        self.nodes: dict[Node, dict[str, Any]] = {}
        self._succ: dict[Node, dict[Node, None]] = {}
        self._pred: dict[Node, dict[Node, None]] = {}
        self.graph: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def add_node(self, node: Node, **attrs: Any) -> None:
        if node in self.nodes:
            self.nodes[node].update(attrs)
            return
        self.nodes[node] = dict(attrs)
        self._succ[node] = {}
        self._pred[node] = {}

    def add_nodes_from(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            self.add_node(node)

    def add_edge(self, u: Node, v: Node) -> None:
        self.add_node(u)
        self.add_node(v)
        self._succ[u][v] = None
        self._pred[v][u] = None

    def add_edges_from(self, edges: Iterable[tuple[Node, Node]]) -> None:
        for u, v in edges:
            self.add_edge(u, v)

    def edges(self) -> list[tuple[Node, Node]]:
        """Every edge, by tail in node order, then head in insertion order."""
        return [(u, v) for u, heads in self._succ.items() for v in heads]

    def successors(self, node: Node) -> Iterator[Node]:
        return iter(self._succ[node])

    def predecessors(self, node: Node) -> Iterator[Node]:
        return iter(self._pred[node])

    def out_degree(self, node: Node) -> int:
        return len(self._succ[node])

    def in_degree(self, node: Node) -> int:
        return len(self._pred[node])

    def subgraph(self, nodes: Iterable[Node]) -> DiGraph:
        """A copy of the nodes given (in this graph's order) and the edges between them."""
        keep = set(nodes)
        sub = DiGraph()
        for node, attrs in self.nodes.items():
            if node in keep:
                sub.add_node(node, **attrs)
        for u in sub.nodes:
            for v in self._succ[u]:
                if v in keep:
                    sub.add_edge(u, v)
        return sub


def strongly_connected_components(g: DiGraph) -> Iterator[set[Node]]:
    """The strongly connected components, sinks first, in networkx's order (iterative
    Tarjan with Nuutila's changes; roots and successors in insertion order)."""
    preorder: dict[Node, int] = {}
    lowlink: dict[Node, int] = {}
    found: set[Node] = set()
    stack: list[Node] = []
    counter = 0
    succ = g._succ
    pending = {v: iter(succ[v]) for v in g.nodes}
    for source in g.nodes:
        if source in found:
            continue
        queue = [source]
        while queue:
            v = queue[-1]
            if v not in preorder:
                counter += 1
                preorder[v] = counter
            done = True
            for w in pending[v]:
                if w not in preorder:
                    queue.append(w)
                    done = False
                    break
            if not done:
                continue
            low = preorder[v]
            for w in succ[v]:
                if w not in found:
                    low = min(low, lowlink[w] if preorder[w] > preorder[v] else preorder[w])
            lowlink[v] = low
            queue.pop()
            if low == preorder[v]:
                component = {v}
                while stack and preorder[stack[-1]] > preorder[v]:
                    component.add(stack.pop())
                found.update(component)
                yield component
            else:
                stack.append(v)


def condensation(g: DiGraph) -> DiGraph:
    """The graph of ``g``'s strongly connected components, numbered in the order found:
    ``nodes[c]["members"]`` is component ``c``'s set of nodes, ``graph["mapping"]`` maps each
    node of ``g`` to its component."""
    mapping: dict[Node, int] = {}
    c = DiGraph()
    c.graph["mapping"] = mapping
    for i, component in enumerate(strongly_connected_components(g)):
        c.add_node(i, members=component)
        mapping.update((n, i) for n in component)
    for u, v in g.edges():
        if mapping[u] != mapping[v]:
            c.add_edge(mapping[u], mapping[v])
    return c


def ancestors(g: DiGraph, node: Node) -> set[Node]:
    """Every node with a path to ``node`` (``node`` itself left out)."""
    seen: set[Node] = set()
    todo = [node]
    pred = g._pred
    while todo:
        for p in pred[todo.pop()]:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    seen.discard(node)
    return seen


def find_cycle(g: DiGraph, source: Node) -> list[tuple[Node, Node]]:
    """One cycle reached from ``source``, as its edges: the walk that takes each node's first
    successor until a node repeats (what a depth-first search over edges finds first in a
    strongly connected graph, where no walk ends). Raises ``NoCycle`` where a walk ends."""
    path: list[Node] = [source]
    at = {source: 0}
    while True:
        heads = g._succ[path[-1]]
        if not heads:
            raise NoCycle(f"no cycle from {source!r}")
        nxt = next(iter(heads))
        if nxt in at:
            loop = [*path[at[nxt] :], nxt]
            return list(pairwise(loop))
        at[nxt] = len(path)
        path.append(nxt)
