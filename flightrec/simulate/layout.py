"""The process-group layout of a simulated 3D-parallel job.

Ranks are laid out tensor-parallel fastest, then pipeline, then data parallel, as Megatron and
torchtitan do: ``rank = dp * (tp * pp) + pp_stage * tp + tp_index``. Every rank creates every
group in the same order, so group names (torch's creation counter) agree across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class GroupKind(Enum):
    """Which dimension a process group spans."""

    WORLD = "world"
    """All ranks: the loss all-reduce, barriers."""
    TP = "tp"
    """Ranks of one pipeline stage of one data-parallel replica: activation all-reduces."""
    PP = "pp"
    """Ranks of one tensor-parallel index of one replica, one per stage: P2P between stages."""
    DP = "dp"
    """Ranks holding the same shard in every replica: gradient reduce-scatter, param all-gather."""


@dataclass(frozen=True, slots=True)
class SimGroup:
    """One process group of the simulated job."""

    name: str
    kind: GroupKind
    ranks: Sequence[int]
    """Global ranks in group-rank order: a ``range`` (every group of this layout is strided),
    so a rank's groups cost O(1) to build however large the world."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A world of ``tp * pp * dp`` ranks, ``ranks_per_host`` ranks to a host."""

    world: int
    tp: int
    pp: int
    ranks_per_host: int = 8

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1 or self.world % (self.tp * self.pp):
            raise ValueError(
                f"world size {self.world} is not a multiple of tp*pp = {self.tp}*{self.pp}"
            )

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp index, pipeline stage, data-parallel replica) of a rank."""
        return rank % self.tp, (rank // self.tp) % self.pp, rank // (self.tp * self.pp)

    def rank_of(self, tp_index: int, stage: int, replica: int) -> int:
        return replica * self.tp * self.pp + stage * self.tp + tp_index

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    # Group names follow creation order: "0" is the world, then every tp group, every pp
    # group, every dp group. The index arithmetic below is that order.
    def _tp_index(self, rank: int) -> int:
        _, s, d = self.coords(rank)
        return d * self.pp + s

    def _pp_index(self, rank: int) -> int:
        t, _, d = self.coords(rank)
        return d * self.tp + t

    def _dp_index(self, rank: int) -> int:
        t, s, _ = self.coords(rank)
        return s * self.tp + t

    def group_of(self, rank: int, kind: GroupKind) -> SimGroup:
        """The group of ``kind`` that ``rank`` belongs to."""
        t, s, d = self.coords(rank)
        if kind is GroupKind.WORLD:
            return SimGroup("0", kind, range(self.world))
        if kind is GroupKind.TP:
            first = 1
            ranks = range(self.rank_of(0, s, d), self.rank_of(0, s, d) + self.tp)
            return SimGroup(str(first + self._tp_index(rank)), kind, ranks)
        if kind is GroupKind.PP:
            first = 1 + self.world // self.tp
            ranks = range(self.rank_of(t, 0, d), self.rank_of(t, 0, d + 1), self.tp)
            return SimGroup(str(first + self._pp_index(rank)), kind, ranks)
        first = 1 + self.world // self.tp + self.world // self.pp
        ranks = range(self.rank_of(t, s, 0), self.world, self.tp * self.pp)
        return SimGroup(str(first + self._dp_index(rank)), kind, ranks)

    def groups_of(self, rank: int) -> list[SimGroup]:
        """The groups a rank is a member of (size-1 groups are omitted, as they carry nothing)."""
        kinds = [GroupKind.WORLD]
        kinds += [
            k
            for k, n in ((GroupKind.TP, self.tp), (GroupKind.PP, self.pp), (GroupKind.DP, self.dp))
            if n > 1
        ]
        return [self.group_of(rank, k) for k in kinds]


def parse_layout(spec: str, world: int, ranks_per_host: int = 8) -> Layout:
    """Parse ``"tp=8,pp=4"`` (either may be left out; dp is what remains of the world).

    Raises:
        ValueError: a malformed spec or sizes that do not divide the world.
    """
    sizes = {"tp": 1, "pp": 1}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        if key not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(f"bad layout part {part!r}: expected tp=N or pp=N")
        sizes[key] = int(value)
    return Layout(world, sizes["tp"], sizes["pp"], ranks_per_host)
