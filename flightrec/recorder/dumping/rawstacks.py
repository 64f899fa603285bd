"""Raw Python stacks for when no Python code can run: faulthandler, armed in advance.

A thread holding the GIL inside a long C call (an extension that never releases it, a
``ctypes.PyDLL`` call) stops every other Python thread: the watchdog, the signal watcher and
the dump all need the GIL, so the rank writes no dump however it is asked. What can still be
captured is what ``faulthandler`` writes from its own C thread without the GIL: every Python
thread's stack (file, line, function; no thread names, no locals, no ring).

So the watchdog keeps ``faulthandler.dump_traceback_later`` armed, pushing the deadline
forward as it scans. While the watchdog runs, the deadline never comes; once no Python thread
has run for FLIGHTREC_TIMEOUT seconds, faulthandler writes the stacks into a file beside the
rank's black box (``stacks_path``), to be read with that black box (``attach``), which is all
the evidence such a rank leaves. This module imports neither torch nor the recorder: the
analyzer can use its reading half.

Limits: one ``dump_traceback_later`` exists per process, so a program that uses it itself
(pytest's ``faulthandler_timeout``) should set FLIGHTREC_RAW_STACKS=0.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
from pathlib import Path
from typing import IO

from flightrec.format.rawstacks import HEADER

MIN_TIMEOUT_S = 1.0
"""Never arm shorter: a busy machine can starve the watchdog thread for a moment."""


class RawStacks:
    """The armed faulthandler deadline of one process and the file it writes to."""

    def __init__(self, path: Path, timeout_s: float, main_ident: int) -> None:
        """Create the file (with a header naming the main thread) and arm the deadline.

        Raises:
            OSError: the file cannot be created.
        """
        self.path = path
        self.timeout_s = max(float(timeout_s), MIN_TIMEOUT_S)
        self._pid = os.getpid()
        # Append mode: faulthandler writes through the descriptor at its own offset.
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(f"{HEADER} pid={self._pid} main=0x{main_ident:x}\n")
        self._file.flush()
        self._header_size = self._file.tell()
        self._armed_ns = 0
        self.rearm(0)

    def rearm(self, now_ns: int) -> None:
        """Push the deadline to ``timeout`` from now (the watchdog calls this at every scan).

        Re-arming starts a new C thread, so it is done at most four times per timeout.
        """
        if self._file is None or os.getpid() != self._pid:
            return
        if self._armed_ns and now_ns - self._armed_ns < self.timeout_s * 1e9 / 4:
            return
        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self._file)
        self._armed_ns = now_ns or 1

    def close(self, keep: bool) -> None:
        """Disarm and close; delete the file unless ``keep`` and faulthandler wrote into it.

        Never called in a forked child: cancelling there would wait for a C thread that did
        not survive the fork.
        """
        if self._file is None or os.getpid() != self._pid:
            return
        faulthandler.cancel_dump_traceback_later()
        written = False
        with contextlib.suppress(OSError):
            written = os.path.getsize(self.path) > self._header_size
        self._file.close()
        self._file = None
        if not (keep and written):
            with contextlib.suppress(OSError):
                self.path.unlink()

    def pause(self) -> None:
        """Disarm just before ``fork()``.

        A child forked while the deadline is armed inherits faulthandler's state but not its
        C thread, and then hangs in its next ``dump_traceback_later`` or at interpreter exit,
        waiting for that thread (CPython keeps no fork handler for it).
        """
        if self._file is not None and self._armed_ns and os.getpid() == self._pid:
            faulthandler.cancel_dump_traceback_later()
            self._armed_ns = 0

    def resume(self, now_ns: int) -> None:
        """Re-arm in the parent after ``fork()``."""
        self.rearm(now_ns)

    def forget(self) -> None:
        """In a forked child: drop the parent's file (faulthandler was disarmed for the fork)."""
        self._file = None
