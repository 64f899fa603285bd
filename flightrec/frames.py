"""Which frames of a stack are the user's: shared by the summaries a rank publishes and the
analysis that reads them (both need "the line of code" a person wants to see).

A frame is library code when its file lies where a library is installed, never because a
folder on its path happens to be called ``torch`` or ``flightrec``: a clone of this repository
lives in ``flightrec/``, and a user's job may live in ``~/torch/``. Three sources say where:

* this process's own installation: flightrec's package folder, torch's (found without
  importing it: the analyzer runs without torch), and the standard library's folders;
* an installed package's place in any environment: ``site-packages/torch/...``,
  ``dist-packages/flightrec/...``, ``lib/python3.X/...`` outside ``site-packages``;
* a package's own layout, for source installs on another machine (torch built in
  ``~/pytorch``, flightrec on ``PYTHONPATH`` from a clone): ``torch/distributed/...`` or
  ``flightrec/recorder/...``, a folder the package has, below one named after it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

T = TypeVar("T")

_INSTALLED = re.compile(
    # Interpreter-made names (<frozen importlib._bootstrap>, <string>, our generated wrappers).
    r"(^<)"
    # The standard library of any environment: lib/python3.X/, except its site-packages.
    r"|/lib/python3\.\d+/(?!site-packages/|dist-packages/)"
    # Installed packages that are never the user's: torch, flightrec, the CLI's libraries, and
    # typing_extensions' ``deprecated`` wrapper, which torch puts around deprecated
    # collectives (``all_gather_into_tensor`` in torch 2.13).
    r"|/(site|dist)-packages/(torch|flightrec|flightrec_cli|typer|click|rich)/"
    r"|/(site|dist)-packages/typing_extensions\.py$"
)
_LAYOUT = re.compile(
    # torch or flightrec as a source tree: one of the package's own folders or modules right
    # below a folder named after it (a user's ``torch/train.py`` has none of these).
    r"(/|^)torch/(distributed|nn|autograd|utils|optim|cuda|fx|_dynamo|_inductor|_functorch"
    r"|multiprocessing|amp|testing|_C|_refs|_prims|_higher_order_ops|export|profiler)/"
    r"|(/|^)torch/(_tensor|_ops|functional|overrides|serialization|_jit_internal|__init__)\.py$"
    r"|(/|^)flightrec/(recorder|format|readers|analysis|report|live|simulate)/"
    r"|(/|^)flightrec/(_autostart|frames|errors|text|__init__)\.py$"
)


def _folder(path: str) -> str:
    return os.path.abspath(path).replace("\\", "/").rstrip("/") + "/"


@lru_cache(maxsize=1)
def _roots() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """This process's (package folders of flightrec and torch, standard library folders,
    site-packages folders), each ending in ``/``."""
    packages = {_folder(os.path.dirname(__file__))}
    try:  # where torch would be imported from, without importing it
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        packages.add(_folder(os.path.dirname(spec.origin)))
    paths = sysconfig.get_paths()
    stdlib = {_folder(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    site = {_folder(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    return tuple(packages), tuple(stdlib), tuple(site)


@lru_cache(maxsize=8192)  # a job's stacks name a few hundred files, asked about per entry
def is_library_file(file: str) -> bool:
    """True for files of torch, flightrec or the standard library rather than user code."""
    path = file.replace("\\", "/")
    if _INSTALLED.search(path) or _LAYOUT.search(path):
        return True
    packages, stdlib, site = _roots()
    if path.startswith(packages):
        return True
    return path.startswith(stdlib) and not path.startswith(site)


def keep_user_frames(frames: Sequence[T], files: Sequence[str], limit: int) -> list[T]:
    """At most ``limit`` of ``frames`` (innermost first), in order: the innermost one, then
    the user's frames, then the rest in order while room is left.

    A stack cut to its innermost frames alone loses the user's line under torch's (a DDP
    bucket all-reduce is six frames below ``loss.backward()``).
    """
    if len(frames) <= limit:
        return list(frames)
    keep = [0]
    keep += [i for i in range(1, len(frames)) if not is_library_file(files[i])][: limit - 1]
    rest = (i for i in range(1, len(frames)) if i not in keep)
    keep += [next(rest) for _ in range(limit - len(keep))]
    return [frames[i] for i in sorted(keep)]
