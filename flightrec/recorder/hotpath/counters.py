"""State both paths share: sequence counters, record ids and the per-thread reentrancy guard.

With the C extension built these are its ``Counter`` and ``Active``, which the C path reads
and writes as C integers (no int objects, no hashing, no attribute writes on the hot path);
without it, their pure-Python twins below. The Python path and the rest of the recorder use
either the same way: ``next(counter)`` and ``counter.value``; ``active`` as a dict.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

try:
    from flightrec.recorder.hotpath import _fast
except ImportError:  # not built: pure Python
    _fast = None  # type: ignore[assignment]


class Counting(Protocol):
    """What both counters are."""

    @property
    def value(self) -> int: ...

    source: Callable[[], int] | None
    """None, or the ProcessGroup's own last sequence number: a group's calls are numbered
    from it (plus one) once torch numbers calls flightrec never sees (``GroupInfo``)."""

    def __iter__(self) -> Iterator[int]: ...
    def __next__(self) -> int: ...
    def raise_to(self, n: int, /) -> None: ...


class Counter:
    """1, 2, 3, ... like ``itertools.count(1)``; ``value`` is the last number issued.

    ``next`` on the inner count is atomic under the GIL, so no number is issued twice.
    ``value`` is only raised (CPython does not switch threads between the comparison and the
    store), so it never goes back below a number already issued.
    """

    __slots__ = ("_next", "source", "value")

    def __init__(self) -> None:
        self._next = itertools.count(1).__next__
        self.value = 0
        self.source: Callable[[], int] | None = None

    def __iter__(self) -> Counter:
        return self

    def __next__(self) -> int:
        n = self._next()
        if n > self.value:
            self.value = n
        return n

    def raise_to(self, n: int, /) -> None:
        """Make ``n`` the last number issued, unless a higher one was."""
        if n > self.value:
            self.value = n
            self._next = itertools.count(n + 1).__next__


def new_counter() -> Counting:
    """A counter starting at 1 (``_fast.Counter`` where built)."""
    return _fast.Counter() if _fast is not None else Counter()


def new_active() -> Any:
    """An empty reentrancy guard: thread ident -> record id (``_fast.Active`` where built)."""
    return _fast.Active() if _fast is not None else {}
