"""Every file format flightrec reads, behind two calls.

``read_views(path)`` gives the analysis one ``DumpView`` per rank the file holds, whatever the
format: a flightrec dump, a black box (with the raw stacks faulthandler left beside it), or a
PyTorch native Flight Recorder dump (pickle or JSON). ``read_any(path)`` gives the same as
parsed ``pb.Dump`` messages, for ``flightrec show`` and conversion. Both validate what they
return with the one validator (``flightrec.format.read.validate``) and raise ``DumpError``
naming the file in one line. ``discover`` lists the files of a folder worth trying.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import TABLES_SUFFIX
from flightrec.format.read import has_magic, read_dump, validate
from flightrec.format.schema import MAGIC_PREFIX, MAX_DUMP_BYTES, SUFFIX
from flightrec.format.tail import read_tail
from flightrec.format.view import DumpView
from flightrec.format.wire import read_compact
from flightrec.readers import native
from flightrec.readers.blackbox import is_blackbox, read_blackbox
from flightrec.readers.native.view import read_native_view
from flightrec.readers.rawstacks import attach as attach_raw_stacks

__all__ = ["discover", "looks_like_dump", "read_any", "read_views"]


def read_any(path: str | Path) -> pb.Dump | list[pb.Dump]:
    """Read one file in any format flightrec understands, as parsed protobuf.

    Args:
        path: a flightrec dump, a black box, or a PyTorch native Flight Recorder dump.

    Returns:
        The dump (a native file may convert to several, one per rank).

    Raises:
        DumpError: (a subclass) naming the file and the problem in one line.
    """
    if has_magic(path):
        return read_dump(path)
    # Other formats convert into the schema; the converted dump gets the same checks as a
    # file of ours, so the analysis can rely on them whatever the source.
    if is_blackbox(path):
        dump = read_blackbox(path)
        # The thread stacks faulthandler wrote beside it if the process's Python stopped.
        attach_raw_stacks(dump, path)
        validate(dump, path)
        return dump
    if native.sniff(path):
        result = native.read_native(path)
        dumps = [result] if isinstance(result, pb.Dump) else list(result)
        for dump in dumps:
            validate(dump, path)
        return dumps[0] if isinstance(result, pb.Dump) else dumps
    # Let the flightrec reader produce its precise message (empty file, no magic, unreadable).
    return read_dump(path)


def _read_flightrec_compact(file: Path) -> DumpView | None:
    """A flightrec dump read straight into its view (``format.wire``); None otherwise."""
    try:
        if file.stat().st_size > MAX_DUMP_BYTES:
            return None
        with open(file, "rb") as f:
            if f.read(len(MAGIC_PREFIX)) != MAGIC_PREFIX:
                return None
            f.seek(0)
            data = f.read()
    except OSError:
        return None  # the ordinary reader says why
    return read_compact(data, str(file))


def read_views(path: str | Path, tail: bool = False) -> list[DumpView]:
    """Read one file in any format into the analysis's view, one per rank it holds.

    The fast paths (``format.wire`` for flightrec dumps, ``native.view`` for native ones) go
    straight from bytes to columns; anything they decline is read by ``read_any``, which
    reports damage precisely.

    Args:
        path: the file.
        tail: of a flightrec dump with a tail section (schema 1.3), read only that: the
            view holds the newest entries and says how many it left out (``older``).
            Other files are read whole.

    Raises:
        DumpError: (a subclass) naming the file and the problem in one line.
        OSError: the file cannot be read.
    """
    if tail:
        end = read_tail(os.fspath(path))
        if end is not None:
            return [end]
    file = Path(path)
    fast = _read_flightrec_compact(file)
    if fast is not None:
        return [fast]
    if native.sniff(file):
        return [read_native_view(file)]
    result = read_any(file)
    return [DumpView.of(d) for d in (result if isinstance(result, list) else [result])]


def looks_like_dump(path: Path) -> bool:
    """Whether a file that failed to read deserves a complaint rather than silence: its name
    says it is a dump, or its content says it is a native one (whatever its name)."""
    name = path.name.lower()
    return name.endswith(SUFFIX) or "flightrec" in name or "trace" in name or native.sniff(path)


def discover(root: Path) -> Iterator[str]:
    """Every regular file under ``root`` (recursively, sorted), skipping temporaries.

    Paths come back as strings, from ``os.scandir``, whose entries know their type without a
    ``stat`` call: at 16,384 files, a ``Path`` and a ``stat`` per file cost about a second.
    Symbolic links to folders are not followed (as ``os.walk`` does not).
    """
    if root.is_file():
        yield os.fspath(root)
        return
    yield from _walk(os.fspath(root))


def _walk(folder: str) -> Iterator[str]:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return  # (an unreadable folder holds nothing to analyse, as with os.walk)
    below: list[str] = []
    for entry in entries:
        name = entry.name
        # Temporaries of an atomic write in progress, editor droppings, hidden files.
        if name.startswith("."):
            continue
        try:
            if entry.is_dir():
                if not entry.is_symlink():
                    below.append(entry.path)
                continue
            if name.endswith(TABLES_SUFFIX):
                continue  # (a black box's tables are read with its .ring file)
            if entry.is_file():
                yield entry.path
        except OSError:
            continue
    for sub in below:
        yield from _walk(sub)
