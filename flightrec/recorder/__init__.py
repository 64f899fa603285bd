"""The training-side recorder: every torch.distributed collective and P2P call into a per-rank
ring, dumped on hang, error, signal, exit or request.

Modules, by idea: ``config`` (environment), ``ring`` (binary slots), ``tables`` and ``stacks``
(interning), ``groups`` (group identity and sequence counters), ``specs`` and ``hooks``
(wrapping torch.distributed), ``recorder`` (the hot path), ``completion`` (async work),
``watchdog``, ``store`` (dump requests), ``signals``, ``dumper`` and ``runtime`` (wiring),
``upload`` (dumps to object storage) and ``metrics`` (Prometheus, for alerting).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flightrec.errors import TorchMissingError
from flightrec.recorder.config import Config, from_env

if TYPE_CHECKING:
    from flightrec.recorder.exchange import Reporter

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
    above the recorder hand in ``flightrec.live.report``; without one, no verdict is printed).

    Raises:
        TorchMissingError: torch (with torch.distributed) is not installed.
    """
    _require_torch()
    from flightrec.recorder import runtime

    rt = runtime.get(config)
    if reporter is not None:
        rt.reporter = reporter
    rt.enable()


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
