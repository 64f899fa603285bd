"""Type stub of the optional C hot path (``_fast.c``); see that file for the semantics."""

from collections.abc import Callable
from typing import Any

SLOT_SIZE: int
LAYOUT: dict[str, int]

class FastPath:
    enabled: int
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
    def purge(self, live: dict[int, Any], /) -> None: ...

class Site:
    """A traced function: records through ``fast``, then calls torch's own function."""

    fast: FastPath
    fallback: Callable[..., Any]
    def __init__(
        self,
        fast: FastPath,
        orig: Callable[..., Any],
        fallback: Callable[..., Any],
        names: tuple[str, ...],
        required: int,
        defaults: tuple[Any, ...],
        where: tuple[int, ...],
        op: int,
        flags: int,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
