"""A real TCPStore server in a process of its own, for the tests of the store's clients."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SERVER = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
import torch
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
             use_libuv=sys.argv[1] == "libuv", timeout=timedelta(seconds=30))
print(s.port, torch.__version__, flush=True)
sys.stdin.read()
"""


@contextmanager
def store_server(backend: str = "libuv", python: str = sys.executable) -> Iterator[tuple[int, str]]:
    """(port, torch version) of a TCPStore server (``backend``: ``libuv`` or ``legacy``) run by
    ``python``, until the block ends."""
    proc = subprocess.Popen(
        [python, "-c", SERVER, backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    port, version = proc.stdout.readline().split()
    try:
        yield int(port), version
    finally:
        proc.stdin.close()
        proc.wait(30)
