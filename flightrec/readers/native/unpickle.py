"""A pickle reader that can only build plain data: it never imports, calls or constructs anything.

PyTorch writes its Flight Recorder dumps with ``pickle``, and its own analyzer reads them back
with ``pickle.load``, which runs whatever callable the file names. A dump copied from a shared
file system is untrusted input, so this reader overrides the only two doors through which a
pickle reaches code: ``find_class`` (every GLOBAL, STACK_GLOBAL, INST and EXT opcode goes
through it, and REDUCE / BUILD / OBJ / NEWOBJ need a callable that only it can supply) and
``persistent_load``. Both refuse. What remains are the opcodes that build dicts, lists,
tuples, sets, strings, bytes, numbers, booleans and None, which is all a native dump holds.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import NoReturn

from flightrec.errors import CorruptDumpError, UnsafeDumpError


class _UnsafeGlobal(Exception):
    """Raised inside the unpickler; turned into UnsafeDumpError naming the file."""


class _PlainDataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` with every route to a global refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        # Why refuse everything rather than allow a list of "safe" globals: a native dump
        # needs none, and every allow-list in the wild (numpy, torch.storage, collections)
        # has had a bypass.
        raise _UnsafeGlobal(f"{module}.{name}")

    def persistent_load(self, pid: object) -> NoReturn:
        raise _UnsafeGlobal(f"persistent id {pid!r:.60}")


def load_plain_pickle(data: bytes, path: str | Path) -> object:
    """Unpickle ``data`` into plain containers and scalars, refusing every global.

    Args:
        data: the bytes of the whole file (the caller bounds its size).
        path: the file, for error messages.

    Returns:
        The unpickled object: dicts, lists, tuples, sets, str, bytes, int, float, bool, None.

    Raises:
        UnsafeDumpError: the pickle names a global (a class or function), which a genuine
            Flight Recorder dump never does; nothing it names is imported or called.
        CorruptDumpError: truncated or damaged pickle, or trailing garbage.
    """
    stream = io.BytesIO(data)
    try:
        obj = _PlainDataUnpickler(stream).load()
    except _UnsafeGlobal as exc:
        raise UnsafeDumpError(
            path,
            f"refusing to load: the pickle asks for {exc} (code, not data); "
            "a PyTorch Flight Recorder dump holds only plain data",
        ) from None
    except RecursionError:
        raise CorruptDumpError(
            path, "pickle nests too deeply to be a Flight Recorder dump"
        ) from None
    except MemoryError:
        raise CorruptDumpError(
            path, "pickle needs more memory than any Flight Recorder dump"
        ) from None
    except Exception as exc:
        raise CorruptDumpError(
            path, f"truncated or damaged pickle ({type(exc).__name__}: {exc})"
        ) from None
    if stream.read(1):
        raise CorruptDumpError(path, "trailing bytes after the pickle's STOP opcode")
    return obj
