"""The exception a rank dies of: seen where Python hands it over, recorded, then passed on.

Three places see an exception that ends a thread, and each is chained, never replaced:

* ``sys.excepthook``: an exception that ends the main thread (plain ``python``, torchrun).
* ``threading.excepthook``: one that ends another thread (the process may live on).
* ``sys.exit`` called with a failure status while an exception is being handled: how
  ``torch.multiprocessing.spawn`` ends a child whose function raised (it catches the
  exception, sends the traceback to the parent and calls ``sys.exit(1)``, so no excepthook
  runs), and how many training scripts end after logging an error.
* ``multiprocessing``'s exit function, called by ``Process._bootstrap`` in the ``finally:``
  around ``run()``: a plain ``multiprocessing.Process`` whose target raised prints the
  traceback itself and exits with status 1, so neither an excepthook nor ``sys.exit`` inside
  an ``except`` block sees it; the exception is still the one being raised there.

torchrun's error file (``TORCHELASTIC_ERROR_FILE``, written by ``@record``) is read at exit
when none of these saw anything. Every hook records plain values only (type, message, thread,
traceback frames) and never raises: whatever goes wrong, the previous hook still runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from flightrec.format.builder import FrameTuple
from flightrec.frames import is_own_file

log = logging.getLogger("flightrec")
MAX_MESSAGE_CHARS = 2000
"""An exception's message is cut here (a tensor printed into a message can be megabytes)."""
MAX_TRACEBACK_FRAMES = 64
"""Frames kept per traceback, the raising frame first."""
MAX_EXCEPTIONS = 16
"""Exceptions kept per process: a thread pool that fails in a loop must not grow the dumps."""


class RaisedException(NamedTuple):
    """One exception that reached the top of a thread, in plain values."""

    type: str
    message: str
    thread: str
    is_main: bool
    frames: list[FrameTuple]
    """The traceback, raising frame first, without flightrec's own frames."""
    wall_time_ns: int
    via: str


def type_name(exc_type: type[BaseException]) -> str:
    """``ValueError``; ``torch.distributed.DistBackendError`` outside the builtins."""
    module = getattr(exc_type, "__module__", "") or ""
    name = getattr(exc_type, "__qualname__", "") or exc_type.__name__
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def traceback_frames(tb: TracebackType | None) -> list[FrameTuple]:
    """A traceback's frames, raising frame first, flightrec's own frames left out."""
    frames: list[FrameTuple] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_own_file(code.co_filename):
            frames.append((code.co_filename, code.co_qualname, tb.tb_lineno or 0))
        tb = tb.tb_next
    frames.reverse()
    return frames[:MAX_TRACEBACK_FRAMES]


def describe(exc: BaseException, thread: threading.Thread | None, via: str) -> RaisedException:
    """The plain values of ``exc``, as it ends ``thread`` (None: the current thread)."""
    thread = thread or threading.current_thread()
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises: the type still says a lot
        message = "<message unavailable>"
    return RaisedException(
        type=type_name(type(exc)),
        message=message[:MAX_MESSAGE_CHARS],
        thread=thread.name,
        is_main=thread is threading.main_thread(),
        frames=traceback_frames(exc.__traceback__),
        wall_time_ns=time.time_ns(),
        via=via,
    )


_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>.*)$')


def from_error_file(path: str, since_ns: int) -> RaisedException | None:
    """The exception in torchrun's error file, when this process wrote it (after ``since_ns``).

    The file is what ``torch.distributed.elastic``'s ``@record`` writes: ``{"message":
    {"message": "ValueError: ...", "extraInfo": {"py_callstack": "Traceback ..."}}}``.
    """
    try:
        p = Path(path)
        if p.stat().st_mtime_ns < since_ns:
            return None  # an earlier attempt's file, not this process's
        data = json.loads(p.read_text(errors="replace")[:1_000_000])
        body = data["message"]
        if isinstance(body, str):
            text, stack = body, ""
        else:
            text = str(body.get("message", ""))
            stack = str((body.get("extraInfo") or {}).get("py_callstack", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    kind, _, message = text.partition(": ")
    frames: list[FrameTuple] = []
    for line in stack.splitlines():
        m = _FRAME_LINE.match(line)
        if m and not is_own_file(m["file"]):
            frames.append((m["file"], m["name"].strip(), int(m["line"])))
    frames.reverse()
    return RaisedException(
        type=kind.strip() or "Exception",
        message=message[:MAX_MESSAGE_CHARS],
        thread="MainThread",
        is_main=True,
        frames=frames[:MAX_TRACEBACK_FRAMES],
        wall_time_ns=time.time_ns(),
        via="torchelastic error file",
    )


class ExceptionHooks:
    """Installs the chained hooks; ``on_exception`` gets each exception's plain values."""

    def __init__(self, on_exception: Callable[[RaisedException], None]) -> None:
        self._on_exception = on_exception
        self._prev_sys: Callable[..., Any] | None = None
        self._prev_threading: Callable[..., Any] | None = None
        self._prev_exit: Callable[..., Any] | None = None
        self._prev_mp_exit: Callable[..., Any] | None = None
        self._prev_print_exc: Callable[..., Any] | None = None
        self.installed = False

    def install(self) -> None:
        """Chain ``sys.excepthook``, ``threading.excepthook`` and ``sys.exit`` (idempotent)."""
        if self.installed:
            return
        self._prev_sys, sys.excepthook = sys.excepthook, self._sys_hook
        self._prev_threading, threading.excepthook = threading.excepthook, self._thread_hook
        self._prev_exit, sys.exit = sys.exit, self._exit  # type: ignore[assignment]
        import multiprocessing.util as mp_util

        # Not in typeshed: looked up by name when Process._bootstrap calls it.
        self._prev_mp_exit = getattr(mp_util, "_exit_function", None)
        if self._prev_mp_exit is not None:
            setattr(mp_util, "_exit_function", self._mp_exit)  # noqa: B010
        if not _bootstrap_calls_exit_function():
            # Python 3.12 and later: Process._bootstrap no longer calls the exit function
            # while run()'s exception is in flight; it prints it with traceback.print_exc()
            # from its ``except:``, where the exception is still the one being handled.
            import traceback

            self._prev_print_exc, traceback.print_exc = traceback.print_exc, self._mp_print_exc
        self.installed = True

    def uninstall(self) -> None:
        """Put the previous hooks back where ours are still in place."""
        if not self.installed:
            return
        if sys.excepthook == self._sys_hook and self._prev_sys is not None:
            sys.excepthook = self._prev_sys
        if threading.excepthook == self._thread_hook and self._prev_threading is not None:
            threading.excepthook = self._prev_threading
        if sys.exit == self._exit and self._prev_exit is not None:
            sys.exit = self._prev_exit
        import multiprocessing.util as mp_util

        if getattr(mp_util, "_exit_function", None) == self._mp_exit and self._prev_mp_exit:
            setattr(mp_util, "_exit_function", self._prev_mp_exit)  # noqa: B010
        import traceback

        if traceback.print_exc == self._mp_print_exc and self._prev_print_exc is not None:
            traceback.print_exc = self._prev_print_exc
        self.installed = False

    def _record(self, exc: BaseException | None, thread: threading.Thread | None, via: str) -> None:
        if exc is None or isinstance(exc, SystemExit):
            return
        try:
            self._on_exception(describe(exc, thread, via))
        except Exception as err:  # never instead of the previous hook
            log.warning("flightrec: could not record an uncaught exception: %s", err)

    def _sys_hook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        self._record(exc, threading.main_thread(), "sys.excepthook")
        prev = self._prev_sys or sys.__excepthook__
        prev(kind, exc, tb)

    def _thread_hook(self, args: Any) -> None:
        self._record(args.exc_value, args.thread, "threading.excepthook")
        prev = self._prev_threading or threading.__excepthook__
        prev(args)

    def _exit(self, status: object = None) -> None:
        # Only a failure exit from inside an ``except`` block: the exception being handled is
        # what the process dies of (torch.multiprocessing.spawn's children end this way).
        try:
            failed = status is not None and status != 0
            if failed and threading.current_thread() is threading.main_thread():
                exc = sys.exc_info()[1]
                if isinstance(exc, Exception):
                    self._record(exc, None, "sys.exit")
        except Exception:  # a status whose comparison raises: exit as asked, unrecorded
            pass
        if self._prev_exit is None:
            raise SystemExit(status)
        self._prev_exit(status)

    def _mp_exit(self, *args: Any, **kwargs: Any) -> Any:
        # Process._bootstrap calls this in the ``finally:`` around ``self.run()``: an exception
        # on its way out of run() is the one being handled there (the main thread's: run()
        # runs on it). Called from anywhere else (atexit in a parent), it only passes on.
        try:
            caller = sys._getframe(1).f_code
            if (
                caller is _bootstrap_code()
                and threading.current_thread() is threading.main_thread()
            ):
                self._record(sys.exc_info()[1], None, "multiprocessing.Process")
        except Exception:  # never instead of multiprocessing's own exit
            pass
        prev = self._prev_mp_exit
        if prev is None:
            return None
        return prev(*args, **kwargs)

    def _mp_print_exc(self, *args: Any, **kwargs: Any) -> Any:
        # Process._bootstrap (3.12 and later) prints run()'s exception from its ``except:``:
        # that exception is the one being handled. From anywhere else it only passes on.
        try:
            caller = sys._getframe(1).f_code
            if (
                caller is _bootstrap_code()
                and threading.current_thread() is threading.main_thread()
            ):
                self._record(sys.exc_info()[1], None, "multiprocessing.Process")
        except Exception:  # never instead of the traceback multiprocessing prints
            pass
        prev = self._prev_print_exc
        if prev is None:
            return None
        return prev(*args, **kwargs)


def _bootstrap_calls_exit_function() -> bool:
    """Whether ``Process._bootstrap`` calls ``util._exit_function`` itself (up to 3.11)."""
    code = _bootstrap_code()
    return code is not None and "_exit_function" in code.co_names


def _bootstrap_code() -> Any:
    """The code of ``multiprocessing``'s ``BaseProcess._bootstrap`` (None if it has none)."""
    import multiprocessing.process as mp_process

    return getattr(getattr(mp_process.BaseProcess, "_bootstrap", None), "__code__", None)


def error_file() -> str:
    """torchrun's error file for this worker, or "" when none is configured."""
    return os.environ.get("TORCHELASTIC_ERROR_FILE", "")
