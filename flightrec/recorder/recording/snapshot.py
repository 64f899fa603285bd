"""One consistent picture of what a process recorded, taken for a dump (``Recorder.snapshot``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from flightrec.format.builder import FrameTuple
from flightrec.format.slot import Slot

if TYPE_CHECKING:
    from flightrec.recorder.hotpath.groups import GroupInfo
    from flightrec.recorder.native.merge import Merged


@dataclass(frozen=True, slots=True)
class GroupCounts:
    """A group's counters, copied with the ring."""

    info: GroupInfo
    seq: int
    """Collectives this rank issued on the group."""
    recorded: int
    """Entries the ring took for the group (more than it holds once it wrapped)."""
    p2p: list[tuple[int, int, int]]
    """(peer, sends, recvs) per peer (``GroupInfo.p2p_counters``)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Ring, tables, counters and thread stacks, taken together under no lock of the hot
    path: everything a dump builds from, read in one place and in one order."""

    frames: dict[int, FrameType]
    """Every thread's current frame (``sys._current_frames``)."""
    active: dict[int, int]
    """Thread ident -> record id of the call it is inside."""
    entries: list[Slot]
    """The ring's entries, oldest first."""
    merged: Merged | None
    """The entries merged with PyTorch's own ring, where it was read (``native.merge``)."""
    strings: list[str]
    specs: list[Any]
    """Tensor signatures by index."""
    groups: list[GroupCounts]
    """Every group (those only PyTorch's ring saw included), in registry order."""
    wall_ns: int
    mono_ns: int
    capacity: int
    """The ring's capacity in entries."""
    symbolize: Callable[[int], list[FrameTuple]]
    """File, function and line of an interned stack's frames (at dump time only)."""
