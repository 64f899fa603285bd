"""The parts the runtime makes once, handed together to its triggers and its lifecycle."""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.recorder.config import Config
from flightrec.recorder.dumping.dumper import Dumper
from flightrec.recorder.dumping.upload import Uploader
from flightrec.recorder.metrics import Counts
from flightrec.recorder.native.watch import NativeWatch
from flightrec.recorder.peers import Peers
from flightrec.recorder.recording.blackbox import BlackBox
from flightrec.recorder.recording.recorder import Recorder


@dataclass(frozen=True, slots=True)
class Parts:
    """The process's recorder and what serves it (``runtime`` makes them)."""

    config: Config
    """The settings (FLIGHTREC_*)."""
    recorder: Recorder
    """Ring, tables, group counters (entries are named from them in ``reason_detail``)."""
    dumper: Dumper
    """Writes the dumps; its identity is fixed once the default group exists."""
    peers: Peers
    """The link to the other ranks through the store (poller, exchange, slow check)."""
    native_watch: NativeWatch
    """The watch on collectives only PyTorch's recorder saw (each watchdog tick)."""
    counts: Counts
    """Dumps written and failed, warnings: what the metrics report."""
    uploader: Uploader | None
    """Sends written dumps to object storage (FLIGHTREC_DIR as a URL); None: none."""
    blackbox: BlackBox | None
    """The recorder's black box; None: off or impossible."""
