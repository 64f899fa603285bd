"""flightrec: a flight recorder and hang analyzer for distributed PyTorch jobs.

Importing this package never imports torch. The recorder (``flightrec.enable()``,
``flightrec.dump()``) loads torch on first use; the analyzer needs no torch at all.
"""

from __future__ import annotations

import os as _os
from importlib import metadata as _metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

try:
    __version__ = _metadata.version("torch-flightrec")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"

__all__ = ["__version__", "disable", "dump", "enable"]

# Under FLIGHTREC=1 the start-up hook (flightrec-autostart.pth) arms tracing in every process;
# where site-packages lacks it, importing flightrec arms it instead (the recorder then says in
# the job's log that processes which never import flightrec are not traced). A no-op where
# the hook already ran, and nothing is imported until torch.distributed is.
if _os.environ.get("FLIGHTREC", "").strip().lower() in ("1", "true", "yes"):
    from flightrec import _autostart  # noqa: F401


def enable() -> None:
    """Trace every torch.distributed collective and P2P call of this process.

    Same as starting the process with ``FLIGHTREC=1``; settings come from the FLIGHTREC_*
    environment variables. Idempotent.

    Raises:
        flightrec.errors.TorchMissingError: torch is not installed.
    """
    from flightrec import recorder
    from flightrec.live import REPORTER

    recorder.enable(reporter=REPORTER)


def disable() -> None:
    """Stop tracing and put torch.distributed's functions back (the ring is kept)."""
    from flightrec import recorder

    recorder.disable()


def dump(reason: str = "") -> Path | None:
    """Write this process's dump now; returns the file, or None if it could not be written.

    Raises:
        flightrec.errors.TorchMissingError: torch is not installed.
    """
    from flightrec import recorder

    return recorder.dump(reason)
