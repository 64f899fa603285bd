"""Writing a dump file: serialized whole, flushed, and renamed into place (never half-written)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import SUFFIX


def write_dump(dump: pb.Dump, directory: str | Path, filename: str) -> Path:
    """Serialize ``dump`` into ``directory/filename`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to disk, and the file
    is renamed into place, so a reader (or a kill -9 mid-write) sees the whole dump or none.

    Returns:
        The final path.

    Raises:
        OSError: the directory cannot be created or written (full disk, permissions).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = dump.SerializeToString()
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
