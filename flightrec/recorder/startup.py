"""The one line a traced job prints at start: tracing is on, and where to look.

Printed once per node, by its lowest rank, when the default process group exists (the rank
and the store are known only then): flightrec's version, the dump folder, the hang timeout,
whether the verdict goes to the log, and how to ask the job for dumps. Without it, a user
cannot tell whether ``FLIGHTREC=1`` took effect (the dump lines are INFO log records, which
a training script rarely shows).
"""

from __future__ import annotations

import contextlib
import os
import sys

LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
"""Where launchers put a process's rank on its node (torchrun, srun, mpirun)."""


def lowest_on_node(rank: int) -> bool:
    """Whether this process is its node's lowest rank (rank 0 when no launcher says)."""
    for name in LOCAL_RANK_VARIABLES:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw) == 0
    return rank == 0


def startup_line(
    version: str, rank: int, world_size: int, directory: str, timeout_s: float,
    verdict: bool, address: str,
) -> str:  # fmt: skip
    """The line, without its newline.

    Args:
        address: the job's store ("host:port"), where ``flightrec trigger`` asks for dumps;
            "" when the job has none a trigger can reach.
    """
    where = directory if "://" in directory else os.path.abspath(directory)
    parts = [
        f"flightrec {version}: tracing on (rank {rank} of {world_size} ranks)",
        f"dumps in {where}",
        f"hang timeout {timeout_s:g} s",
        f"verdict in the log: {'on' if verdict else 'off'}",
    ]
    if address:
        host, _, port = address.rpartition(":")
        parts.append(f"dump now with: flightrec trigger --host {host} --port {port}")
    return "; ".join(parts)


def say(line: str) -> None:
    """Write one line to the process's stderr, never raising (a closed or full log costs the
    line, not the job)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()  # the job's own lines first, in order
    with contextlib.suppress(Exception):
        os.write(sys.stderr.fileno(), f"{line}\n".encode("utf-8", "replace"))
        return
    with contextlib.suppress(Exception):  # stderr without a file (a notebook)
        sys.stderr.write(f"{line}\n")
