"""The raw-stacks file beside a black box: where it goes and its first line.

faulthandler writes every thread's Python stack into it from its own C thread when no Python
code has run for FLIGHTREC_TIMEOUT seconds (``flightrec.recorder.dumping.rawstacks`` arms it;
``flightrec.readers.rawstacks`` reads it back). The body is faulthandler's own text.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".stacks"


def stacks_path(ring_path: str | Path) -> Path:
    """Where the raw stacks of the black box ``ring_path`` go: ``.<ring name>.stacks``.

    Hidden, like the black box's other companions, so that a folder scan never mistakes it
    for a dump; it is read through its black box.
    """
    ring = Path(ring_path)
    return ring.with_name(f".{ring.name}{SUFFIX}")


HEADER = "# flightrec raw stacks"
"""First line: ``HEADER pid=<pid> main=0x<main thread ident>``."""
