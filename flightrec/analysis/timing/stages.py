"""Pipeline stages, read from who sends to whom.

Ranks of a pipeline-parallel job send activations to the next stage and gradients back to
the previous one, and no other point-to-point traffic is usual. So the ranks that exchange
sends and receives form paths, one per pipeline (per data-parallel replica and
tensor-parallel index), all as long as there are stages; a rank's stage is its place on its
path. Ranks of one stage do the same work, which is what makes their time comparable.

A path has two ends and nothing in a send says which is the first stage: the end with the
lower rank is taken as stage 0, as Megatron-LM, torchtitan and ``torch.distributed.pipelining``
number them. Where the transfers do not form paths of one length (an interleaved schedule
whose last stage sends back to the first, expert-parallel all-to-alls over P2P), there are no
stages: every rank is compared with every other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter

from flightrec.analysis.matching.matching import Matched


@dataclass(frozen=True, slots=True)
class Stages:
    """Every rank's pipeline stage.

    Attributes:
        count: stages per pipeline; 1 where the job has none (or they cannot be told).
        stage_of: per rank with a dump, its stage (0 for every rank without stages).
        pipelines: each pipeline's ranks, first stage first; empty without stages.
    """

    count: int
    stage_of: Mapping[int, int]
    pipelines: tuple[tuple[int, ...], ...]

    def cohort(self, stage: int) -> tuple[int, ...]:
        """The ranks of ``stage``, increasing."""
        return tuple(sorted(r for r, s in self.stage_of.items() if s == stage))

    def place(self, rank: int) -> tuple[int, int] | None:
        """(the rank's stage, stages per pipeline); None without stages."""
        if self.count < 2 or rank not in self.stage_of:
            return None
        return self.stage_of[rank], self.count


def _peers(m: Matched) -> dict[int, set[int]]:
    """Per rank with a dump, the global ranks it sent to or received from."""
    out: dict[int, set[int]] = {}
    for r, d in m.run.dumps.items():
        peer = d.columns["peer"]
        mine: set[int] = set()
        for gi in m.index.get(r, {}).values():
            positions = gi.p2p_positions
            if positions:
                # (every entry of p2p_positions is a send or receive: C-speed gathers)
                mine.update(
                    itemgetter(*positions)(peer) if len(positions) > 1 else [peer[positions[0]]]
                )
        mine.discard(r)
        out[r] = {p for p in mine if p >= 0}
    return out


def find_stages(m: Matched) -> Stages:
    """The stages of the run's pipelines, from the point-to-point transfers in the dumps.

    Args:
        m: the lined-up histories.

    Returns:
        The stages; one stage holding every rank where the transfers are not pipelines.
    """
    return stages_from_peers(_peers(m))


def stages_from_peers(peers: Mapping[int, Iterable[int]]) -> Stages:
    """The stages of the pipelines that the ranks' peers form (see the module's doc).

    Args:
        peers: per rank, the global ranks it sent to or received from (every rank compared
            is a key, with no peers where it has none).

    Returns:
        The stages; one stage holding every rank where the transfers are not pipelines.
    """
    flat = Stages(1, dict.fromkeys(peers, 0), ())
    # Links both ends of which are known, seen from either end.
    links: dict[int, set[int]] = {r: set() for r in peers}
    for r, ps in peers.items():
        for p in ps:
            if p in links and p != r:
                links[r].add(p)
                links[p].add(r)
    if not links or any(len(ps) > 2 for ps in links.values()):
        return flat
    seen: set[int] = set()
    pipelines: list[tuple[int, ...]] = []
    for start in sorted(links):
        if start in seen or len(links[start]) != 1:
            continue  # walk from path ends only
        path = [start]
        seen.add(start)
        prev, cur = -1, start
        while True:
            nxt = [p for p in links[cur] if p != prev]
            if not nxt:
                break
            prev, cur = cur, nxt[0]
            path.append(cur)
            seen.add(cur)
        pipelines.append(tuple(path) if path[0] < path[-1] else tuple(reversed(path)))
    if len(seen) != len(links):
        return flat  # ranks without transfers, or on a cycle
    length = len(pipelines[0]) if pipelines else 0
    if length < 2 or any(len(p) != length for p in pipelines):
        return flat
    stage_of = {r: s for p in pipelines for s, r in enumerate(p)}
    return Stages(length, stage_of, tuple(sorted(pipelines)))
