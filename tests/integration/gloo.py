"""A real 1-rank gloo process group and a traced recorder runtime, for in-process recorder tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from flightrec.recorder.config import Config
from flightrec.recorder.runtime import Runtime
from tests.integration.jobs import free_port


@contextlib.contextmanager
def one_rank_gloo() -> Iterator[None]:
    """A default gloo process group of one rank on a free loopback port, destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}",
        timeout=timedelta(seconds=20),
    )  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def traced_runtime(
    directory: Path,
    buffer: int,
    *,
    background: bool = False,
    native: bool = False,
    ddp_hook: bool = True,
) -> Iterator[Runtime]:
    """The recorder enabled on this process (no watchdog firing: a one-hour timeout).

    ``native`` merges PyTorch's own ring into dumps; off by default here, since a test's
    process group (and so torch's ring) outlives the runtime each test creates.
    """
    config = Config(
        enabled=True, directory=str(directory), timeout_s=3600, buffer=buffer, native=native,
        ddp_hook=ddp_hook,
    )  # fmt: skip
    runtime = Runtime(config)
    runtime.enable()
    if background:
        runtime.start_background()
    try:
        yield runtime
    finally:
        runtime.disable()
