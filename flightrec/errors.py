"""The one error hierarchy of flightrec.

Library code raises these; only the CLI entry point turns them into a line on stderr and an
exit status. The recorder never lets any of them reach the training job.
"""

from __future__ import annotations

import re
from pathlib import Path

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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
        self.reason = _CONTROL.sub("?", reason)
        super().__init__(f"{_CONTROL.sub('?', self.path)}: {self.reason}")


class NotADumpError(DumpError):
    """The file is not a dump flightrec knows (wrong magic bytes, unknown layout)."""


class UnsupportedVersionError(DumpError):
    """The dump's schema major version is one this flightrec cannot read."""


class CorruptDumpError(DumpError):
    """The file looks like a dump but is truncated, damaged or internally inconsistent."""


class UnsafeDumpError(DumpError):
    """A native (pickle/JSON) dump asked for something that would execute code."""


class NoDumpsError(FlightrecError):
    """A folder held no readable dump at all."""
