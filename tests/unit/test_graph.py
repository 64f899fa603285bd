"""The wait-for graph's own structure (flightrec.analysis.waitgraph.graph) answers as networkx did: the
same components in the same order, the same ancestors, the same cycle."""

from __future__ import annotations

import random

import pytest

from flightrec.analysis.waitgraph.graph import DiGraph, NoCycle, ancestors, condensation, find_cycle

nx = pytest.importorskip("networkx")


def graphs(seed: int) -> tuple[DiGraph, object]:
    """The same random graph in both libraries, nodes and edges added in the same order."""
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    nodes = [("rank", i) if rng.random() < 0.5 else ("op", f"g:{i}") for i in range(n)]
    rng.shuffle(nodes)
    ours, theirs = DiGraph(), nx.DiGraph()
    for node in nodes:
        ours.add_node(node, kind=node[0])
        theirs.add_node(node, kind=node[0])
    for _ in range(rng.randint(0, 3 * n)):
        u, v = rng.choice(nodes), rng.choice(nodes)
        ours.add_edge(u, v)
        theirs.add_edge(u, v)
    return ours, theirs


@pytest.mark.parametrize("seed", range(300))
def test_components_ancestors_and_cycles_are_networkx_s(seed: int) -> None:
    ours, theirs = graphs(seed)
    assert list(ours.nodes) == list(theirs.nodes)  # type: ignore[attr-defined]
    assert ours.edges() == list(theirs.edges())  # type: ignore[attr-defined]
    for node in ours.nodes:
        assert list(ours.successors(node)) == list(theirs.successors(node))  # type: ignore[attr-defined]
        assert list(ours.predecessors(node)) == list(theirs.predecessors(node))  # type: ignore[attr-defined]
        assert ours.in_degree(node) == theirs.in_degree(node)  # type: ignore[attr-defined]
        assert ours.out_degree(node) == theirs.out_degree(node)  # type: ignore[attr-defined]
    mine, theirs_c = condensation(ours), nx.condensation(theirs)
    assert mine.graph["mapping"] == theirs_c.graph["mapping"]
    assert [mine.nodes[c]["members"] for c in mine.nodes] == [
        theirs_c.nodes[c]["members"] for c in theirs_c.nodes
    ]
    assert mine.edges() == list(theirs_c.edges())
    for c in mine.nodes:
        assert ancestors(mine, c) == nx.ancestors(theirs_c, c)
        members = mine.nodes[c]["members"]
        if len(members) > 1:
            # As p2p.cycle_finding asks: a component alone, from its first node.
            sub, sub_theirs = ours.subgraph(members), theirs.subgraph(members)  # type: ignore[attr-defined]
            start = next(iter(sub.nodes))
            assert find_cycle(sub, start) == list(nx.find_cycle(sub_theirs, source=start))
    for node in ours.nodes:
        assert ancestors(ours, node) == nx.ancestors(theirs, node)


def test_a_walk_that_ends_has_no_cycle() -> None:
    g = DiGraph()
    g.add_edge("a", "b")
    with pytest.raises(NoCycle):
        find_cycle(g, "a")
    g.add_edge("b", "a")
    assert find_cycle(g, "a") == [("a", "b"), ("b", "a")]


def test_attributes_are_kept_and_updated() -> None:
    g = DiGraph()
    g.add_node(1, kind="rank")
    g.add_edge(1, 2)
    g.add_node(1, present=True)
    assert g.nodes[1] == {"kind": "rank", "present": True} and g.nodes[2] == {}
    assert len(g) == 2 and 2 in g and 3 not in g
    assert g.subgraph([2, 1]).edges() == [(1, 2)]
