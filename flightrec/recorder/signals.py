"""SIGUSR1 and SIGTERM: dump promptly even while the main thread is stuck in a collective.

A Python signal handler only runs when the main thread gets back to bytecode, which a rank
blocked inside a hung gloo or NCCL call may never do. So the handlers are paired with
``signal.set_wakeup_fd``: the C-level handler writes the signal number to a pipe at once, and
a watcher thread reading that pipe writes the dump. The Python handler, whenever it runs,
then chains to whatever was installed before us. For SIGTERM with no previous handler the
watcher performs the default action itself after dumping, so a hung rank still dies on SIGTERM
as it would without flightrec.

When the process already uses a wakeup fd (asyncio does), we leave it alone and dump from the
Python handler instead (on a helper thread, so a handler that interrupted the hot path can
never deadlock on the recorder's locks).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("flightrec")
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
TERM_GRACE_S = 10.0
"""How long SIGTERM handling waits for the dump before the previous action proceeds."""


def _die_by_default(signum: int) -> None:
    """Perform a signal's default action from any thread (``signal.signal`` is main-thread only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is the null handler
        os.kill(os.getpid(), signum)
    except Exception:
        pass
    os._exit(128 + signum)


class SignalHandlers:
    """Installed once per process, from the main thread."""

    def __init__(self, dump: Callable[[int], None]) -> None:
        """``dump(signum)`` writes one dump for the signal; it must not raise."""
        self._dump = dump
        self._previous: dict[int, Any] = {}
        self._done: dict[int, threading.Event] = {int(s): threading.Event() for s in SIGNALS}
        self._read_fd = self._write_fd = -1
        self.uses_wakeup_fd = False
        self.installed = False

    def install(self) -> bool:
        """Install the handlers; False (and nothing changed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread() or self.installed:
            return False
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if old != -1:  # someone else's wakeup fd: keep theirs
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
        else:
            self._read_fd, self._write_fd = r, w
            self.uses_wakeup_fd = True
            threading.Thread(target=self._watch, name="flightrec-signals", daemon=True).start()
        for s in SIGNALS:
            self._previous[s] = signal.getsignal(s)
            signal.signal(s, self._handler)
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Put back the previous handlers where ours are still installed (main thread only)."""
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return
        for s, prev in self._previous.items():
            if signal.getsignal(s) == self._handler:
                signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        if self.uses_wakeup_fd:
            current = signal.set_wakeup_fd(-1)
            if current != self._write_fd:
                signal.set_wakeup_fd(current)
        self.installed = False

    def after_fork_in_child(self) -> None:
        """In a ``fork()``ed child: give the signals back to what was there before us.

        The child inherits our handlers and our wakeup pipe, but not the watcher thread: a
        signal sent to the child would be written into the parent's pipe (and the parent
        would dump, or die of the child's SIGTERM), while the child itself waited in vain.
        A forked child is not traced, so it gets the previous handlers and no wakeup fd.
        """
        if not self.installed:
            return
        with contextlib.suppress(Exception):  # signal calls need the main thread
            if self.uses_wakeup_fd and signal.set_wakeup_fd(-1) != self._write_fd:
                signal.set_wakeup_fd(self._write_fd)  # someone else's since: leave it
        for s, prev in self._previous.items():
            with contextlib.suppress(Exception):
                if signal.getsignal(s) == self._handler:
                    signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._write_fd = -1
        self.uses_wakeup_fd = False
        self.installed = False

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in self._done:
                    continue  # another signal with a Python handler (SIGINT, ...)
                self._done[signum].clear()
                self._dump(signum)
                self._done[signum].set()
                if signum == signal.SIGTERM and self._previous.get(signum) in (
                    signal.SIG_DFL,
                    None,
                ):
                    _die_by_default(signum)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.uses_wakeup_fd:
            self._done[signum].wait(TERM_GRACE_S if signum == signal.SIGTERM else 0)
        else:
            t = threading.Thread(
                target=self._dump, args=(signum,), name="flightrec-signal-dump", daemon=True
            )
            t.start()
            if signum == signal.SIGTERM:
                t.join(TERM_GRACE_S)
        prev = self._previous.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGTERM and prev in (signal.SIG_DFL, None):
            with contextlib.suppress(Exception):
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
