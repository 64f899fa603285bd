"""Writing a dump file: serialized in the tail layout, flushed, and renamed into place (never
half-written)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import (
    FOOTER_LAYOUT,
    OLDER_ENTRIES_TAG,
    SUFFIX,
    TAIL_ENTRIES,
    TAIL_START_TAG,
)
from flightrec.format.wire import walk_fields

FILE_MODE = 0o666
"""Mode of new dump files before the umask: they follow it as any tool's files do (0644 under
the usual 022, group-readable on a shared filesystem under 002 or 027)."""
# Top-level fields that the tail layout places itself: the head, the entries, the footer.
_PLACED = frozenset(
    pb.Dump.DESCRIPTOR.fields_by_name[name].number
    for name in ("magic", "schema_major", "schema_minor", "entries", "tail_start", "older_entries")
)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


_ENTRIES = pb.Dump.DESCRIPTOR.fields_by_name["entries"].number
# Byte -> 1 where it ends a varint (below 0x80), else 0.
_ENDS = bytes(int(b < 0x80) for b in range(256))


def _cut(chunk: bytes, values: int) -> int:
    """Bytes of the first ``values`` values of a packed varint column (C-speed counts)."""
    ends = chunk.translate(_ENDS)
    n = ends.count(1)
    if n == len(chunk) or values == 0:  # one byte per value (most columns), or nothing
        return values
    # Values of one column are mostly of one width (clock readings): start where that puts
    # the cut, then step value by value to it.
    pos = len(chunk) * values // n
    counted = ends.count(1, 0, pos)
    while counted < values:
        pos = ends.index(1, pos) + 1
        counted += 1
    while counted > values:
        pos = ends.rindex(1, 0, pos)
        counted -= 1
    return ends.rindex(1, 0, pos) + 1  # right after the last value end in the prefix


def _split_entries(body: bytes, older: int) -> tuple[bytes, bytes]:
    """Dump fields 10 holding the first ``older`` entries and the rest, cut from the
    serialized ``Entries`` message ``body`` without parsing it (every column is packed)."""
    head: list[bytes] = []
    tail: list[bytes] = []
    for number, _, a, b, _ in walk_fields(body, 0, len(body)):
        chunk = body[a:b]
        cut = _cut(chunk, older)
        if cut:
            head.append(_field(number, chunk[:cut]))
        if cut < len(chunk):
            tail.append(_field(number, chunk[cut:]))
    old = _field(_ENTRIES, b"".join(head)) if head else b""
    return old, _field(_ENTRIES, b"".join(tail)) if tail else b""


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
    n = len(dump.entries.record_id)
    older = max(0, n - tail_entries)
    head = pb.Dump(
        magic=dump.magic, schema_major=dump.schema_major, schema_minor=dump.schema_minor
    ).SerializeToString()
    # Everything as protobuf writes it, cut out of one serialization of the whole: a few
    # dozen top-level fields to walk, and the entries split by a pattern over each packed
    # column (copying the message and deleting values costs five times more).
    whole = dump.SerializeToString()
    top = walk_fields(whole, 0, len(whole))
    rest = b"".join(whole[at:end] for number, _, _, end, at in top if number not in _PLACED)
    body = b"".join(whole[a:b] for number, _, a, b, _ in top if number == _ENTRIES)
    old, new = _split_entries(body, older) if n else (b"", b"")
    tail_start = len(head) + len(old)
    footer = FOOTER_LAYOUT.pack(TAIL_START_TAG, tail_start, OLDER_ENTRIES_TAG, older)
    return b"".join((head, old, rest, new, footer))


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
    fd, tmp = _create_temporary(directory)
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


def _create_temporary(directory: Path) -> tuple[int, Path]:
    """A new hidden file in ``directory`` for writing, ``FILE_MODE`` less the umask (what
    ``tempfile.mkstemp`` would create 0600: a dump only its owner could read)."""
    for _ in range(100):
        path = directory / f".tmp-{os.getpid()}-{secrets.token_hex(6)}{SUFFIX}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary name")
