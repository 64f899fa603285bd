"""Type stub of the optional C loops of the dump reader (``_wire.c``); see that file."""

from array import array

_Bytes = bytes | bytearray | memoryview

def walk(buf: _Bytes, start: int, end: int, /) -> list[tuple[int, int, int, int, int]]: ...
def column(buf: _Bytes, start: int, end: int, kind: int, /) -> tuple[array[int], int] | None: ...
