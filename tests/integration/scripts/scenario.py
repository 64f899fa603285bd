"""A small distributed "training" job with a choice of failure, for flightrec's integration tests.

Run one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (as torchrun does),
or ``--spawn N`` to start N ranks with torch.multiprocessing. The script never imports
flightrec unless asked to (``--api-dump``): FLIGHTREC=1 alone must trace it.

Scenarios:
  healthy  collectives of many kinds, async work, two subgroups, a P2P ring (send/recv,
           isend/irecv, batch_isend_irecv), and two threads issuing collectives at once.
  stall    a few steps, then ``--stall-rank`` sits in ``stalled_data_loader()`` (no collective)
           while every other rank waits in an all_reduce.
  crash    a few steps, then ``--crash-rank`` exits abruptly; the others' next collective fails.

Progress markers printed on stdout (tests wait for them): READY, STALLING, WAITING, DONE,
RAISED <exception type>.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def steps(n: int) -> None:
    t = torch.ones(4)
    for _ in range(n):
        dist.all_reduce(t)


def stalled_data_loader() -> None:
    """Stands for a data loader that never returns: a rank stuck outside any collective."""
    while True:
        time.sleep(0.05)


def healthy(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    steps(3)
    t = torch.arange(4, dtype=torch.float32)
    dist.broadcast(t, src=1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    work = dist.all_reduce(torch.ones(8), async_op=True)
    work.wait()
    out = torch.empty(world * 2)
    dist.all_gather_into_tensor(out, torch.ones(2))
    # Two subgroups: every rank creates both, uses its own.
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    dist.all_reduce(torch.ones(3), group=mine)
    dist.broadcast(torch.ones(3), src=2 if rank >= 2 else 0, group=mine)
    # P2P ring: blocking, non-blocking, batched.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(5)
    if rank % 2 == 0:
        dist.send(torch.ones(5), dst=nxt)
        dist.recv(buf, src=prv)
    else:
        dist.recv(buf, src=prv)
        dist.send(torch.ones(5), dst=nxt)
    reqs = [dist.isend(torch.ones(6), dst=nxt), dist.irecv(torch.zeros(6), src=prv)]
    for r in reqs:
        r.wait()
    ops = [
        dist.P2POp(dist.isend, torch.ones(7), nxt),
        dist.P2POp(dist.irecv, torch.zeros(7), prv),
    ]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    # Two threads, each with its own group, issuing collectives at the same time.
    groups = [dist.new_group(list(range(world))) for _ in range(2)]

    def worker(g: dist.ProcessGroup) -> None:
        for _ in range(5):
            dist.all_reduce(torch.ones(2), group=g)

    threads = [
        threading.Thread(target=worker, args=(g,), name=f"worker-{i}") for i, g in enumerate(groups)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dist.barrier()
    if args.api_dump:
        import flightrec

        print("API_DUMP", flightrec.dump("end of healthy run"), flush=True)


def stall(args: argparse.Namespace) -> None:
    steps(3)
    print("READY", flush=True)
    if dist.get_rank() == args.stall_rank:
        print("STALLING", flush=True)
        stalled_data_loader()
    print("WAITING", flush=True)
    dist.all_reduce(torch.ones(4))


def crash(args: argparse.Namespace) -> None:
    steps(3)
    dist.barrier()
    if dist.get_rank() == args.crash_rank:
        os._exit(3)
    time.sleep(0.5)  # let the crash happen first
    try:
        steps(1)
    except Exception as exc:
        print("RAISED", type(exc).__name__, flush=True)
        raise


def run(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    print("READY" if args.scenario != "stall" else "INIT", flush=True)
    {"healthy": healthy, "stall": stall, "crash": crash}[args.scenario](args)
    print("DONE", flush=True)
    dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    run(args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["healthy", "stall", "crash"])
    parser.add_argument("--spawn", type=int, default=0, help="start this many ranks with mp.spawn")
    parser.add_argument("--stall-rank", type=int, default=2)
    parser.add_argument("--crash-rank", type=int, default=3)
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    parser.add_argument("--api-dump", action="store_true", help="call flightrec.dump() at the end")
    args = parser.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args.spawn, args), nprocs=args.spawn)
    else:
        run(args)


if __name__ == "__main__":
    main()
