"""Type stub of the optional C hot path (``_fast.c``); see that file for the semantics."""

from collections.abc import Callable
from typing import Any

SLOT_SIZE: int

class FastPath:
    def __init__(
        self,
        recorder: Any,
        by_pg: dict[Any, Any],
        active: dict[int, int],
        threads: dict[int, int],
        tcaches: dict[int, Any],
        reds: dict[Any, int],
        ids: Any,
        capture: Callable[[Any, int], int],
        buffer: Any,
        capacity: int,
        depth: int,
    ) -> None: ...
    def enter(
        self,
        op: int,
        flags: int,
        group: Any,
        tensor_in: Any,
        tensor_out: Any,
        red: Any,
        root: Any,
        group_root: Any,
        async_op: Any,
        frame: Any,
        /,
    ) -> int: ...
    def leave(self, rid: int, result: Any, async_op: Any, group: Any, /) -> None: ...
