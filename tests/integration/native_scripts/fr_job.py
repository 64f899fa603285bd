"""A 4-rank gloo job with PyTorch's own Flight Recorder on, failing in one chosen way.

Usage: python fr_job.py SCENARIO PICKLE_DIR JSON_DIR [WORLD_SIZE]

Scenarios (each rank runs two healthy steps first, then the faulty step):
  healthy        every rank runs every step;
  hang           rank 2 never enters step 3's all_reduce (it is busy elsewhere);
  op_mismatch    rank 0 calls broadcast where the others call all_reduce;
  size_mismatch  rank 1 all-reduces 8 elements where the others all-reduce 4;
  dtype_mismatch rank 3 all-reduces float64 where the others all-reduce float32 (gloo aborts
                 a rank that receives it, which then leaves no dump);
  subgroup_hang  groups [0, 1] and [2, 3]; rank 3 never enters its subgroup's all_reduce,
                 so rank 2 waits there and ranks 0 and 1 wait for both in the next world
                 all_reduce.

Every rank writes its native dump the way a job does it by hand on gloo (gloo has no
dump-on-timeout): ``torch._C._distributed_c10d._dump_fr_trace()`` (pickle, named
``nccl_trace_rank_<r>``) and ``_dump_fr_trace_json()`` (JSON, named
``<host>-comm_lib_trace_rank_<r>``) once its faulty step has returned or failed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time

# Short enough that a hang ends in seconds; tests lower it further.
TIMEOUT_S = float(os.environ.get("FR_JOB_TIMEOUT_S", "3"))


def _step(rank: int, t: object, world: object, sub: object) -> None:
    import torch.distributed as dist

    dist.all_reduce(t)  # type: ignore[arg-type]
    if sub is not None:
        dist.all_reduce(t, group=sub)  # type: ignore[arg-type]
    dist.broadcast(t, 0)  # type: ignore[arg-type]


def _faulty(scenario: str, rank: int, sub: object) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if scenario == "healthy":
        dist.all_reduce(t)
    elif scenario == "hang":
        if rank == 2:
            time.sleep(TIMEOUT_S + 2)  # stuck outside any collective
        else:
            dist.all_reduce(t)
    elif scenario == "op_mismatch":
        if rank == 0:
            dist.broadcast(t, 0)
        else:
            dist.all_reduce(t)
    elif scenario == "size_mismatch":
        dist.all_reduce(torch.ones(8) if rank == 1 else t)
    elif scenario == "dtype_mismatch":
        # gloo aborts a rank that receives the float64 message: it never writes its dump.
        dist.all_reduce(torch.ones(4, dtype=torch.float64) if rank == 3 else t)
    elif scenario == "subgroup_hang":
        if rank == 3:
            time.sleep(TIMEOUT_S + 2)
            return
        if rank == 2:
            dist.all_reduce(t, group=sub)
        dist.all_reduce(t)
    else:
        raise SystemExit(f"unknown scenario {scenario}")


def _rank_main(rank: int, world: int, port: int, scenario: str, pdir: str, jdir: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    # Spawned ranks finish importing torch seconds apart on a loaded machine, longer than the
    # short timeout the faulty step needs: meet on a store with a long timeout first, so that
    # only the faulty step can time out.
    store = dist.TCPStore(
        "127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60)
    )
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(world)])
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    sub = None
    if scenario == "subgroup_hang":
        halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        sub = halves[rank // 2]
    t = torch.ones(4)
    for _ in range(2):
        _step(rank, t, None, sub)
    # A RuntimeError here is the timeout or closed connection a real job would die of.
    with contextlib.suppress(RuntimeError):
        _faulty(scenario, rank, sub)
    with open(os.path.join(pdir, f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(_dump_fr_trace())
    host = socket.gethostname().split(".")[0] or "host"
    with open(os.path.join(jdir, f"{host}-comm_lib_trace_rank_{rank}"), "wb") as f:
        f.write(_dump_fr_trace_json())
    # Leave without a barrier: peers may be dead or stuck, as in the real failure.
    os._exit(0)


def main() -> None:
    import torch.multiprocessing as mp

    scenario, pdir, jdir = sys.argv[1], sys.argv[2], sys.argv[3]
    world = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    os.makedirs(pdir, exist_ok=True)
    os.makedirs(jdir, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(
        _rank_main,
        args=(world, port, scenario, pdir, jdir),
        nprocs=world,
        start_method="spawn",
        join=False,
    )
    # Every rank runs to its own end, as in a real job: a rank gloo aborted must not take the
    # others down with it (spawn's join would terminate them before they write their dumps).
    for proc in ctx.processes:
        proc.join()
    failed = [i for i, proc in enumerate(ctx.processes) if proc.exitcode != 0]
    if failed:
        raise SystemExit(f"ranks {failed} failed")


if __name__ == "__main__":
    main()
