"""A process group's members in a size that does not grow with the job (``RankGrid``, schema 1.2).

Every rank's dump lists the members of its groups. Listed one by one, the world group and the
data-parallel groups grow with the job, and so every rank's dump does (O(world^2) bytes over
the job). The groups frameworks build are regular: contiguous blocks, strided slices, the
dimensions of a DeviceMesh, several of them flattened together. Each is a grid
``start + i_0 * stride_0 + i_1 * stride_1 + ...`` (last index fastest), a few bytes whatever
the job's size; only an irregular group keeps its explicit list.

Writers call ``grid_of`` (``DumpBuilder.group`` does); readers call ``members_of``, which
gives a one-dimensional grid as a ``range`` (O(1), never expanded) and expands a
multi-dimensional one once per distinct grid; ``grid_problem`` is what ``validate`` checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import MAX_WORLD_SIZE

MAX_GRID_DIMS = 8
"""More dimensions than any DeviceMesh has; a grid with more is damage."""


class Grid(NamedTuple):
    """Members ``start + sum(i_k * stride[k])`` for ``i_k < shape[k]``, last index fastest."""

    start: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def size(self) -> int:
        """The number of members."""
        n = 1
        for s in self.shape:
            n *= s
        return n


def grid_of(ranks: Sequence[int]) -> Grid | None:
    """The grid that lists exactly ``ranks`` in their order; None for an irregular list.

    Lists of fewer than two members stay lists (they are as small as a grid). A ``range``
    costs O(1); any other list one C-speed comparison, plus a Python walk along the innermost
    dimension where it is not a single arithmetic run.
    """
    if isinstance(ranks, range):
        if len(ranks) >= 2 and ranks.step > 0 and ranks.start >= 0:
            return Grid(ranks.start, (len(ranks),), (ranks.step,))
        return None
    seq = tuple(ranks)
    n = len(seq)
    if n < 2 or seq[0] < 0:
        return None
    step = seq[1] - seq[0]
    if step <= 0:
        return None
    if seq[-1] == seq[0] + (n - 1) * step and tuple(range(seq[0], seq[-1] + 1, step)) == seq:
        return Grid(seq[0], (n,), (step,))
    # Several dimensions: the first arithmetic run is the innermost one (it cannot run on
    # into the next block, or the list would be one run), and the run starts form the rest.
    inner = 2
    while inner < n and seq[inner] - seq[inner - 1] == step:
        inner += 1
    if n % inner:
        return None
    outer = grid_of(seq[::inner])
    if outer is None or len(outer.shape) >= MAX_GRID_DIMS:
        return None
    grid = Grid(seq[0], (*outer.shape, inner), (*outer.stride, step))
    return grid if tuple(expand(grid)) == seq else None


_EXPANDED: dict[Grid, tuple[int, ...]] = {}
# Large multi-dimensional grids are kept expanded, so a grid that every rank's dump holds is
# expanded once per process; small ones cost nothing to expand again.
_KEEP_FROM = 256


def expand(grid: Grid) -> Sequence[int]:
    """The members of a grid: a ``range`` for one dimension, else a tuple (shared when large).

    The grid must have passed ``grid_problem`` (bounded size and dimensions).
    """
    if len(grid.shape) == 1:
        n, s = grid.shape[0], grid.stride[0]
        return range(grid.start, grid.start + n * s, s)
    known = _EXPANDED.get(grid)
    if known is not None:
        return known
    members = [grid.start]
    for n, s in zip(grid.shape, grid.stride, strict=True):
        members = [m + i * s for m in members for i in range(n)]
    result = tuple(members)
    if len(result) >= _KEEP_FROM:
        _EXPANDED[grid] = result
    return result


def grid_problem(grid: Grid, world_size: int = 0) -> str | None:
    """Why a grid read from a file cannot be a group's members; None when it can.

    Checked before anything is expanded: dimensions, positive strides, and a member count and
    largest member within ``MAX_WORLD_SIZE`` and within ``world_size`` where it is known (a
    few bytes of grid must not make the reader expand more members than the job has).
    """
    dims = len(grid.shape)
    if dims == 0 or dims != len(grid.stride):
        return f"a member grid has {dims} sizes and {len(grid.stride)} strides"
    if dims > MAX_GRID_DIMS:
        return f"a member grid has {dims} dimensions ({MAX_GRID_DIMS} max)"
    if min(grid.shape) < 1 or min(grid.stride) < 1:
        return "a member grid has a zero size or stride"
    count, last = 1, grid.start
    for n, s in zip(grid.shape, grid.stride, strict=True):
        count *= n
        last += (n - 1) * s
        if count > MAX_WORLD_SIZE or last >= MAX_WORLD_SIZE:
            return f"a member grid reaches beyond any job ({MAX_WORLD_SIZE} ranks max)"
    if world_size > 0 and (count > world_size or last >= world_size):
        return f"a member grid reaches rank {last}, beyond world size {world_size}"
    return None


def grid_field(g: pb.ProcessGroup) -> Grid | None:
    """The group's ``rank_grid`` as a ``Grid``; None when the group lists its members."""
    if not g.HasField("rank_grid"):
        return None
    r = g.rank_grid
    return Grid(r.start, tuple(r.shape), tuple(r.stride))


def members_of(g: pb.ProcessGroup) -> Sequence[int]:
    """A parsed group's global ranks in group-rank order, from whichever form it was written in.

    A one-dimensional grid comes back as a ``range`` (nothing expanded); an explicit list as a
    list. The group must have passed ``validate``.
    """
    grid = grid_field(g)
    return g.ranks[:] if grid is None else expand(grid)


def set_members(g: pb.ProcessGroup, ranks: Sequence[int]) -> None:
    """Write ``ranks`` into a group: as a grid where they form one, else as the explicit list."""
    grid = grid_of(ranks)
    if grid is None or grid_problem(grid) is not None:
        g.ranks.extend(ranks)
    else:
        g.rank_grid.start = grid.start
        g.rank_grid.shape.extend(grid.shape)
        g.rank_grid.stride.extend(grid.stride)
