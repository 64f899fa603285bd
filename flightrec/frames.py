"""Which frames of a stack are the user's: the one owner of frame rules.

Every part that shows "the line of code" asks here: the recorder (which frames are its own,
the origin of each frame it writes into a dump, the frames a summary in the job's log keeps),
the readers and the analysis (the verdict's line, the call the user made into a framework),
and the renderers (which frames of a stack are marked as the user's).

A frame has one of three origins (``FrameOrigin``):

* ``CORE``: torch, flightrec and the standard library, and names the interpreter makes up
  (``<frozen importlib._bootstrap>``, flightrec's generated wrappers);
* ``FRAMEWORK``: any other installed package (Lightning, accelerate, transformers, Ray,
  DeepSpeed, ...): a file below a ``site-packages`` or ``dist-packages`` folder, below one of
  the interpreter's prefixes, or in an editable install that is not the user's working tree;
* ``USER``: everything else: the training script and the code beside it.

The recording process decides, at dump time, with what only it knows (``Roots``: its
prefixes, site folders, editable installs, working folder and main script) and writes the
answer into the dump (``Frame.origin``, schema 1.6), so a dump analyzed on another machine
keeps its verdict. A frame without a recorded origin (an older dump, a native one) is judged
where it is read, from its path alone: the folders of this process's own installation, the
names installed packages have anywhere (``site-packages/...``, ``lib/python3.X/...``), and
torch's and flightrec's own package layouts for source installs (``torch/distributed/...``).
A folder's name alone never makes a file library code: a clone of this repository lives in
``flightrec/``, and a user's job may live in ``~/torch/``.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import json
import os
import re
import site
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar
from urllib.parse import unquote, urlparse

T = TypeVar("T")


class FrameOrigin(enum.IntEnum):
    """Whose code a frame runs; the values are those of the schema's ``FrameOrigin``."""

    UNKNOWN = 0
    """Not recorded (a dump older than schema 1.6, a native dump): judged from the path."""
    USER = 1
    """The user's own code."""
    FRAMEWORK = 2
    """An installed package other than torch and flightrec: a framework or a library."""
    CORE = 3
    """torch, flightrec, the standard library, or a name the interpreter made up."""


# -- flightrec's own frames (the hot path asks is_own_file: two string prefix tests) ------------
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""flightrec's package folder in this process (this file is flightrec/frames.py)."""
_WRAPPER = "<flightrec "
"""The file name of the wrappers flightrec compiles around torch's collectives."""
_OWN_LAYOUT = re.compile(r"^<flightrec |/flightrec/(recorder|format|readers)/[^/]+\.py$")
"""flightrec's recorder in a dump from elsewhere (older versions left its frames in thread
stacks). Narrow on purpose: a user's checkout in a folder named flightrec must not match."""
_THREADING = re.compile(r"/lib/python3\.\d+/threading\.py$")
_THREADING_FILE = threading.__file__


def is_own_file(file: str) -> bool:
    """Whether ``file`` is flightrec's own code in this process (its package, or a wrapper).

    On the hot path (where a captured stack starts): two prefix tests, nothing more.
    """
    return file.startswith(_PACKAGE_DIR) or file.startswith(_WRAPPER)


def _own_or_threading(file: str) -> tuple[bool, bool]:
    if is_own_file(file) or _OWN_LAYOUT.search(file.replace("\\", "/")):
        return True, False
    return False, file == _THREADING_FILE or bool(_THREADING.search(file.replace("\\", "/")))


def without_own_frames(frames: Sequence[T], files: Sequence[str], own_thread: bool) -> list[T]:
    """``frames`` without the innermost ones flightrec itself put on a thread's stack.

    A thread caught by a dump may be inside flightrec's signal handler (SIGTERM waits there
    for the dump to finish) with the stdlib ``threading`` calls it made on top, or be the
    thread writing the dump (the exit dump runs on the main thread, from ``atexit``, after the
    program returned). Those frames say nothing about the program. Only a leading run of
    flightrec and ``threading`` frames goes; torch frames inside a traced collective stay.

    Args:
        frames: a thread's stack, innermost first.
        files: the file of each frame.
        own_thread: the thread is flightrec's (the watchdog): a stack of nothing but
            flightrec's frames is kept. Else such a stack becomes empty: the program has no
            frame there (at exit, it returned from main).
    """
    cut = 0
    for i, file in enumerate(files):
        own, threading_call = _own_or_threading(file)
        if own:
            cut = i + 1
        elif not threading_call:
            return list(frames[cut:])
    return list(frames) if own_thread or not cut else []


# -- where libraries live ------------------------------------------------------------------------
_CORE_PATH = re.compile(
    # Interpreter-made names (<frozen importlib._bootstrap>, <string>, our generated wrappers).
    r"(^<)"
    # The standard library of any environment: lib/python3.X/, except its site-packages.
    r"|/lib/python3\.\d+/(?!site-packages/|dist-packages/)"
    # torch and flightrec as installed packages, and typing_extensions' ``deprecated``
    # wrapper, which torch puts around deprecated collectives (all_gather_into_tensor).
    r"|/(site|dist)-packages/(torch|flightrec|flightrec_cli)/"
    r"|/(site|dist)-packages/typing_extensions\.py$"
    # torch or flightrec as a source tree: one of the package's own folders or modules right
    # below a folder named after it (a user's ``torch/train.py`` has none of these).
    r"|(/|^)torch/(distributed|nn|autograd|utils|optim|cuda|fx|_dynamo|_inductor|_functorch"
    r"|multiprocessing|amp|testing|_C|_refs|_prims|_higher_order_ops|export|profiler)/"
    r"|(/|^)torch/(_tensor|_ops|functional|overrides|serialization|_jit_internal|__init__)\.py$"
    r"|(/|^)flightrec/(recorder|format|readers|analysis|report|live|simulate)/"
    r"|(/|^)flightrec/(_autostart|frames|errors|text|__init__)\.py$"
)
_INSTALLED_PATH = re.compile(r"/(site|dist)-packages/")
"""Any other installed package, in any environment."""


def _folder(path: str) -> str:
    return os.path.abspath(path).replace("\\", "/").rstrip("/") + "/"


def _longest(path: str, roots: tuple[str, ...]) -> int:
    return max((len(r) for r in roots if path.startswith(r)), default=0)


@dataclass(frozen=True)
class Roots:
    """The folders that decide a frame's origin in one process, each ending in ``/``.

    Attributes:
        core: flightrec's and torch's package folders, the standard library's folders.
        installed: where packages are installed: site folders, the interpreter's prefixes
            (``sys.prefix``, ``base_prefix``, ``exec_prefix``...), editable installs of
            frameworks.
        user: the user's working tree: the working folder and the main script's folder. A
            file below both a user folder and an installed one belongs to the deeper one (a
            job in ``/usr/local/app`` under ``/usr``; a virtual environment inside the
            project's folder).
    """

    core: tuple[str, ...] = ()
    installed: tuple[str, ...] = ()
    user: tuple[str, ...] = ()

    def origin(self, file: str) -> FrameOrigin:
        """The origin of ``file``: by the names installed files have anywhere, then by the
        deepest of these folders that holds it (a venv's ``lib/python3.X/`` holds its
        ``site-packages/``, which holds torch's package folder)."""
        path = file.replace("\\", "/")
        if _CORE_PATH.search(path):
            return FrameOrigin.CORE
        core = _longest(path, self.core)
        installed = _longest(path, self.installed)
        user = _longest(path, self.user)
        if core and core >= installed and core >= user:
            return FrameOrigin.CORE
        if installed > user:
            return FrameOrigin.FRAMEWORK
        if user:
            return FrameOrigin.USER
        return FrameOrigin.FRAMEWORK if _INSTALLED_PATH.search(path) else FrameOrigin.USER


def _editable_roots() -> list[str]:
    """The project folders of this environment's editable installs (PEP 610's
    ``direct_url.json`` with ``dir_info.editable``)."""
    from importlib import metadata

    out: list[str] = []
    for dist in metadata.distributions():
        try:
            text = dist.read_text("direct_url.json")
            if not text:
                continue
            info = json.loads(text)
            if not info.get("dir_info", {}).get("editable"):
                continue
            url = urlparse(str(info.get("url", "")))
        except (OSError, ValueError, AttributeError, UnicodeDecodeError):
            continue  # a damaged record says nothing about where code lives
        if url.scheme == "file" and url.path:
            out.append(unquote(url.path))
    return out


def _inside(a: str, b: str) -> bool:
    return a.startswith(b) or b.startswith(a)


def roots_of_this_process(editable: Callable[[], list[str]] = _editable_roots) -> Roots:
    """This process's ``Roots``: where it imports libraries from, and where its user is.

    Args:
        editable: lists the folders of editable installs (a test gives its own).
    """
    core = {_PACKAGE_DIR.replace("\\", "/")}
    try:  # where torch would be imported from, without importing it (the analyzer has none)
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        core.add(_folder(os.path.dirname(spec.origin)))
    paths = sysconfig.get_paths()
    core |= {_folder(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    installed = {_folder(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    installed |= {_folder(p) for p in prefixes if p}
    try:
        installed |= {_folder(p) for p in site.getsitepackages()}
        installed.add(_folder(site.getusersitepackages()))
    except (AttributeError, OSError):  # an embedded interpreter's site module may lack them
        pass
    installed.discard("/")
    user: set[str] = set()
    with contextlib.suppress(OSError):  # the working folder may have been deleted
        user.add(_folder(os.getcwd()))
    script = sys.argv[0] if sys.argv else ""
    if script and os.path.isfile(script):
        folder = _folder(os.path.dirname(script))
        # A launcher's own script (Ray's default_worker.py) is not the user's working tree.
        if not folder.startswith(tuple(installed)) or _longest(folder, tuple(user)):
            user.add(folder)
    user.discard("/")
    # An editable install is a framework's unless it is the user's working tree (or inside
    # it, or holds it): a user developing their own package edits it there.
    for path in editable():
        folder = _folder(path)
        if folder != "/" and not any(_inside(folder, u) for u in user):
            installed.add(folder)
    return Roots(tuple(sorted(core)), tuple(sorted(installed)), tuple(sorted(user)))


@lru_cache(maxsize=1)
def _here() -> Roots:
    return roots_of_this_process()


@lru_cache(maxsize=8192)  # a job's stacks name a few hundred files, asked about per frame
def origin_of(file: str) -> FrameOrigin:
    """The origin of ``file`` as this process sees it (``Roots`` of this process).

    The recorder writes it into its dumps; the analysis uses it for frames whose dump does
    not say (its answer then rests on the path's shape more than on this process's folders).
    """
    return _here().origin(file)


def is_library_file(file: str) -> bool:
    """True for files of torch, flightrec, the standard library or any installed package."""
    return origin_of(file) is not FrameOrigin.USER


# -- the user's line and the call the user made --------------------------------------------------
def user_index(origins: Sequence[FrameOrigin]) -> int | None:
    """Index of the innermost user frame of a stack (innermost first); None when it has none."""
    for i, origin in enumerate(origins):
        if origin is FrameOrigin.USER:
            return i
    return None


def fallback_index(origins: Sequence[FrameOrigin]) -> int | None:
    """Where a stack without user frames is shown: its innermost framework frame (the
    framework's call into torch), else its innermost frame; None for an empty stack."""
    for i, origin in enumerate(origins):
        if origin is FrameOrigin.FRAMEWORK:
            return i
    return 0 if origins else None


def called_index(origins: Sequence[FrameOrigin], functions: Sequence[str], user: int) -> int | None:
    """The framework function that the user frame at ``user`` called, when it called one:
    the frame just inside it, or, where that is a decorator's wrapper (a function defined in
    another, ``timed_op.<locals>.log_wrapper``), the function it wraps. None when the user's
    call went straight to torch (its op names it)."""
    i = user - 1
    if i < 0 or origins[i] is not FrameOrigin.FRAMEWORK:
        return None
    while i > 0 and "<locals>" in functions[i] and origins[i - 1] is FrameOrigin.FRAMEWORK:
        i -= 1
    return i


def call_name(file: str, function: str) -> str:
    """How a framework's function is named in a verdict: a method by its class
    (``Accelerator.gather``), a plain function by its module's package as users import it
    (``deepspeed.comm.all_reduce`` for ``site-packages/deepspeed/comm/comm.py``)."""
    function = function.rsplit("<locals>.", 1)[-1]
    if "." in function:
        return function
    path = file.replace("\\", "/")
    m = _INSTALLED_PATH.search(path)
    if m is None:
        return function
    parts = path[m.end() :].removesuffix(".py").split("/")
    if parts[-1] == "__init__" or (len(parts) > 1 and parts[-1] == parts[-2]):
        parts.pop()  # deepspeed/comm/comm.py: users write deepspeed.comm
    return ".".join([*parts, function])


def keep_user_frames(
    frames: Sequence[T], origins: Sequence[FrameOrigin], functions: Sequence[str], limit: int
) -> list[T]:
    """At most ``limit`` of ``frames`` (innermost first), in order: the innermost one, the
    framework call the first user frame made (``called_index``), then the user's frames,
    then the rest in order while room is left.

    A stack cut to its innermost frames alone loses the user's line under torch's (a DDP
    bucket all-reduce is six frames below ``loss.backward()``).
    """
    if len(frames) <= limit:
        return list(frames)
    keep = [0]
    first = user_index(origins)
    called = None if first is None else called_index(origins, functions, first)
    if called and limit > 2:
        keep.append(called)
    keep += [i for i in range(1, len(frames)) if origins[i] is FrameOrigin.USER][
        : max(0, limit - len(keep))
    ]
    rest = (i for i in range(1, len(frames)) if i not in keep)
    keep += [next(rest) for _ in range(limit - len(keep))]
    return [frames[i] for i in sorted(keep)]
