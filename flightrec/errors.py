"""The one error hierarchy of flightrec.

Library code raises these; only the CLI entry point turns them into a line on stderr and an
exit status. The recorder never lets any of them reach the training job.
"""

from __future__ import annotations

import re
from pathlib import Path

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
"""Characters a terminal acts on (all C0 and C1 controls but tab): never printed from a file."""


def printable(text: str) -> str:
    """``text`` with every control character but tab replaced by ``?``."""
    return CONTROL.sub("?", text)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line for one line of a log (its type's name where it says nothing),
    at most ``limit`` characters."""
    return (str(exc) or type(exc).__name__).splitlines()[0][:limit]


class FlightrecError(Exception):
    """Base of every error flightrec raises on purpose."""


class UsageError(FlightrecError):
    """The user asked for something that cannot be done (bad option, bad path)."""


class TorchMissingError(FlightrecError):
    """Recording was asked for in an environment without torch."""

    def __init__(self) -> None:
        super().__init__(
            "recording needs PyTorch (torch.distributed), which is not installed here; "
            "the analyzer (`flightrec analyze`) works without it"
        )


class DumpError(FlightrecError):
    """A dump file could not be read. ``str()`` is one line naming the file and the problem."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        # A reason may quote bytes of the damaged file (a parser's message); a newline or an
        # escape sequence from it must not break the one line or reach the terminal.
        self.reason = printable(reason)
        super().__init__(f"{printable(self.path)}: {self.reason}")


class NotADumpError(DumpError):
    """The file is not a dump flightrec knows (wrong magic bytes, unknown layout)."""


class UnsupportedVersionError(DumpError):
    """The dump's schema major version is one this flightrec cannot read."""


class CorruptDumpError(DumpError):
    """The file looks like a dump but is truncated, damaged or internally inconsistent."""


class UnsafeDumpError(DumpError):
    """A native (pickle/JSON) dump asked for something that would execute code."""


class WorkerLostError(FlightrecError):
    """A process the analysis forked ended without answering (killed, usually for memory)."""


class NoDumpsError(FlightrecError):
    """A folder held no readable dump at all."""
