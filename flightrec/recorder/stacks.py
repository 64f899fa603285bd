"""Python stacks captured unsymbolized on the hot path, symbolized only at dump time.

An entry's stack is the tuple of ``(id(code), f_lasti)`` pairs from the calling frame
outwards, interned to a small int. Turning code offsets into file/function/line costs far more
than the walk itself, and most stacks repeat thousands of times, so that work happens once per
distinct stack and only when a dump is written. The table keeps every code object it has seen
alive, so an ``id()`` in a key can never be reused by another code object.
"""

from __future__ import annotations

import threading
from types import CodeType, FrameType

from flightrec.builder import FrameTuple

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


class StackTable:
    """Interns raw stacks; index 0 is the empty stack."""

    def __init__(self) -> None:
        self._index: dict[tuple[int, ...], int] = {(): 0}
        self._stacks: list[RawStack] = [()]
        self._symbols: dict[tuple[int, int], FrameTuple] = {}
        self._lock = threading.Lock()

    def capture(self, frame: FrameType | None, depth: int) -> int:
        """Intern the stack starting at ``frame``, keeping at most ``depth`` frames.

        The key is built from ints only: hashing a code object hashes its contents, which
        would cost more than the whole walk.
        """
        key: list[int] = []
        f = frame
        while f is not None and depth:
            key.append(id(f.f_code))
            key.append(f.f_lasti)
            f = f.f_back
            depth -= 1
        k = tuple(key)
        index = self._index.get(k)
        if index is None:
            index = self._add(frame, len(key) // 2, k)
        return index

    def _add(self, frame: FrameType | None, depth: int, key: tuple[int, ...]) -> int:
        raw: list[tuple[CodeType, int]] = []
        while frame is not None and len(raw) < depth:
            raw.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        with self._lock:  # two threads may race to add the same new stack
            index = self._index.get(key)
            if index is None:
                index = len(self._stacks)
                self._stacks.append(tuple(raw))
                self._index[key] = index
        return index

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
