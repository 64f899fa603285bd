"""Type stub of the straggler pass's optional C loops (``_arrivals.c``); see that file."""

from collections.abc import Sequence
from typing import Literal

_Member = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int], Sequence[int], int]

def tally(
    members: list[_Member], completed: int, floor_ns: float, /
) -> (
    tuple[
        tuple[int, ...],
        tuple[int, ...],
        bytes,
        bytes,
        bytes,
        list[int],
        list[tuple[int, int, int]],
        list[float | None],
    ]
    | Literal[False]
    | None
): ...
