"""Typed access to the plain data of one native dump: every value is checked before use.

``Reader`` has two speeds. Its scalar accessors (``integer``, ``text``, ...) check one value
and explain a bad one in a sentence naming the file. Its column accessors (``ints``,
``texts``, ``flags``) check a whole column of a dump's entries at once: the types of all
values are collected in one C-speed pass (``set(map(type, column))``) and, when they are the
expected ones, the column is used as it is; only a column holding something unusual (a
``None``, a bool, a counter written as a string, garbage) is walked value by value through
the scalar accessors, which accept or refuse it exactly as they would one value.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Mapping, Sequence

from flightrec.errors import CorruptDumpError

# Work bound: a dump's containers may share sub-objects (pickle memo), so the size of the
# file does not bound how much a naive walk visits. Every value read counts against this.
MAX_CELLS = 30_000_000
_INT64 = 1 << 63
_NONE = type(None)
_STRS = frozenset({str})
_STRS_OR_NONE = frozenset({str, _NONE})
_COUNTER = re.compile(r"-?\d{1,19}")
_LITTLE = sys.byteorder == "little"
_NON_NEGATIVE_TOP = bytes(range(0x80))
"""Most significant bytes of non-negative int64 values (deleted: what is left is negative)."""


class Reader:
    """Typed accessors that count work and name the file in every error.

    Attributes:
        path: the file, for error messages.
        cells: values read so far (bounded by ``MAX_CELLS``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.cells = 0

    def tick(self, n: int = 1) -> None:
        """Count ``n`` values read.

        Raises:
            CorruptDumpError: the dump holds more values than any Flight Recorder dump.
        """
        self.cells += n
        if self.cells > MAX_CELLS:  # read at call time so tests can lower it
            raise CorruptDumpError(self.path, "more values than any Flight Recorder dump holds")

    def fail(self, what: str) -> CorruptDumpError:
        """The error for a field of the wrong shape (to be raised by the caller)."""
        return CorruptDumpError(self.path, f"not a valid Flight Recorder dump: {what}")

    # -- one value ---------------------------------------------------------------------

    def mapping(self, value: object, what: str) -> Mapping[object, object]:
        """``value`` as a dict, or raise."""
        self.tick()
        if not isinstance(value, dict):
            raise self.fail(f"{what} is {type(value).__name__}, expected a dict")
        return value

    def seq(self, value: object, what: str) -> Sequence[object]:
        """``value`` as a list or tuple (its length counts as work), or raise."""
        self.tick()
        if not isinstance(value, list | tuple):
            raise self.fail(f"{what} is {type(value).__name__}, expected a list")
        self.tick(len(value))
        return value

    def integer(self, value: object, what: str, default: int = 0) -> int:
        """A 64-bit integer; None is ``default``, a bool or a decimal string its number."""
        self.tick()
        if type(value) is int and -_INT64 <= value < _INT64:
            return value  # the common case, checked first
        if value is None:
            return default
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, str) and _COUNTER.fullmatch(value):
            value = int(value)  # the JSON form writes pg_status counters as strings
        if not isinstance(value, int):
            raise self.fail(f"{what} is {type(value).__name__}, expected an integer")
        if not -_INT64 <= value < _INT64:
            raise self.fail(f"{what} ({value}) does not fit 64 bits")
        return value

    def text(self, value: object, what: str, default: str = "") -> str:
        """A string; None is ``default``, bytes are decoded (bad bytes replaced)."""
        self.tick()
        if type(value) is str:
            return value
        if value is None:
            return default
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise self.fail(f"{what} is {type(value).__name__}, expected a string")
        return value

    def flag(self, value: object, what: str) -> bool:
        """A boolean; None is False, an integer is its truth."""
        self.tick()
        if value is None:
            return False
        if not isinstance(value, bool | int):
            raise self.fail(f"{what} is {type(value).__name__}, expected a boolean")
        return bool(value)

    # -- one column of the entries table ----------------------------------------------

    def ints(self, column: Sequence[object], what: str, default: int = 0) -> Sequence[int]:
        """Every value of ``column`` as a 64-bit integer (see ``integer``).

        One C-speed pass checks type and range at once: building a signed 64-bit array
        refuses anything that is not an integer that fits (it takes bools, as ``integer``
        does). Only a column it refuses is read value by value.
        """
        self.tick(len(column))
        try:
            return array("q", column)  # type: ignore[arg-type]
        except (TypeError, OverflowError):
            pass
        if None in column:  # missing values (the pickle form's unknown times)
            try:
                # None -> default, every other value itself, at C speed (an unhashable
                # value is explained value by value below).
                column = list(map({None: default}.get, column, column))  # type: ignore[arg-type]
                return array("q", column)  # type: ignore[arg-type]
            except (TypeError, OverflowError):
                pass
        self.cells -= len(column)  # the value-by-value pass counts each value itself
        return [self.integer(v, what, default) for v in column]

    def naturals(self, column: Sequence[object], what: str) -> Sequence[int]:
        """``ints`` with negative values (never meaningful here) read as 0."""
        values = self.ints(column, what)
        if isinstance(values, array):
            # Little-endian or not, a negative int64 is one whose most significant byte has
            # its top bit set: find such a byte at C speed instead of comparing 2,000 ints.
            top = values.tobytes()[7 if _LITTLE else 0 :: 8]
            negative = bool(top.translate(None, _NON_NEGATIVE_TOP))
        else:
            negative = bool(values) and min(values) < 0
        if negative:
            return array("q", [v if v > 0 else 0 for v in values])
        return values

    def texts(self, column: Sequence[object], what: str) -> Sequence[str]:
        """Every value of ``column`` as a string (see ``text``); None is ""."""
        self.tick(len(column))
        types = set(map(type, column))
        if types <= _STRS:
            return column  # type: ignore[return-value]  # checked just above
        if types <= _STRS_OR_NONE:
            return ["" if v is None else v for v in column]  # type: ignore[misc]
        self.cells -= len(column)
        return [self.text(v, what) for v in column]

    def flags(self, column: Sequence[object], what: str) -> Sequence[bool]:
        """Every value of ``column`` as a boolean (see ``flag``)."""
        self.tick(len(column))
        if set(map(type, column)) <= {bool}:
            return column  # type: ignore[return-value]  # checked just above
        self.cells -= len(column)
        return [self.flag(v, what) for v in column]
