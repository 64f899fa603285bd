"""A 4-rank gloo job with PyTorch's own Flight Recorder on, in which one rank is always late.

Usage: python fr_straggler.py PICKLE_DIR JSON_DIR [SLOW_RANK] [STEPS]

Every rank runs STEPS all_reduces with a little compute before each; SLOW_RANK sleeps another
40 ms first, every step. Nothing hangs. Each rank then writes its native dump by hand (pickle,
``nccl_trace_rank_<r>``, and JSON, ``<host>-comm_lib_trace_rank_<r>``), as a gloo job does:
PyTorch's gloo recorder keeps only when each collective was issued.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time


def _rank_main(rank: int, world: int, port: int, args: tuple[str, str, int, int]) -> None:
    pdir, jdir, slow, steps = args
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    t = torch.ones(4)
    for _ in range(steps):
        time.sleep(0.01)  # every rank's forward/backward
        if rank == slow:
            time.sleep(0.04)  # the straggler's extra work
        dist.all_reduce(t)
    dist.barrier()
    with open(os.path.join(pdir, f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(_dump_fr_trace())
    host = socket.gethostname().split(".")[0] or "host"
    with open(os.path.join(jdir, f"{host}-comm_lib_trace_rank_{rank}"), "wb") as f:
        f.write(_dump_fr_trace_json())
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    pdir, jdir = sys.argv[1], sys.argv[2]
    slow = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    os.makedirs(pdir, exist_ok=True)
    os.makedirs(jdir, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _rank_main, args=(4, port, (pdir, jdir, slow, steps)), nprocs=4, start_method="spawn"
    )


if __name__ == "__main__":
    main()
