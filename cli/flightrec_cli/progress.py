"""A progress display on stderr for long commands: the stage, files done, time so far.

It appears only on a terminal, and only once the work has taken ``DELAY_S``: a 4-rank
analysis finishes before anything is drawn, and a report piped into a file or read by a
program (``--json``) never gets escape codes on its stderr. The display is transient: it is
gone before the command prints its report.
"""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

DELAY_S = 1.0
"""Seconds of work before the display appears."""


class StageProgress:
    """A one-line display of the current stage, started by a timer after ``delay_s``.

    Use as a context manager; ``stage`` names what runs now, ``files`` is the library's
    ``progress(done, total)`` callback. Both are cheap no-ops when the display is off.

    Args:
        enabled: False draws nothing (``--json``, for example).
        console: where to draw; stderr when None. Nothing is drawn unless it is a terminal.
        delay_s: work shorter than this draws nothing.
    """

    def __init__(
        self, enabled: bool = True, console: Console | None = None, delay_s: float = DELAY_S
    ) -> None:
        console = console or Console(stderr=True)
        self.enabled = enabled and console.is_terminal
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self._closed = False
        self._timer: threading.Timer | None = None
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("", total=None, count="")

    def __enter__(self) -> StageProgress:
        if self.enabled:
            self._timer = threading.Timer(self._delay_s, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _show(self) -> None:
        with self._lock:
            if not self._closed:
                self._bar.start()

    def close(self) -> None:
        """Take the display down (idempotent); what the command prints next stays clean."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar.live.is_started:
                self._bar.stop()

    def stage(self, description: str, total: int | None = None) -> None:
        """Start a stage: ``description``, with a count of ``total`` where it has one."""
        if self.enabled:
            count = f"0/{total:,}" if total else ""
            self._bar.update(
                self._task, description=description, total=total, completed=0, count=count
            )

    def files(self, done: int, total: int) -> None:
        """The loader's callback: ``done`` of ``total`` dump files read."""
        if not self.enabled:
            return
        if done >= total:
            self.stage(f"Analysing {total:,} dumps")
            return
        self._bar.update(
            self._task,
            description="Reading dumps",
            total=total,
            completed=done,
            count=f"{done:,}/{total:,} files",
        )

    def ranks(self, done: int, total: int) -> None:
        """``simulate``'s callback: ``done`` of ``total`` ranks' dumps written."""
        if self.enabled:
            self._bar.update(
                self._task,
                description="Writing dumps",
                total=total,
                completed=done,
                count=f"{done:,}/{total:,} ranks",
            )
