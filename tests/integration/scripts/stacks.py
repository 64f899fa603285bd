"""Training jobs on real stacks, shaped unlike the shipped samples, for issue 31's verdicts.

One process per rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun does), or
``--spawn N``: N ranks started with plain ``multiprocessing.Process`` (the spawn start
method; not torch.multiprocessing), each told its rank by its argument.

Scenarios:
  ddp_extra   DDP training; after step 2's backward, ``--culprit`` all-reduces its gradient
              norm (a debugging line left in on one rank): gloo aborts a rank on the size
              mismatch against the next DDP bucket.
  fsdp_extra  the same under FSDP2 (``fully_shard``).
  ddp_stall   DDP training; at step 2 ``--culprit`` waits for a batch that never comes (in
              ``threading.Event.wait``), the others wait in the bucket all-reduce, seen only
              by PyTorch's recorder.
  raise       ``--culprit`` raises RuntimeError in ``compute_loss`` at step 2.

Progress markers on stdout: READY, STALLING, DONE.
"""

from __future__ import annotations

import argparse
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard  # here: seconds of imports before any collective


def compute_loss(out: torch.Tensor, step: int, bad: bool) -> torch.Tensor:
    if bad and step == 2:
        raise RuntimeError(f"CUDA error: device-side assert triggered at step {step}")
    return out.pow(2).mean()


def next_batch(stalled: bool) -> torch.Tensor:
    if stalled:
        print("STALLING", flush=True)
        while not threading.Event().wait(0.05):  # a data loader that never delivers
            pass
    return torch.randn(8, 16)


def model_for(scenario: str) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if scenario == "fsdp_extra":
        for layer in (net[0], net[2]):
            fully_shard(layer)
        return fully_shard(net)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(net)


def train(args: argparse.Namespace, rank: int) -> None:
    model = model_for(args.scenario)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    culprit = rank == args.culprit
    print("READY", flush=True)
    for step in range(args.steps):
        batch = next_batch(args.scenario == "ddp_stall" and culprit and step == 2)
        loss = compute_loss(model(batch), step, args.scenario == "raise" and culprit)
        opt.zero_grad()
        loss.backward()
        if args.scenario.endswith("_extra") and culprit and step == 2:
            # FSDP2's gradients are DTensors: this rank's shard, no collective.
            grads = [getattr(p.grad, "to_local", lambda g=p.grad: g)() for p in model.parameters()]
            grad_norm = torch.stack([g.norm() for g in grads]).norm()
            dist.all_reduce(grad_norm)  # debugging, left in on one rank
        opt.step()


def run(args: argparse.Namespace, rank: int, world: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.pg_timeout),
    )
    train(args, rank)
    print("DONE", flush=True)
    dist.destroy_process_group()  # as pytorch/examples do: not reached when training raises


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["ddp_extra", "fsdp_extra", "ddp_stall", "raise"])
    parser.add_argument(
        "--spawn", type=int, default=0, help="start this many ranks with multiprocessing.Process"
    )
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.spawn:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=run, args=(args, r, args.spawn)) for r in range(args.spawn)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        raise SystemExit(max(p.exitcode or 0 for p in procs))
    run(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    main()
