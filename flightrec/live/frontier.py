"""The first pass of the verdict at scale: every rank's progress in, the ranks that matter out.

Each rank's ``Progress`` (``flightrec.format.progress``) says, per process group, how many
collectives it issued and which one it is still in, and what single operation holds it. That
is the wait-for graph of ``flightrec.analysis.waits`` at the granularity of ranks, built here
in one pass over flat columns (no per-rank objects beyond the records, tuples read by
unpacking: at 131,072 ranks the pass takes about 0.2 s):

- a rank waiting in collective ``seq`` of a group waits on the members that issued fewer;
- a rank waiting in a send or receive waits on its peer, unless the peer waits in the other
  end (then both entered and neither finished: the transfer itself is stuck);
- a collective every member issued and none finished is stuck where it is (a mismatch, or a
  fault below the library).

Following the edges from every waiting rank ends at the root causes: ranks that wait on
nobody (stalled outside collectives, or without an answer), stuck operations, or cycles. The
reporter then reads the summaries of those ranks and of the ranks that wait on them directly
(``Frontier.detail``, a bounded set) and runs the full analysis on them; ``where`` says where
every rank is, from all the ranks' progress, for the lines after the panel.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.progress import ProgressRecord, by_group
from flightrec.text import ranks_phrase

MAX_DETAIL = 96
"""Ranks whose summaries the reporter reads at most: the analysis of one takes about half a
millisecond, and the verdict's evidence needs the culprits and a few of the ranks they hold."""
WHOLE_GROUP = 64
"""A group of at most this many members is read whole when a root holds it up."""
MAX_WHERE = 12
"""Lines of ``where`` (the largest classes of ranks first)."""
PHRASE = 120
"""Characters of the rank set of one ``where`` line (the verdict's lines stay under 200)."""
MAX_OP = 48
"""Characters of an operation's name in a ``where`` line (it comes from the store)."""
_FLAGGED = pb.DIED | pb.OP_FAILED
_IS_P2P = pb.IS_P2P
_SEND = pb.SEND


@dataclass(frozen=True, slots=True)
class Frontier:
    """What the first pass found.

    Attributes:
        detail: ranks whose summaries the analysis needs, sorted (at most ``MAX_DETAIL``).
        roots: the ranks that end the wait-for chains (a subset of ``detail`` where they
            answered; ranks without an answer too).
        where: "ranks 0-639 wait in reduce_scatter_tensor #153", "rank 682 is in no collective
            or transfer" lines, the largest classes first: where every answering rank is.
    """

    detail: tuple[int, ...]
    roots: tuple[int, ...]
    where: tuple[str, ...]


def find_frontier(
    progress: Mapping[int, ProgressRecord],
) -> Frontier:
    """Find the ranks that hold the job up, from every answering rank's progress.

    Args:
        progress: per rank, its decoded progress record.

    Returns:
        The ranks to read in detail, the roots, and where every rank is.
    """
    cols = _columns(progress)
    edges = _edges(cols)
    roots = {m for m in edges.blocking if m not in edges.waits_on and m not in edges.stuck}
    if not roots and not edges.stuck and not edges.silent and edges.waits_on:
        roots = _loop(edges.waits_on)
    detail = _detail(progress, cols, edges, sorted(roots))
    return Frontier(tuple(sorted(detail)), tuple(sorted(roots)), tuple(_where(progress)))


@dataclass(slots=True)
class _Columns:
    """Per group name, what every answering rank says (``_columns``)."""

    members: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    """group -> its members that answered, and what each issued"""
    size: dict[str, int] = field(default_factory=dict)
    """group -> its members as a waiting rank says (for members that never answered)"""
    coll_waits: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    """(group, seq) -> the ranks waiting in that collective"""
    p2p_wait: dict[int, tuple[str, int, bool, int]] = field(default_factory=dict)
    """rank -> (group, peer, sends, p2p_seq)"""
    flagged: list[int] = field(default_factory=list)
    """ranks whose process died or whose operation failed"""


def _columns(progress: Mapping[int, ProgressRecord]) -> _Columns:
    """Columns per group name: its members and what each issued (``by_group``: two appends per
    rank and group, the cost that grows with the job), and who waits where."""
    out = _Columns(by_group(progress))
    size, coll_waits, p2p_wait = out.size, out.coll_waits, out.p2p_wait
    for rank, (_, _, _, flags, names, _, _, w, _, seq, peer, wflags, _, sizes) in progress.items():
        if flags & _FLAGGED:
            out.flagged.append(rank)
        if not w:
            continue
        name = names[w - 1]
        if wflags & _IS_P2P:
            p2p_wait[rank] = (name, peer, bool(wflags & _SEND), seq)
        elif seq:
            coll_waits[(name, seq)].append(rank)
            if sizes[w - 1] > size.get(name, 0):
                size[name] = sizes[w - 1]
    return out


@dataclass(slots=True)
class _Edges:
    """Edges through operation nodes (``_edges``)."""

    waits_on: dict[int, list[int]] = field(default_factory=dict)
    """waiting rank -> the ranks it waits on (one shared list per collective)"""
    blocking: dict[int, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))
    """rank waited on -> the collectives it holds up, (group, seq); ("", waiter) for P2P"""
    stuck: list[int] = field(default_factory=list)
    """ranks of operations every party entered and none finished"""
    silent: list[tuple[str, int]] = field(default_factory=list)
    """collectives whose missing parties never answered"""


def _edges(cols: _Columns) -> _Edges:
    """Edges through operation nodes (linear in the ranks even when thousands wait on
    thousands): a waiting rank -> its operation -> the ranks that have not entered it."""
    out = _Edges()
    for (g, seq), waiters in cols.coll_waits.items():
        ranks, counts = cols.members[g]
        behind = [m for m, n in zip(ranks, counts, strict=True) if n < seq]
        if not behind:
            if len(ranks) < cols.size[g]:
                out.silent.append((g, seq))
                for r in waiters:
                    out.waits_on[r] = []
            else:
                out.stuck.extend(waiters)
            continue
        for r in waiters:
            out.waits_on[r] = behind
        for m in behind[:MAX_DETAIL]:
            out.blocking[m].append((g, seq))
    for rank, (g, peer, sends, n) in cols.p2p_wait.items():
        other = cols.p2p_wait.get(peer)
        if other is not None and other[:3] == (g, rank, not sends) and other[3] == n:
            out.stuck.append(rank)  # both ends entered: the transfer itself is stuck
        else:
            out.waits_on[rank] = [peer]
            out.blocking[peer].append(("", rank))
    return out


def _detail(
    progress: Mapping[int, ProgressRecord],
    cols: _Columns,
    edges: _Edges,
    ordered_roots: list[int],
) -> list[int]:
    """The ranks to read in detail: the flagged ones, the roots, and evidence of each."""
    members, coll_waits = cols.members, cols.coll_waits
    detail: list[int] = []
    chosen: set[int] = set()

    def take(ranks: list[int]) -> None:
        for r in ranks:
            if len(detail) >= MAX_DETAIL:
                return
            if r not in chosen and r in progress:
                chosen.add(r)
                detail.append(r)

    take(cols.flagged[:16])
    take(ordered_roots[:32])
    # Evidence: the collectives each root holds up, smallest group first: a small group
    # whole, a few waiters of a large one (the analysis sees each group restricted to the
    # ranks read); the ranks waiting on it in a send or receive.
    for root in ordered_roots[:32]:
        held = sorted(
            edges.blocking.get(root, []), key=lambda k: len(members[k[0]][0]) if k[0] else 2
        )
        for g, seq in held[:8]:
            if not g:
                take([seq])  # (the waiting rank of a transfer)
            elif len(members[g][0]) <= WHOLE_GROUP:
                take(sorted(members[g][0]))
            else:
                take(sorted(coll_waits[(g, seq)])[:2])
    # Ranks that never answered are named by the analysis from the groups of the ranks that
    # wait on them: a few waiters of each such collective, its group whole when small.
    for g, seq in sorted(edges.silent, key=lambda k: len(members[k[0]][0]))[:8]:
        ranks = members[g][0]
        take(sorted(ranks) if len(ranks) <= WHOLE_GROUP else coll_waits[(g, seq)][:2])
    take(sorted(edges.stuck)[:MAX_DETAIL])
    if not detail:  # nothing waits: the lowest ranks and the longest waits speak for the job
        take(sorted(progress, key=lambda r: -progress[r].waited_ms)[:8])
        take(sorted(progress)[:8])
    return detail


def _loop(waits_on: Mapping[int, list[int]]) -> set[int]:
    """Where every waited-on rank waits itself: the ranks of the loop reached by following
    first edges from the lowest waiting rank (a deadlock)."""
    index: dict[int, int] = {}
    path: list[int] = []
    r = min(waits_on)
    while waits_on.get(r) and r not in index:
        index[r] = len(path)
        path.append(r)
        r = waits_on[r][0]
    return set(path[index[r] :]) if r in index else {r}


def _where(progress: Mapping[int, ProgressRecord]) -> list[str]:
    """Where every answering rank is: classes of (what it waits in, its seq), largest first
    (by operation, not group: the groups of one parallel dimension make one line)."""
    classes: dict[tuple[str, int], list[int]] = defaultdict(list)
    idle = classes[("", 0)]
    for rank, (_, _, _, _, _, _, _, w, op, seq, _, wflags, _, _) in progress.items():
        if w:
            kind = "send" if wflags & _SEND and wflags & _IS_P2P else ""
            classes[(op or kind, seq)].append(rank)
        else:
            idle.append(rank)
    if not idle:
        del classes[("", 0)]
    out = []
    ordered = sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for (op, seq), ranks in ordered[:MAX_WHERE]:
        ranks.sort()
        verb = "waits" if len(ranks) == 1 else "wait"
        if op:
            out.append(f"{ranks_phrase(ranks, PHRASE)} {verb} in {op[:MAX_OP]} #{seq}")
        else:
            are = "is" if len(ranks) == 1 else "are"
            out.append(f"{ranks_phrase(ranks, PHRASE)} {are} in no collective or transfer")
    if len(ordered) > MAX_WHERE:
        rest = sum(len(r) for _, r in ordered[MAX_WHERE:])
        out.append(f"... and {rest} more ranks in {len(ordered) - MAX_WHERE} other places")
    return out
