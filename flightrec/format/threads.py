"""Which of a dump's threads says where its rank is: the thread that issues its collectives.

Most jobs issue collectives from the main thread, but not all: Ray Train runs the training
function in a thread of its own while the main thread sits in Ray's worker loop, and a
launcher may do the same. Every ring entry names the thread that made the call
(``Entries.thread``), so the rank's place is read from the thread its entries name, and from
the main thread only when they name none (or a thread no longer there).

Both sides need the same answer: the recorder when it cuts a dump down to a summary for the
verdict in the job's log (``flightrec.format.summary``), and the analysis of a full dump.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

RECENT = 64
"""Newest entries looked at: a thread that issues the training loop's collectives issues most
of them; a side thread (a checkpoint writer, a metrics reporter) a few."""


class ThreadLike(Protocol):
    """What the choice reads of a thread (``pb.ThreadState``, the analysis' ``ThreadInfo``)."""

    @property
    def name(self) -> str: ...

    @property
    def is_main(self) -> bool: ...

    @property
    def holds_recorder(self) -> bool: ...


T = TypeVar("T", bound=ThreadLike)


def issuing_thread(entry_threads: Sequence[int], strings: Sequence[str]) -> str:
    """The name of the thread that issued most of the newest entries ("" when none says).

    Args:
        entry_threads: the ``Entries.thread`` column, oldest entry first (string indices;
            0 for entries without a thread: those only PyTorch's recorder saw).
        strings: the dump's string table.
    """
    counts: Counter[int] = Counter()
    newest: dict[int, int] = {}
    start = max(0, len(entry_threads) - RECENT)
    for i in range(start, len(entry_threads)):
        index = entry_threads[i]
        if 0 < index < len(strings):
            counts[index] += 1
            newest[index] = i
    if not counts:
        return ""
    best = max(counts, key=lambda index: (counts[index], newest[index]))
    return strings[best]


def where_thread(threads: Sequence[T], issuer: str, has_stack: Callable[[T], bool]) -> T | None:
    """The thread whose stack tells where the rank is.

    The first with a stack of: the issuing thread inside a collective, the issuing thread,
    the main thread, a thread inside a collective. Failing all, the main thread (its empty
    stack says the program returned), else the first thread; None when there is none.

    Args:
        threads: the dump's threads.
        issuer: the name ``issuing_thread`` gave ("" when the entries name none).
        has_stack: whether a thread's stack at dump time has frames.
    """
    rules: tuple[Callable[[T], bool], ...] = (
        lambda t: bool(issuer) and t.name == issuer and t.holds_recorder,
        lambda t: bool(issuer) and t.name == issuer,
        lambda t: t.is_main,
        lambda t: t.holds_recorder,
    )
    for rule in rules:
        for t in threads:
            if rule(t) and has_stack(t):
                return t
    return next((t for t in threads if t.is_main), threads[0] if threads else None)
