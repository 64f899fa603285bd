"""Reading the JSON form of PyTorch Flight Recorder dumps (``_dump_fr_trace_json``).

The JSON form differs from the pickle form in small ways the normalizer absorbs: tuples become
lists (``process_group``), missing times are 0 instead of None, ``pg_status`` counters are
strings, and stack frames are not included.
"""

from __future__ import annotations

import json
from pathlib import Path

from flightrec.errors import CorruptDumpError


def _refuse_constant(name: str) -> float:
    # NaN and Infinity are not JSON; a dump never holds them, and they would poison arithmetic.
    raise ValueError(f"non-standard JSON constant {name}")


def load_json(data: bytes, path: str | Path) -> object:
    """Parse ``data`` as strict JSON.

    Args:
        data: the bytes of the whole file (the caller bounds its size).
        path: the file, for error messages.

    Returns:
        Plain JSON values (dict, list, str, int, float, bool, None).

    Raises:
        CorruptDumpError: not UTF-8, not valid JSON, nested absurdly deep, or holding numbers
            too long to be counters.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptDumpError(
            path, f"JSON dump is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise CorruptDumpError(
            path, f"truncated or damaged JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    except RecursionError:
        raise CorruptDumpError(path, "JSON nests too deeply to be a Flight Recorder dump") from None
    except ValueError as exc:  # over-long integers (int_max_str_digits) and NaN/Infinity
        raise CorruptDumpError(path, f"JSON holds a value no dump holds ({exc})") from None
