"""Stacks: captured as code offsets, cached above frames still live, symbolized at dump."""

from __future__ import annotations

import sys
import threading
from types import FrameType

from flightrec.recorder.recording.stacks import MAX_SOURCE_CHARS, StackTable, frames_of, source_line


def here(table: StackTable, fresh: list[list[tuple[str, str, int]]] | None = None) -> int:
    frame = sys._getframe(1)
    if fresh is not None:  # the same frame walked by a table with no cache
        new = StackTable(table.depth)
        fresh.append(new.symbolize(new.capture(frame, threading.get_ident())))
    return table.capture(frame, threading.get_ident())


def leaf_a(table: StackTable, fresh: list[list[tuple[str, str, int]]] | None = None) -> int:
    return here(table, fresh)


def leaf_b(table: StackTable, fresh: list[list[tuple[str, str, int]]] | None = None) -> int:
    return here(table, fresh)


def outer(table: StackTable, fn, n: int, fresh=None) -> list[int]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        out.append(fn(table, fresh))
    return out


def names(table: StackTable, index: int) -> list[str]:
    return [name for _, name, _ in table.symbolize(index)]


def test_same_site_same_index_and_symbolized_innermost_first() -> None:
    table = StackTable(4)
    a1, a2, a3 = outer(table, leaf_a, 3)
    assert a1 == a2 == a3 != 0
    assert names(table, a1)[:2] == ["leaf_a", "outer"]
    file, name, line = table.symbolize(a1)[0]
    assert file == __file__ and name == "leaf_a" and line == leaf_a.__code__.co_firstlineno + 1


def test_cached_capture_equals_a_fresh_full_walk() -> None:
    cached = StackTable(8)
    for fn in (leaf_a, leaf_b, leaf_a, leaf_b, leaf_a):
        fresh: list[list[tuple[str, str, int]]] = []
        indices = outer(cached, fn, 3, fresh)
        assert [cached.symbolize(i) for i in indices] == fresh
    a = outer(cached, leaf_a, 1)[0]
    b = outer(cached, leaf_b, 1)[0]
    assert a != b and names(cached, a)[0] == "leaf_a" and names(cached, b)[0] == "leaf_b"


def test_depth_limits_frames() -> None:
    table = StackTable(2)
    assert names(table, outer(table, leaf_a, 1)[0]) == ["leaf_a", "outer"]
    assert StackTable(0).capture(sys._getframe(), 1) == 0


def test_purge_forgets_frames_that_returned() -> None:
    table = StackTable(6)
    outer(table, leaf_a, 2)
    ident = threading.get_ident()
    held = [f for f in table.threads[ident].frames if f is not None]
    assert held
    table.purge(sys._current_frames())
    live: set[int] = set()
    f: FrameType | None = sys._getframe()
    while f is not None:
        live.add(id(f))
        f = f.f_back
    assert all(id(f) in live for f in table.threads[ident].frames if f is not None)
    table.purge({})  # thread gone
    assert ident not in table.threads


def test_frames_of_live_frame() -> None:
    frames = frames_of(sys._getframe(), 3)
    assert frames[0][1] == "test_frames_of_live_frame" and len(frames) == 3


def test_source_line_reads_the_line_and_never_fails(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "job.py"
    script.write_text("first()\n    second(x)  # why\n" + "y = " + "1" * 500 + "\n")
    assert source_line(str(script), 2) == "second(x)  # why"
    assert len(source_line(str(script), 3)) == MAX_SOURCE_CHARS
    assert source_line(str(script), 99) == ""
    assert source_line(str(tmp_path / "gone.py"), 1) == ""
    assert source_line("<flightrec wrapper all_reduce>", 1) == ""
