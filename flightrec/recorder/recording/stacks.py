"""Python stacks captured unsymbolized on the hot path, symbolized only at dump time.

An entry's stack is the tuple of ``(id(code), f_lasti)`` pairs from the calling frame
outwards, interned to a small int. Turning code offsets into file/function/line costs far more
than the walk itself, and most stacks repeat thousands of times, so that work happens once per
distinct stack and only when a dump is written. The table keeps every code object it has seen
alive, so an ``id()`` in a key can never be reused by another code object.
"""

from __future__ import annotations

import linecache
import threading
from collections.abc import Callable
from types import CodeType, FrameType

from flightrec.format.builder import MAX_SOURCE_CHARS, FrameTuple
from flightrec.frames import is_own_file

# (code, f_lasti) pairs, innermost first.
RawStack = tuple[tuple[CodeType, int], ...]


def line_of(code: CodeType, lasti: int) -> int:
    """Source line of the instruction at byte offset ``lasti`` (0 when unknown)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line or 0
    return code.co_firstlineno


def frames_of(frame: FrameType | None, depth: int) -> list[FrameTuple]:
    """Symbolized stack of a live frame, innermost first, at most ``depth`` frames."""
    out: list[FrameTuple] = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append((code.co_filename, code.co_qualname, frame.f_lineno or 0))
        frame = frame.f_back
    return out


def source_line(file: str, line: int) -> str:
    """Line ``line`` of ``file``, stripped, as a traceback shows it; "" when it cannot be read.

    Read at dump time, in the recording process: the dump then shows the code the job ran,
    wherever and whenever it is analyzed. linecache reads each file once per process.
    """
    if not file or file.startswith("<"):  # <string>, <frozen ...>, flightrec's wrappers
        return ""
    try:
        return linecache.getline(file, line).strip()[:MAX_SOURCE_CHARS]
    except Exception:  # a dump must never fail for a source file
        return ""


class _ThreadCache:
    """Frames of one thread's last full stack walk, per level, with the stack above each.

    A frame that is still in the chain with the same ``f_lasti`` has the same callers at the
    same call sites, so the rest of the stack from there is known without walking it. Only
    frames of the thread's live chain at its last capture are kept, and the watchdog's
    ``purge`` drops those that have since returned, so no finished frame's locals are held
    for long.
    """

    __slots__ = ("frames", "lastis", "suffixes", "top", "top_index", "top_lasti")

    def __init__(self, depth: int) -> None:
        self.frames: list[FrameType | None] = [None] * depth
        self.lastis = [0] * depth
        self.suffixes = [0] * depth
        # The calling frame of the last capture and its result: a loop that calls the same
        # collective from the same line gets its stack with two comparisons (hotpath/python.py).
        self.top: FrameType | None = None
        self.top_lasti = -1
        self.top_index = 0


class StackTable:
    """Interns raw stacks; index 0 is the empty stack.

    Keys: a full walk is the flat tuple ``(id(code0), lasti0, id(code1), lasti1, ...)``
    (even length); a walk that stopped at a cached frame is the head pairs plus the index of
    the cached rest (odd length), so the two kinds of key never collide.
    """

    def __init__(self, depth: int, on_new: Callable[[int, RawStack], None] | None = None) -> None:
        self.depth = depth
        self._index: dict[tuple[int, ...], int] = {(): 0}
        self._stacks: list[RawStack] = [()]
        self._symbols: dict[tuple[int, int], FrameTuple] = {}
        self.on_new = on_new
        """Told of each new stack under the lock (the black box's journal)."""
        self.threads: dict[int, _ThreadCache] = {}
        """Per-thread caches; the generated wrappers read ``top``/``top_index`` directly."""
        self._lock = threading.Lock()
        self.purgers: list[Callable[[dict[int, FrameType]], None]] = []
        """Other frame caches purged with this one (the C hot path's)."""

    def capture(self, frame: FrameType | None, ident: int) -> int:
        """Intern the stack starting at ``frame`` (at most ``depth`` frames) of thread ``ident``.

        The key is built from ints only: hashing a code object hashes its contents, which
        would cost more than the whole walk.
        """
        depth = self.depth
        cache = self.threads.get(ident)
        if cache is None:
            cache = self.threads[ident] = _ThreadCache(depth)
        top = frame
        # A call flightrec itself made for the user (DDP's gradient-bucket hook) starts at
        # the user's side: the hook's frame is not where the program was.
        while frame is not None and is_own_file(frame.f_code.co_filename):
            frame = frame.f_back
        frames = cache.frames
        key: list[int] = []
        f = frame
        level = 0
        while f is not None and level < depth:
            if f is frames[level] and f.f_lasti == cache.lastis[level]:
                key.append(cache.suffixes[level])
                for stale in range(level):  # frames of an earlier chain: do not hold them
                    frames[stale] = None
                k = tuple(key)
                index = self._index.get(k)
                if index is None:
                    index = self._add_head(frame, level, k, cache.suffixes[level])
                if top is not None:
                    cache.top, cache.top_lasti, cache.top_index = top, top.f_lasti, index
                return index
            key.append(id(f.f_code))
            key.append(f.f_lasti)
            f = f.f_back
            level += 1
        k = tuple(key)
        index = self._index.get(k)
        if index is None:
            index = self._add(frame, level, k)
        self._remember(cache, frame, level, k)
        if top is not None:
            cache.top, cache.top_lasti, cache.top_index = top, top.f_lasti, index
        return index

    def _remember(
        self, cache: _ThreadCache, frame: FrameType | None, n: int, key: tuple[int, ...]
    ) -> None:
        """After a full walk, cache every level's frame and the stack from it outwards."""
        f = frame
        for level in range(n):
            if f is None:
                break
            sub = key[2 * level :]
            index = self._index.get(sub)
            if index is None:
                index = self._add(f, n - level, sub)
            cache.frames[level] = f
            cache.lastis[level] = key[2 * level + 1]
            cache.suffixes[level] = index
            f = f.f_back

    def _add_head(
        self, frame: FrameType | None, level: int, key: tuple[int, ...], rest: int
    ) -> int:
        raw: list[tuple[CodeType, int]] = []
        while frame is not None and len(raw) < level:
            raw.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        full = (*raw, *self._stacks[rest])
        # The same stack may already be known under its full-walk key: reuse that index, so a
        # stack has one index however it was captured.
        flat = tuple(x for code, lasti in full for x in (id(code), lasti))
        index = self._index.get(flat)
        if index is None:
            index = self._insert(flat, full)
        self._index[key] = index
        return index

    def _add(self, frame: FrameType | None, depth: int, key: tuple[int, ...]) -> int:
        raw: list[tuple[CodeType, int]] = []
        while frame is not None and len(raw) < depth:
            raw.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        return self._insert(key, tuple(raw))

    def _insert(self, key: tuple[int, ...], raw: RawStack) -> int:
        with self._lock:  # two threads may race to add the same new stack
            index = self._index.get(key)
            if index is None:
                index = len(self._stacks)
                self._stacks.append(raw)
                self._index[key] = index
                if self.on_new is not None:
                    self.on_new(index, raw)
        return index

    def purge(self, live: dict[int, FrameType]) -> None:
        """Forget cached frames that are no longer on their thread's stack.

        Args:
            live: ``sys._current_frames()``, taken by the caller.
        """
        for ident, cache in list(self.threads.items()):
            top = live.get(ident)
            if top is None:  # the thread is gone
                self.threads.pop(ident, None)
                continue
            alive: set[int] = set()
            while top is not None:
                alive.add(id(top))
                top = top.f_back
            frames = cache.frames
            for level, f in enumerate(frames):
                if f is not None and id(f) not in alive:
                    frames[level] = None
            if cache.top is not None and id(cache.top) not in alive:
                cache.top, cache.top_lasti = None, -1
        for purge in self.purgers:
            purge(live)

    def __len__(self) -> int:
        return len(self._stacks)

    def raw(self, index: int) -> RawStack:
        """The (code, offset) pairs of an interned stack."""
        return self._stacks[index]

    def symbolize(self, index: int) -> list[FrameTuple]:
        """File, function and line of every frame of an interned stack, innermost first."""
        out: list[FrameTuple] = []
        symbols = self._symbols
        for code, lasti in self._stacks[index]:
            key = (id(code), lasti)
            sym = symbols.get(key)
            if sym is None:
                sym = (code.co_filename, code.co_qualname, line_of(code, lasti))
                symbols[key] = sym
            out.append(sym)
        return out
