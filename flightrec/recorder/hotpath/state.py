"""What recording one call reads and writes, and nothing more: the hot path's own state.

Both paths (``PyPath`` in ``python.py`` and the C ``FastPath`` of ``_fast.c``) are built over
one ``HotState``: the ring, the reentrancy guard, the caches they look up on every call, and
the slow paths they call on a miss, handed in as plain callables. Nothing here reaches back
into the ``Recorder`` that fills it: what a miss needs of the recorder is in the callable it
gave. A test builds one with stand-in slow paths (tests/unit/test_recorder_hot.py).
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from flightrec.recorder.hotpath.groups import GroupInfo
    from flightrec.recorder.hotpath.ring import Ring

try:
    from flightrec.recorder.hotpath import _fast
except ImportError:  # not built: pure Python
    _fast = None  # type: ignore[assignment]


class HotState:
    """The hot path's state: caches read on every call, and the callables for misses.

    Caches (dicts the slow paths fill; the hot path only reads them):

    - ``by_pg``: ProcessGroup (or None, the default group) -> ``GroupInfo``;
    - ``threads``: thread ident -> string index of its name;
    - ``tcaches``: thread ident -> the stack table's per-thread cache (``stacks._ThreadCache``);
    - ``reds``: reduce op -> string index (the string table's own index).

    Slow paths, each called on a miss of the cache beside it (never raising but where said):

    - ``group(pg)``: the ``GroupInfo`` of a group, or None when the call is not recorded;
    - ``spec(info, tensor)``: (signature index, device index) of a single tensor;
    - ``sig(value)`` / ``device(value)``: the same for any tensor argument (lists, None);
    - ``red(op)``: string index of a reduce op; ``thread(ident)``: of a thread's name;
    - ``stack(frame, ident)``: stack index of a call made from ``frame``; ``raw(index)`` its
      frames (the C path's own stack cache), or None;
    - ``settle(rid, result, is_async, info)``: completion of an async or GPU call;
    - ``fail(rid, exc)``: a recorded call raised (the entry is marked FAILED).
    """

    __slots__ = (
        "active",
        "by_pg",
        "depth",
        "device",
        "enabled",
        "fail",
        "group",
        "raw",
        "red",
        "reds",
        "ring",
        "settle",
        "sig",
        "spec",
        "stack",
        "tcaches",
        "thread",
        "threads",
    )

    def __init__(
        self,
        *,
        ring: Ring,
        active: Any,
        depth: int,
        by_pg: dict[Any, GroupInfo],
        threads: dict[int, int],
        tcaches: dict[int, Any],
        reds: dict[Any, int],
        group: Callable[[Any], GroupInfo | None],
        spec: Callable[[GroupInfo, Any], tuple[int, int]],
        sig: Callable[[Any], int],
        device: Callable[[Any], int],
        red: Callable[[Any], int],
        thread: Callable[[int], int],
        stack: Callable[[FrameType, int], int],
        settle: Callable[[int, Any, Any, GroupInfo], None],
        fail: Callable[[int, BaseException], None],
        raw: Callable[[int], Any] | None = None,
    ) -> None:
        self.ring = ring
        self.active: Any = active
        """Thread ident -> record id of the call it is inside (the reentrancy guard): a dict,
        or the C path's ``Active``, which behaves as one (``state.new_active``)."""
        self.depth = depth
        """Frames kept per stack; 0: no stacks."""
        self.enabled = True
        """Whether calls are recorded (``Recorder.enabled`` sets it, and the C path's copy)."""
        self.by_pg = by_pg
        self.threads = threads
        self.tcaches = tcaches
        self.reds = reds
        self.group = group
        self.spec = spec
        self.sig = sig
        self.device = device
        self.red = red
        self.thread = thread
        self.stack = stack
        self.settle = settle
        self.fail = fail
        self.raw = raw


def c_path(state: HotState) -> Any:
    """The C ``FastPath`` over ``state`` (one per recorder: its Sites share its stack caches).

    Raises:
        RuntimeError: the C extension is not built.
    """
    if _fast is None:
        raise RuntimeError("the C hot path is not built")
    fast = _fast.FastPath(
        settle=state.settle,
        fail=state.fail,
        by_pg=state.by_pg,
        active=state.active,
        threads=state.threads,
        tcaches=state.tcaches,
        reds=state.reds,
        ids=cast("_fast.Counter", state.ring.ids),  # one where _fast is built (new_counter)
        capture=state.stack,
        raw=state.raw,
        buffer=state.ring.buffer,
        capacity=state.ring.capacity,
        depth=state.depth,
    )
    fast.enabled = int(state.enabled)
    return fast
