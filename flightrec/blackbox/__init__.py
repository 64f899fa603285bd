"""The black box: a rank's ring on disk, so a process that dies hard still leaves evidence.

``writer.BlackBox`` is created by the recorder (unless ``FLIGHTREC_BLACKBOX=0``) and backs the
ring with a memory-mapped file under FLIGHTREC_DIR; ``reader.read_blackbox`` turns such a file
back into a ``pb.Dump`` for the analyzer. ``format`` holds the file layout both share. The
reader needs no torch.
"""

from __future__ import annotations

from flightrec.blackbox.format import RING_SUFFIX, SOURCE, Status
from flightrec.blackbox.reader import died, ended, is_blackbox, read_blackbox

__all__ = ["RING_SUFFIX", "SOURCE", "Status", "died", "ended", "is_blackbox", "read_blackbox"]
