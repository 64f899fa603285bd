"""A 4-rank job for the verdict in the job's log (tests/integration/test_live_verdict.py).

Every rank writes its dumps into a folder of its own (``$FLIGHTREC_DIR/rank<N>``), as ranks on
hosts that share no filesystem do, so the verdict can only come through the job's store.

  stall  after a few steps, ``--bad-rank`` hangs writing a checkpoint shard while the others
         wait in the loss all_reduce.
  crash  after a few steps, ``--bad-rank`` dies (exit status 3) while the others are in a long
         step; under torchrun the agent then sends them SIGTERM.
  raise  the same, but ``--bad-rank`` dies of an exception its data pipeline raises.
  uneven a DDP model trained on shards of uneven length: ``--bad-rank`` has one batch fewer,
         so it enters the end-of-epoch barrier while the others all-reduce gradients.

Progress markers on stdout: READY, WAITING, STALLING.
"""

from __future__ import annotations

import argparse
import os
import time

# Before torch is imported: flightrec reads FLIGHTREC_DIR when torch.distributed loads.
os.environ["FLIGHTREC_DIR"] = os.path.join(os.environ["FLIGHTREC_DIR"], f"rank{os.environ['RANK']}")

import torch
import torch.distributed as dist


def save_checkpoint_shard() -> None:
    time.sleep(3600)  # a write to a hung network filesystem


def next_batch() -> None:
    raise ValueError("bad batch: label 12 out of range")


def long_step() -> None:
    time.sleep(120)  # a long forward and backward pass


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()  # DDP all-reduces the gradient buckets from here
    opt.step()


def uneven(rank: int, bad_rank: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 3 if rank == bad_rank else 4
    print("READY", flush=True)
    for _ in range(batches):
        train_step(model, opt, torch.randn(4, 8))
    print("WAITING", time.time(), flush=True)
    dist.barrier()  # the end of the epoch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["stall", "crash", "raise", "uneven"])
    p.add_argument("--bad-rank", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.scenario == "uneven":
        uneven(rank, args.bad_rank)
        dist.destroy_process_group()
        return
    loss = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(loss)
    dist.barrier()
    print("READY", flush=True)
    if args.scenario in ("crash", "raise"):
        if rank == args.bad_rank:
            time.sleep(0.5)
            if args.scenario == "raise":
                next_batch()
            os._exit(3)
        long_step()
    elif rank == args.bad_rank:
        print("STALLING", flush=True)
        save_checkpoint_shard()
    else:
        print("WAITING", time.time(), flush=True)
        dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
