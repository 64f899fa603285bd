"""The black box's table of what torch counted: collectives its ring may never have held.

DDP's reducer, FSDP2 and functional collectives issue collectives flightrec's hooks never see.
Per group whose numbers torch also gives to such calls, the black box's header keeps the last
collective the ProcessGroup issued and the one torch's own recorder shows unfinished
(``flightrec.format.blackbox.UNSEEN_ROW``). A rank killed while it waits in a DDP bucket
all-reduce then still shows where it waits, and a rank that never issued it, that it did not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from typing import TYPE_CHECKING

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import UnseenRow

if TYPE_CHECKING:
    from flightrec.recorder.hotpath.groups import GroupInfo
    from flightrec.recorder.native.watch import PendingNative


def unseen_rows(
    groups: Iterable[GroupInfo], pending: Mapping[str, PendingNative], buckets: Set[str]
) -> list[UnseenRow]:
    """The table's rows: per group that torch numbers (or shows a pending collective of).

    Args:
        groups: the registry's groups.
        pending: torch's group name -> its unfinished collective.
        buckets: names of groups whose C++-issued all-reduces are DDP gradient buckets.
    """
    rows = []
    for info in groups:
        p = pending.get(info.name)
        if info.counter.source is None and p is None:
            continue  # flightrec's numbers are torch's: the ring says it all
        try:
            issued = info.native_seq()
        except Exception:
            issued = p.seq if p is not None else 0
        if p is None:
            rows.append(UnseenRow(info.index, 0, issued, 0, "", 0))
            continue
        flags = pb.DDP_BUCKET if p.group in buckets and p.op == "all_reduce" else 0
        rows.append(UnseenRow(info.index, flags, max(issued, p.seq), p.seq, p.op, p.since_ns))
    return rows


class UnseenBook:
    """What was last written to one black box's table, and which torch groups were named.

    The watchdog's thread only (each tick): the header is rewritten only when a row changed.
    """

    def __init__(self, write: Callable[[list[UnseenRow]], None]) -> None:
        """``write(rows)``: the black box's ``unseen``."""
        self._write = write
        self._named: set[str] = set()
        self._written: list[UnseenRow] = []

    def unnamed(self, names: Iterable[str]) -> list[str]:
        """Of torch's group ``names``, those not seen before (each is returned once)."""
        fresh = [name for name in names if name not in self._named]
        self._named.update(fresh)
        return fresh

    def write(self, rows: list[UnseenRow]) -> None:
        """Write ``rows`` into the black box's header, unless they are what it holds."""
        if rows != self._written:
            self._written = rows
            self._write(rows)
