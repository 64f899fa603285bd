"""The training-side recorder: every torch.distributed collective and P2P call into a per-rank
ring, dumped on hang, error, signal, exit or request.

Subpackages, by idea:

- ``hotpath``: recording one call (its narrow ``HotState``, the Python path and the optional
  C path, the ring, the group counters);
- ``recording``: the ``Recorder`` (live state, slow paths), intern tables, stacks, completion
  tracking, the black box;
- ``hooks``: wrapping torch.distributed (function specs, generated wrappers, DDP);
- ``dumping``: dumps, the exception a rank dies of, raw stacks, uploads;
- ``exchange``: ranks talking through the job's store (dump requests, ``flightrec trigger``,
  the verdict's summaries, the slow check);
- ``native``: PyTorch's own Flight Recorder, harvested and merged into dumps.

Beside them: ``config`` (environment); ``runtime``, the composition root (one per process)
that wires the parts and ``peers`` (the link to the other ranks through the store),
``triggers`` (what makes a dump) and ``lifecycle`` (threads, fork, exit); ``watchdog``,
``signals``, ``metrics`` (Prometheus), ``startup`` and ``diagnose`` (``flightrec doctor``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flightrec.errors import TorchMissingError
from flightrec.recorder.config import Config, from_env

if TYPE_CHECKING:
    from flightrec.recorder.exchange.verdict import Reporter

__all__ = ["Config", "disable", "dump", "enable", "from_env"]


def _require_torch() -> None:
    try:
        import torch.distributed as dist
    except ImportError:
        raise TorchMissingError() from None
    if not dist.is_available():
        raise TorchMissingError()


def enable(config: Config | None = None, reporter: Reporter | None = None) -> None:
    """Trace torch.distributed in this process (what ``FLIGHTREC=1`` does at start-up).

    Idempotent. Settings come from the FLIGHTREC_* environment variables unless ``config``
    is given (it only takes effect on the first call that creates the recorder).
    ``reporter`` prints the verdict into the job's log when a hang is declared (the layers
    above the recorder hand in ``flightrec.live.REPORTER``; without one, no verdict is printed).

    Raises:
        TorchMissingError: torch (with torch.distributed) is not installed.
    """
    _require_torch()
    from flightrec.recorder import runtime

    runtime.get(config).enable(reporter)


def disable() -> None:
    """Stop tracing: put torch.distributed's functions back and stop the background threads.

    The ring is kept, so ``dump()`` still writes what was recorded.
    """
    from flightrec.recorder import runtime

    rt = runtime.current()
    if rt is not None:
        rt.disable()


def dump(reason: str = "") -> Path | None:
    """Write a dump of this process now (reason API_CALL).

    Args:
        reason: free text stored as the dump's ``reason_detail``.

    Returns:
        The file written, or None when it could not be written (one warning is logged; the
        job is never interrupted).

    Raises:
        TorchMissingError: torch (with torch.distributed) is not installed.
    """
    _require_torch()
    from flightrec.format import flightrec_pb2 as pb
    from flightrec.recorder import runtime

    return runtime.get().dump(pb.API_CALL, reason)
