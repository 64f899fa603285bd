"""A small 4-rank training job for the live workflows (tests/integration/test_live_workflows.py).

Launched the ways users launch jobs: one process per rank with MASTER_ADDR/MASTER_PORT (as
``srun`` starts them), ``torchrun`` (static ``--master-port``, ``--rdzv-backend c10d``,
``--standalone``) or ``--spawn N`` (``torch.multiprocessing.spawn``, the script choosing its
own port). It never imports flightrec unless asked (``--api-dump``): FLIGHTREC=1 traces it.

Scenarios:
  loader  a few steps, then ``--bad-rank`` sits in its data loader (no collective) while every
          other rank waits in the loss all_reduce: a hang.
  train   steps until SIGTERM or ``--steps`` (a healthy job to trigger dumps from).
  gpipe   ``--steps`` of torch.distributed.pipelining's GPipe schedule over 4 stages.
  pipe    a 4-stage pipeline of send/recv (each stage sends activations to the next) whose
          ``--bad-rank`` stage stalls: the stages after it wait in recv, the ones before at
          the final barrier, rank 1 ``--late`` seconds later than rank 0.

``--api-dump`` makes every rank call ``flightrec.dump()`` once, from a thread, 1 s after start.
Progress markers on stdout: READY, WAITING <wall time>, STALLING, DONE.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def data_loader_next() -> torch.Tensor:
    """Stands for a data loader that never returns (a hung worker, a dead file server)."""
    while True:
        time.sleep(0.05)


def loader(rank: int, bad: int) -> None:
    loss = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(loss)
    print("READY", flush=True)
    time.sleep(0.5)  # (the test's trigger or signal lands before the hang begins, or during)
    if rank == bad:
        print("STALLING", flush=True)
        data_loader_next()
    print("WAITING", time.time(), flush=True)
    dist.all_reduce(loss)


def train(steps: int, idle: bool) -> None:
    loss = torch.ones(4)
    print("READY", flush=True)
    for _ in range(steps):
        dist.all_reduce(loss)
        time.sleep(0.05)
    if idle:
        print("IDLE", flush=True)
        time.sleep(3600)  # evaluating, checkpointing: no collective until stopped


def pipe(rank: int, world: int, bad: int, late: float) -> None:
    act = torch.ones(8)
    for _ in range(2):
        if rank > 0:
            dist.recv(act, rank - 1)
        if rank < world - 1:
            dist.send(act, rank + 1)
    dist.barrier()
    print("READY", flush=True)
    if rank > 0:
        print("WAITING", time.time(), flush=True)
        dist.recv(act, rank - 1)
    if rank == bad:
        print("STALLING", flush=True)
        data_loader_next()
    if rank < world - 1:
        dist.send(act, rank + 1)
    if rank == 1:
        time.sleep(late)  # the last microbatch's backward pass, still running
    dist.barrier()


def _dump_soon() -> None:
    """A thread of the job's own that dumps once, while the job is at work (or stuck)."""
    import flightrec

    time.sleep(1.0)
    flightrec.dump("from the training script")
    print("API DUMPED", flush=True)


def gpipe(rank: int, world: int, steps: int) -> None:
    """torch.distributed.pipelining's GPipe schedule: one Linear stage per rank, 4
    microbatches (its P2P goes through batch_isend_irecv: async work flightrec tracks)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    stage = PipelineStage(torch.nn.Linear(16, 16), rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, y: out.square().mean())
    print("READY", flush=True)
    for _ in range(steps):
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()


def run(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.api_dump:
        threading.Thread(target=_dump_soon, daemon=True).start()
    if args.scenario == "loader":
        loader(rank, args.bad_rank)
    elif args.scenario == "train":
        train(args.steps, args.idle)
    elif args.scenario == "gpipe":
        gpipe(rank, world, args.steps)
    else:
        pipe(rank, world, args.bad_rank, args.late)
    print("DONE", flush=True)
    dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    run(args)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["loader", "train", "pipe", "gpipe"])
    p.add_argument("--bad-rank", type=int, default=2)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--api-dump", action="store_true")
    p.add_argument("--idle", action="store_true", help="train: then idle until stopped")
    p.add_argument("--late", type=float, default=0.0, help="pipe: rank 1 reaches the end late")
    p.add_argument("--spawn", type=int, default=0, help="start this many ranks with mp.spawn")
    args = p.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args.spawn, args), nprocs=args.spawn)
    else:
        run(args)


if __name__ == "__main__":
    main()
