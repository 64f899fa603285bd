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
import re
from pathlib import Path
from typing import IO, NamedTuple

from flightrec.proto import flightrec_pb2 as pb

SUFFIX = ".stacks"


def stacks_path(ring_path: str | Path) -> Path:
    """Where the raw stacks of the black box ``ring_path`` go: ``.<ring name>.stacks``.

    Hidden, like the black box's other companions, so that a folder scan never mistakes it
    for a dump; it is read through its black box.
    """
    ring = Path(ring_path)
    return ring.with_name(f".{ring.name}{SUFFIX}")


HEADER = "# flightrec raw stacks"
MIN_TIMEOUT_S = 1.0
"""Never arm shorter: a busy machine can starve the watchdog thread for a moment."""
MAX_READ_BYTES = 1 << 20
"""A stacks file is a few KB; reading stops here whatever the file claims."""

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_MAIN = re.compile(r"\bmain=(0x[0-9a-fA-F]+)\b")


class RawThread(NamedTuple):
    """One thread's stack as faulthandler wrote it."""

    ident: int
    frames: tuple[tuple[str, int, str], ...]
    """(file, line, function), innermost first."""


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


def parse(text: str) -> tuple[int, list[RawThread]]:
    """(main thread ident or 0, threads of the last complete report) of a stacks file."""
    main = 0
    if m := _MAIN.search(text.split("\n", 1)[0]):
        main = int(m.group(1), 16)
    reports: list[list[RawThread]] = []
    ident: int | None = None
    frames: list[tuple[str, int, str]] = []

    def close_thread() -> None:
        if ident is not None and reports:
            reports[-1].append(RawThread(ident, tuple(frames)))

    for line in text.splitlines():
        if line.startswith("Timeout (") or (not reports and _THREAD.match(line)):
            close_thread()
            ident = None
            reports.append([])
        if t := _THREAD.match(line):
            close_thread()
            ident, frames = int(t.group(1), 16), []
        elif (f := _FRAME.match(line)) and ident is not None:
            frames.append((f.group(1), int(f.group(2)), f.group(3)))
    close_thread()
    complete = [r for r in reports if r]
    return main, complete[-1] if complete else []


def attach(dump: pb.Dump, ring_path: str | Path) -> bool:
    """Add the raw stacks of black box ``ring_path`` (if any) to the dump read from it.

    Returns:
        Whether any thread was added.
    """
    path = stacks_path(ring_path)
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_READ_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    main, threads = parse(text)
    if not threads:
        return False
    strings = {s: i for i, s in enumerate(dump.strings)}

    def string(value: str) -> int:
        index = strings.get(value)
        if index is None:
            index = strings[value] = len(dump.strings)
            dump.strings.append(value)
        return index

    for t in threads:
        stack = dump.stacks.add()
        for file, line, name in t.frames:
            stack.frames.append(len(dump.frames))
            dump.frames.add(file=string(file), name=string(name), line=line)
        is_main = t.ident == main
        dump.threads.add(
            ident=t.ident,
            name="MainThread" if is_main else f"thread 0x{t.ident:x}",
            stack=len(dump.stacks) - 1,
            is_main=is_main,
        )
    return True
