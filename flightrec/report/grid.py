"""The collective grid: per process group, ranks x recent sequence numbers, each cell a state.

Built from what the analysis returns (``Report.matched``: each rank's ring index per group, its
progress counters, its incomplete entries; the findings), for the HTML report to draw. Ranks
whose cells are alike collapse into one row with their range once a group is larger than
``EACH_RANK_UP_TO``, so a 16,384-rank group is a handful of rows; ranks a finding blames always
keep a row of their own. Each cell points to one entry of the row's first rank (the rank the
row shows), deduplicated, so hovering a cell can show the operation, shapes, dtype, times
and stack without the page holding every rank's ring.
"""

from __future__ import annotations

import enum
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flightrec.analysis.model import FindingKind, is_library_frame, op_label
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress

if TYPE_CHECKING:
    from flightrec.analysis import Report
    from flightrec.analysis.loading.rankindex import RankGroupIndex
    from flightrec.analysis.model import GroupProgress, ProcessGroupInfo, RankDump

SEQS = 24
"""Sequence numbers a group's grid shows: the newest, and the one a finding points at."""
EACH_RANK_UP_TO = 16
"""Groups of at most this many ranks show one row per rank; larger ones merge alike ranks."""
MAX_ROWS = 48
"""Rows a group's grid shows at most (rows of blamed ranks always among them)."""
MAX_GROUPS = 12
"""Groups the report draws: those the findings name first, then those whose ranks disagree."""
FOCUS_PROBES = 16
"""Members whose rings are looked at to confirm a finding's seq is one of the group's."""
STACK_FRAMES = 12
"""Frames of an entry's stack a cell's details show."""


class Cell(enum.IntEnum):
    """A rank's state for one sequence number of one group. The value is the page's code."""

    COMPLETED = 0
    """The collective completed on this rank (or an older one the ring no longer holds,
    which the rank's progress counter says completed)."""
    PENDING = 1
    """The rank entered the collective and it had not completed when the rank dumped."""
    NOT_ENTERED = 2
    """The rank had not issued this collective when it dumped."""
    MISMATCHED = 3
    """A mismatch finding blames this rank at this sequence number."""
    FAILED = 4
    """The rank's call failed (raised, or the work reported an error)."""
    UNKNOWN = 5
    """Issued, but its completion is unknown: the dump does not track completion, or the
    entry was overwritten before it was known to complete."""
    NO_DUMP = 6
    """The rank left no dump (or its dump does not hold this group)."""


@dataclass(frozen=True, slots=True)
class GridRow:
    """One row: one rank, or ranks whose cells are all alike."""

    ranks: tuple[int, ...]
    cells: tuple[int, ...]
    """``Cell`` values, one per sequence number of the grid."""
    entries: tuple[int, ...]
    """Per cell: an index into ``Grid.entries`` (the first rank's entry), or -1 when none."""
    blamed: bool
    """A rank of this row is blamed by a finding."""
    culprit: bool
    """A rank of this row is blamed by the first (most likely) finding."""

    @property
    def label(self) -> str:
        """``rank 3``, or ``ranks 0-2,4-7 (7)``."""
        if len(self.ranks) == 1:
            return f"rank {self.ranks[0]}"
        return f"ranks {compress(self.ranks)} ({len(self.ranks)})"


@dataclass(frozen=True, slots=True)
class GroupGrid:
    """One process group's grid."""

    key: str
    label: str
    size: int
    """Members of the group."""
    seqs: tuple[int, ...]
    """The sequence numbers shown, oldest first (consecutive)."""
    rows: tuple[GridRow, ...]
    focus: int | None
    """The sequence number a finding points at in this group, when one does."""
    hidden_rows: int = 0
    """Rows left out past ``MAX_ROWS`` (their ranks are in none of the rows shown)."""
    hidden_ranks: int = 0


@dataclass(slots=True)
class Grid:
    """The grids of the groups worth looking at, with the entries their cells point to."""

    groups: list[GroupGrid] = field(default_factory=list)
    entries: list[dict[str, object]] = field(default_factory=list)
    """Deduplicated entry details: op, state, shapes, dtype, times, stack index."""
    stacks: list[list[str]] = field(default_factory=list)
    """Deduplicated stacks, each ``file:line in function`` lines, innermost first."""
    hidden_groups: int = 0
    """Groups with collectives that the report does not draw."""
    hidden_uneven: int = 0
    """Of those, groups whose members disagree on their progress (or left no dump)."""
    _entry_ids: dict[tuple[object, ...], int] = field(default_factory=dict, repr=False)
    _stack_ids: dict[tuple[str, ...], int] = field(default_factory=dict, repr=False)

    def entry_id(self, d: RankDump, pos: int) -> int:
        """The index in ``entries`` of entry ``pos`` of rank ``d``, added when new."""
        e = d.dump.entries
        enq, done = e.enqueue_ns[pos], e.complete_ns[pos]
        dump_ns = d.header.mono_time_ns
        record = d.record(pos)
        frames = tuple(
            f"{'→ ' if not is_library_frame(fr) else ''}{fr.where()} in {fr.function}"
            for fr in record.stack[:STACK_FRAMES]
            if not fr.file.startswith("<flightrec wrapper")
        )
        stack = self._stack_ids.get(frames)
        if stack is None:
            stack = self._stack_ids[frames] = len(self.stacks)
            self.stacks.append(list(frames))
        inputs = [_spec(t.dtype, t.shape) for t in record.inputs]
        outputs = [_spec(t.dtype, t.shape) for t in record.outputs]
        details: dict[str, object] = {
            "rank": d.rank,
            "op": op_label(record.op, record.flags),
            "seq": record.seq,
            "state": record.state_name.lower() if d.tracks_completion else "not tracked",
            "in": inputs,
            "out": outputs,
            "stack": stack,
        }
        if record.reduce_op:
            details["reduce_op"] = record.reduce_op
        if enq:
            details["entered"] = _utc(d.wall_ns(enq))
            if dump_ns:
                details["before_dump_s"] = round((dump_ns - enq) / 1e9, 3)
        if done and enq and done >= enq:
            details["took_ms"] = round((done - enq) / 1e6, 3)
        key = tuple(sorted((k, str(v)) for k, v in details.items()))
        found = self._entry_ids.get(key)
        if found is None:
            found = self._entry_ids[key] = len(self.entries)
            self.entries.append(details)
        return found


def _spec(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{'x'.join(map(str, shape))}]"


def _utc(wall_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(wall_ns / 1e9)) + (
        f".{wall_ns % 1_000_000_000 // 1_000_000:03d} UTC"
    )


def _cells(
    d: RankDump,
    gi: RankGroupIndex | None,
    p: GroupProgress,
    seqs: range,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One rank's cells (and the ring positions behind them, -1 where none) for ``seqs``."""
    states = d.columns["state"] if gi is not None else None
    tracks = d.tracks_completion
    found = [gi.position_of(s) if gi is not None else None for s in seqs]
    # A group's collectives complete in the order they were issued: one that a later
    # completed collective follows completed too, though its own entry was never marked
    # (PyTorch's recorder, merged into the dump, may not see a gloo work's end).
    done = p.last_completed
    if states is not None:
        for s, pos in zip(seqs, found, strict=True):
            if pos is not None and states[pos] == pb.COMPLETED:
                done = max(done, s)
    cells: list[int] = []
    for s, pos in zip(seqs, found, strict=True):
        if s > p.last_seq:
            cells.append(Cell.NOT_ENTERED)
        elif pos is None or states is None:
            cells.append(Cell.COMPLETED if s <= done else Cell.UNKNOWN)
        elif not tracks:
            cells.append(Cell.UNKNOWN)
        elif states[pos] == pb.COMPLETED or s <= done:
            cells.append(Cell.COMPLETED)
        elif states[pos] == pb.FAILED:
            cells.append(Cell.FAILED)
        else:
            cells.append(Cell.PENDING)
    positions = [-1 if pos is None else pos for pos in found]
    return tuple(cells), tuple(positions)


def groups_named(report: Report) -> list[str]:
    """The groups the findings name (where each is, then where its consequences wait), the
    first finding's first: the groups every renderer shows first."""
    groups = report.matched.groups
    named: list[str] = []
    for f in report.findings:
        for k in [f.process_group] + [c.process_group for c in f.consequences]:
            if k and k in groups and k not in named:
                named.append(k)
    return named


def _ordered_groups(report: Report) -> tuple[list[str], int, int]:
    """Groups to draw, most telling first; how many others have collectives, and how many
    of those have members that disagree."""
    groups = report.matched.groups
    named = groups_named(report)
    with_collectives = [
        k for k, g in groups.items() if any(p.last_seq for p in g.progress.values())
    ]
    named = [k for k in named if k in with_collectives]
    # Members disagreeing on progress, or missing: something to see even where no finding points.
    uneven = [
        k
        for k in with_collectives
        if k not in named
        and (
            len({(p.last_seq, p.last_completed) for p in groups[k].progress.values()}) > 1
            or any(r not in groups[k].progress for r in groups[k].ranks)
        )
    ]
    rest = [k for k in with_collectives if k not in named and k not in uneven]
    order = (named + uneven + rest)[:MAX_GROUPS]
    shown = set(order)
    return (
        order,
        len(with_collectives) - len(order),
        sum(1 for k in uneven if k not in shown),
    )


def build_grid(report: Report, seqs: int = SEQS) -> Grid:
    """The grids of the groups the report shows.

    Args:
        report: the analysis.
        seqs: sequence numbers per group.

    Returns:
        Groups named by the findings first, then groups whose members disagree on their
        progress, then the others, ``MAX_GROUPS`` at most.
    """
    grid = Grid()
    order, grid.hidden_groups, grid.hidden_uneven = _ordered_groups(report)
    for key in order:
        grid.groups.append(_group_grid(report, key, seqs, grid))
    return grid


def _focus(report: Report, key: str, members: tuple[int, ...]) -> int | None:
    """The collective seq of ``key`` the first finding that names one points at.

    A finding's seq counts only where members' rings hold that collective with the
    finding's op (any op for a mismatch): a P2P finding's seq numbers the transfers to
    one peer, not the group's collectives.
    """
    m = report.matched
    for f in report.findings:
        if f.process_group != key or f.seq is None:
            continue
        for r in [r for r in members if r in m.run.dumps][:FOCUS_PROBES]:
            rec = m.record(r, key, f.seq)
            if rec is not None and (rec.op == f.op or f.kind is FindingKind.MISMATCH):
                return f.seq
    return None


def _group_grid(report: Report, key: str, width: int, grid: Grid) -> GroupGrid:
    info = report.matched.groups[key]
    members = tuple(info.ranks) or tuple(sorted(info.progress))
    focus = _focus(report, key, members)
    seqs = _columns(info, focus, width)
    per_rank = _rank_cells(report, key, members, seqs)
    rows = _rows(report, members, per_rank, grid)
    hidden_rows = hidden_ranks = 0
    if len(rows) > MAX_ROWS:
        keep = sorted(rows, key=lambda row: (not row.blamed, -len(row.ranks)))[:MAX_ROWS]
        kept = {id(row) for row in keep}
        hidden = [row for row in rows if id(row) not in kept]
        hidden_rows, hidden_ranks = len(hidden), sum(len(row.ranks) for row in hidden)
        rows = [row for row in rows if id(row) in kept]
    return GroupGrid(
        key, info.label(), len(members), tuple(seqs), tuple(rows), focus, hidden_rows, hidden_ranks
    )


def _columns(info: ProcessGroupInfo, focus: int | None, width: int) -> range:
    """The ``width`` sequence numbers shown: the newest, or the finding's with two before it."""
    newest = max((p.last_seq for p in info.progress.values()), default=0)
    end = max(newest, focus or 0)
    start = max(1, end - width + 1)
    if focus is not None and focus < start + 2:  # the finding's seq with two before it
        start = max(1, focus - 2)
        end = start + width - 1
    return range(start, end + 1)


_Cells = tuple[tuple[int, ...], tuple[int, ...]]
"""A row's cells and, per cell, the entry's position in the rank's dump (-1: none)."""


def _rank_cells(
    report: Report, key: str, members: tuple[int, ...], seqs: range
) -> dict[int, _Cells]:
    """Per member of group ``key``: its cells over ``seqs``."""
    m = report.matched
    info = m.groups[key]
    mismatched: dict[int, set[int]] = defaultdict(set)  # rank -> seqs a mismatch blames it at
    for f in report.findings:
        if f.kind is FindingKind.MISMATCH and f.process_group == key and f.seq is not None:
            for r in f.ranks:
                mismatched[r].add(f.seq)

    # Ranks with equal rings share their group index and progress: their cells are equal.
    by_key: dict[tuple[object, ...], _Cells] = {}
    per_rank: dict[int, _Cells] = {}
    no_dump = (tuple([int(Cell.NO_DUMP)] * len(seqs)), tuple([-1] * len(seqs)))
    for r in members:
        d = m.run.dumps.get(r)
        p = info.progress.get(r)
        if d is None or p is None:
            per_rank[r] = no_dump
            continue
        gi = m.index.get(r, {}).get(key)
        incomplete = m.incomplete.get(r, ())
        states = d.columns["state"]
        known = (id(gi), p, d.tracks_completion, incomplete, tuple(states[i] for i in incomplete))
        got = by_key.get(known)
        if got is None:
            got = by_key[known] = _cells(d, gi, p, seqs)
        if r in mismatched:
            marked = tuple(
                int(Cell.MISMATCHED) if s in mismatched[r] else c
                for s, c in zip(seqs, got[0], strict=True)
            )
            got = (marked, got[1])
        per_rank[r] = got
    return per_rank


def _rows(
    report: Report, members: tuple[int, ...], per_rank: dict[int, _Cells], grid: Grid
) -> list[GridRow]:
    """Every rank in a small group its row; alike ranks together in a large one (blamed ranks
    alone, so that the culprit's row is its own)."""
    culprits = set(report.findings[0].ranks) if report.findings else set()
    blamed = {r for f in report.findings for r in f.ranks}
    rows_of: dict[tuple[object, ...], list[int]] = {}
    for r in members:
        alone = len(members) <= EACH_RANK_UP_TO or r in blamed
        rows_of.setdefault((r,) if alone else ("alike", per_rank[r][0]), []).append(r)
    rows: list[GridRow] = []
    for ranks in rows_of.values():
        first = ranks[0]
        cells, positions = per_rank[first]
        d = report.matched.run.dumps.get(first)
        entries = tuple(
            grid.entry_id(d, pos) if d is not None and pos >= 0 else -1 for pos in positions
        )
        rows.append(
            GridRow(
                tuple(ranks),
                cells,
                entries,
                bool(blamed.intersection(ranks)),
                bool(culprits.intersection(ranks)),
            )
        )
    return rows
