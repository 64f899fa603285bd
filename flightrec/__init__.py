"""flightrec: a flight recorder and hang analyzer for distributed PyTorch jobs.

Importing this package never imports torch. The recorder (``flightrec.enable()``,
``flightrec.dump()``) loads torch on first use; the analyzer needs no torch at all.
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("torch-flightrec")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
