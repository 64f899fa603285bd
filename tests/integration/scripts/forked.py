"""Fork the ranks of a small job from one process that imported torch once.

Scripts that run many short jobs in a row (``straggler.py --runs``, ``pipeline.py --runs``)
call ``run_ranks`` per job: fresh processes, a fresh port, and each rank's own exit status.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world: int, rank_main: Callable[[int, int], None], label: str) -> int:
    """Fork ``world`` processes, each running ``rank_main(rank, port)`` on one fresh port,
    and wait for them; returns how many failed (raised or exited non-zero)."""
    port = free_port()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:  # the rank: run, then leave without unwinding the parent's stack
            code = 0
            try:
                rank_main(rank, port)
            except BaseException as e:  # reported through the exit status
                print(f"rank {rank} of {label}: {e!r}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += int(os.waitstatus_to_exitcode(status) != 0)
    return failed
