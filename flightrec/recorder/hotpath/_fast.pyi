"""Type stub of the optional C hot path (``_fast.c``); see that file for the semantics."""

from collections.abc import Callable, Iterator
from typing import Any

SLOT_SIZE: int
FRAME_WALK: int
DICT_VERSION: int
LAYOUT: dict[str, int]

class Counter:
    value: int
    source: Callable[[], int] | None
    def __iter__(self) -> Counter: ...
    def __next__(self) -> int: ...
    def raise_to(self, n: int, /) -> None: ...

class Active:
    def __contains__(self, ident: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def __getitem__(self, ident: int, /) -> int: ...
    def __setitem__(self, ident: int, rid: int, /) -> None: ...
    def __delitem__(self, ident: int, /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def pop(self, ident: int, default: Any = ..., /) -> Any: ...
    def keys(self) -> list[int]: ...
    def items(self) -> list[tuple[int, int]]: ...

class FastPath:
    enabled: int
    @property
    def raw_on(self) -> int: ...
    @property
    def raw_key_sets(self) -> int: ...
    @property
    def walk_hits(self) -> int: ...
    def __init__(
        self,
        settle: Callable[[int, Any, Any, Any], Any] | None,
        fail: Callable[[int, BaseException], Any] | None,
        by_pg: dict[Any, Any],
        active: Active,
        threads: dict[int, int],
        tcaches: dict[int, Any],
        reds: dict[Any, int],
        ids: Counter,
        capture: Callable[[Any, int], int],
        buffer: Any,
        capacity: int,
        depth: int,
        raw: Callable[[int], Any] | None = None,
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
    def set_layout(
        self,
        tensor_type: type,
        impl: int,
        ndim: int,
        dtype: int,
        keys: int,
        allowed: int,
        dtypes: dict[int, Any],
        /,
    ) -> None: ...
    def clear_layout(self) -> None: ...
    def raw_spec(self, tensor: Any, /) -> tuple[tuple[int, ...], Any] | None: ...
    def purge(self, live: dict[int, Any], /) -> None: ...
    def forget_threads(self) -> None: ...

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
