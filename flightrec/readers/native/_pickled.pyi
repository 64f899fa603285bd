"""Type stub of the native reader's optional C reader (``_pickled.c``); see that file."""

from collections.abc import Callable

from flightrec.readers.native.entries import CReading

def read(data: bytes, dtype_name: Callable[[str], str], max_cells: int, /) -> CReading | None: ...
