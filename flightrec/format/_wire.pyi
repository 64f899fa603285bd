"""Type stub of the optional C loops of the dump reader (``_wire.c``); see that file."""

from array import array

_Bytes = bytes | bytearray | memoryview

def walk(buf: _Bytes, start: int, end: int, /) -> list[tuple[int, int, int, int, int]]: ...
def column(buf: _Bytes, start: int, end: int, kind: int, /) -> tuple[array[int], int] | None: ...
def split(
    buf: _Bytes, entries: int, groups: int, tables: tuple[int, ...], /
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bytes, bytes]: ...
def columns(
    buf: _Bytes,
    ranges: list[tuple[int, int]],
    numbers: tuple[int, ...],
    kinds: tuple[int, ...],
    bounds: tuple[int, ...],
    /,
) -> list[array[int] | None]: ...
