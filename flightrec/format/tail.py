"""Reading only the end of a dump file: the newest entries with everything else of the dump.

A schema 1.3 file ends with a tail section (header, groups, interned tables, threads,
exceptions and the newest ``TAIL_ENTRIES`` entries) and a 14-byte footer saying where that
section starts (see the "tail layout" in ``proto/flightrec.proto``). Joined behind the file's
first bytes (magic and version), the section is a valid dump of its own, which
``flightrec.format.wire.read_compact`` reads and validates like any file. What this saves at
131,072 ranks: about 12 KB read and parsed per rank instead of 75 KB.

Anything unusual (an older schema without the footer, a footer that points nowhere, a file
that changes while read) returns None: the caller reads the whole file, which reports damage
precisely.
"""

from __future__ import annotations

import os

from flightrec.format.schema import (
    FOOTER,
    FOOTER_LAYOUT,
    MAGIC_PREFIX,
    MAX_DUMP_BYTES,
    OLDER_ENTRIES_TAG,
    TAIL_START_TAG,
)
from flightrec.format.view import DumpView
from flightrec.format.wire import read_compact

# Fields before the first entries (magic, schema_major, schema_minor): always in these bytes.
_HEAD_FIELDS = (1, 2, 3)
# One read covers the tail section of nearly every file (about 11 KB with 2,000-entry rings).
_GUESS = 32 * 1024


def _head_length(head: bytes) -> int | None:
    """Bytes of the leading magic and version fields, or None when they are not plain."""
    i = 0
    while i < len(head):
        tag = head[i]
        number, wire = tag >> 3, tag & 7
        if number not in _HEAD_FIELDS:
            return i
        if wire == 2:  # the magic: one-byte length
            if i + 1 >= len(head) or head[i + 1] >= 0x80:
                return None
            i += 2 + head[i + 1]
        elif wire == 0:  # a version number: a varint
            i += 1
            while i < len(head) and head[i] >= 0x80:
                i += 1
            i += 1
        else:
            return None
    return None


def read_tail(path: str) -> DumpView | None:
    """The dump at ``path`` with only the entries of its tail section.

    Args:
        path: a dump file.

    Returns:
        The view (``older`` entries left out), or None when the file has no usable tail
        section: read it whole instead.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_DUMP_BYTES or size < len(MAGIC_PREFIX) + FOOTER:
            return None
        start = max(0, size - _GUESS)
        f.seek(start)
        end = f.read()
        if len(end) != size - start:
            return None  # changed while read
        tag, tail_start, older_tag, older = FOOTER_LAYOUT.unpack_from(end, len(end) - FOOTER)
        if tag != TAIL_START_TAG or older_tag != OLDER_ENTRIES_TAG or tail_start >= size - FOOTER:
            return None
        if start == 0:
            head = end
        else:
            f.seek(0)
            head = f.read(64)
        head_len = _head_length(head[:64])
        if not head.startswith(MAGIC_PREFIX) or head_len is None or tail_start < head_len:
            return None
        if (older > 0) != (tail_start > head_len):
            return None  # older entries without their bytes, or bytes without entries
        if tail_start < start:
            f.seek(tail_start)
            section = f.read(size - tail_start)
        else:
            section = end[tail_start - start :]
    if len(section) != size - tail_start:
        return None
    return read_compact(head[:head_len] + section, path, older)
