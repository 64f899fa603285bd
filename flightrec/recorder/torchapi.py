"""What the installed torch offers the recorder, found by asking it at start-up.

The recorder traces through torch.distributed's public functions, whose signatures it reads
when it wraps them (``hooks/specs.py``). A few things it does go further, into names and
layouts torch keeps private and changes between releases:

- the default group, read from ``distributed_c10d._world`` on a cache miss (else the public
  ``GroupMember.WORLD``);
- PyTorch's own Flight Recorder, read at dump time through ``_dump_fr_trace`` and watched
  through ``_dump_fr_trace_json`` (torch 2.15 keeps one recorder per backend and takes a
  ``backend`` argument; earlier releases keep one);
- the C hot path's fast paths: torch's tensor getters called through their type slots, and
  the tensor-memory reader (``hotpath/layout.py``), which needs ``DispatchKeySet.raw_repr``.

Each is decided here by what the installed torch has, never by a list of versions. The one
version check is a ceiling: a torch released after the newest one the project is tested on
(``NEWEST_TESTED``; the support matrix in docs/torch-versions.md) may have moved anything
private, so it is traced through the public API alone, with the fast paths and the merge of
torch's recorder off, and the job's log says so in one line.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

NEWEST_TESTED = (2, 15)
"""The newest torch release the tests and tools/torch_matrix.py ran on."""
OLDEST_TESTED = (2, 4)
"""The oldest torch release tools/torch_matrix.py runs on."""

_RELEASE = re.compile(r"(\d+)\.(\d+)")


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.15.0+cu132" -> (2, 15)); None if none."""
    m = _RELEASE.match(version)
    return (int(m[1]), int(m[2])) if m else None


@dataclass(frozen=True, slots=True)
class TorchAPI:
    """What the installed torch offers, probed once (``probe``)."""

    version: str
    newer_than_tested: bool
    """Released after ``NEWEST_TESTED``: only public names are used (``fast_paths`` False)."""
    world: bool
    """``distributed_c10d._world.default_pg`` is readable."""
    native_dump: bool
    """``_dump_fr_trace`` exists (PyTorch's recorder can be merged into dumps)."""
    native_backends: bool
    """``_dump_fr_trace`` takes ``backend=``: one recorder per backend (torch 2.15)."""
    raw_keys: bool
    """``DispatchKeySet.raw_repr`` exists (the tensor-memory reader can calibrate)."""

    @property
    def fast_paths(self) -> bool:
        """Whether the C path may use torch's internals (its getter cache and memory reader)."""
        return not self.newer_than_tested

    @property
    def merge_native(self) -> bool:
        """Whether PyTorch's recorder is read (private functions) and merged into dumps."""
        return self.native_dump and not self.newer_than_tested

    def notice(self) -> str:
        """The one line the job's log gets for a torch newer than tested, else ""."""
        if not self.newer_than_tested:
            return ""
        newest = ".".join(map(str, NEWEST_TESTED))
        return (
            f"flightrec: torch {self.version} is newer than the newest tested ({newest}): "
            "traced through torch.distributed's public API only (C fast paths and the merge "
            "of PyTorch's own recorder off)"
        )


def probe(version: str | None = None) -> TorchAPI:
    """Ask the installed torch (importing ``torch.distributed``); ``version`` overrides
    ``torch.__version__`` (tests). Never raises: a missing name is a missing capability."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    version = str(torch.__version__) if version is None else version
    release = release_of(version)
    world = _has(lambda: c10d._world.default_pg, default=True)
    dump = _native_dump()
    return TorchAPI(
        version=version,
        newer_than_tested=release is not None and release > NEWEST_TESTED,
        world=world,
        native_dump=dump is not None,
        native_backends=dump is not None and _takes(dump, "backend"),
        raw_keys=_has(lambda: torch._C.DispatchKeySet.raw_repr),
    )


def _has(get: Any, default: bool = False) -> bool:
    try:
        get()
    except AttributeError:
        return False
    except Exception:  # present, but raising for another reason (not initialized yet)
        return default
    return True


def _native_dump() -> Any:
    try:
        from torch._C import _distributed_c10d as native

        return getattr(native, "_dump_fr_trace", None)
    except Exception:
        return None


def _takes(func: Any, name: str) -> bool:
    """Whether ``func`` (a pybind11 function: its signature is in its docstring) takes
    ``name``."""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        doc = (getattr(func, "__doc__", "") or "").split("\n", 1)[0]
        return f"{name}:" in doc or f"{name} =" in doc
