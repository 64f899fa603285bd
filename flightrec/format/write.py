"""Writing a dump file: serialized in the tail layout, flushed, and renamed into place (never
half-written)."""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import ENTRY_COLUMNS, SUFFIX, TAIL_ENTRIES

# Tags of the two footer fields: (13 << 3) | fixed64, (14 << 3) | fixed32.
_FOOTER = struct.Struct("<BQBI")
_TAIL_START_TAG = (pb.Dump.DESCRIPTOR.fields_by_name["tail_start"].number << 3) | 1
_OLDER_TAG = (pb.Dump.DESCRIPTOR.fields_by_name["older_entries"].number << 3) | 5


def _entries(entries: pb.Entries, lo: int, hi: int) -> bytes:
    """``Dump`` field 10 holding entries ``lo`` to ``hi`` (b"" when empty)."""
    if hi <= lo:
        return b""
    part = pb.Dump()
    part.entries.CopyFrom(entries)
    for name in ENTRY_COLUMNS:  # (slice deletion runs in C; building lists would not)
        column = getattr(part.entries, name)
        del column[hi:]
        del column[:lo]
    return part.SerializeToString()


def serialize(dump: pb.Dump, tail_entries: int = TAIL_ENTRIES) -> bytes:
    """The bytes of a dump file, in the tail layout of schema 1.3 (see ``proto/flightrec.proto``).

    The file is the same ``Dump`` message as a plain ``SerializeToString()`` to any protobuf
    parser, but its last part (header, groups, tables, threads and the newest
    ``tail_entries`` entries) is a dump of its own that the analyzer can read without the rest.

    Args:
        dump: the dump.
        tail_entries: entries to put in the tail section.

    Returns:
        The file's bytes.
    """
    entries = dump.entries
    n = len(entries.record_id)
    older = max(0, n - tail_entries)
    head = pb.Dump(
        magic=dump.magic, schema_major=dump.schema_major, schema_minor=dump.schema_minor
    ).SerializeToString()
    rest = pb.Dump()
    rest.CopyFrom(dump)
    for name in ("magic", "schema_major", "schema_minor", "entries", "tail_start", "older_entries"):
        rest.ClearField(name)  # type: ignore[arg-type]
    old = _entries(entries, 0, older)
    tail_start = len(head) + len(old)
    footer = _FOOTER.pack(_TAIL_START_TAG, tail_start, _OLDER_TAG, older)
    return b"".join((head, old, rest.SerializeToString(), _entries(entries, older, n), footer))


def write_dump(dump: pb.Dump, directory: str | Path, filename: str) -> Path:
    """Serialize ``dump`` (``serialize``) into ``directory/filename`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to disk, and the file
    is renamed into place, so a reader (or a kill -9 mid-write) sees the whole dump or none.

    Returns:
        The final path.

    Raises:
        OSError: the directory cannot be created or written (full disk, permissions).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = serialize(dump)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        final = directory / filename
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return final
