"""Ordinary training jobs shaped unlike the shipped samples, for the verdict tests (issue 14).

Run one process per rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun does), or
``--spawn N``: torch.multiprocessing starts N ranks that know their rank only from their
argument (RANK, LOCAL_RANK and WORLD_SIZE are removed from their environment, as in a script
that calls ``init_process_group(rank=rank, world_size=world)`` itself).

Scenarios:
  destroy      a few DDP steps, ``destroy_process_group()`` in ``finally:``; healthy.
  eval_sleep   DDP training; at step 3 ``--culprit`` goes into its evaluation loop and stays
               there (a sleep) while the others wait in the next backward's all_reduce.
  raise_mid    ``--culprit`` raises ValueError in ``compute_loss`` at step 3.
  raise_early  every rank raises ValueError in ``load_config`` after ``init_process_group``,
               before any collective.

Progress markers on stdout: READY, EVALUATING, DONE.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_config(path: str) -> dict[str, int]:
    raise ValueError(f"no such config: {path}")


def compute_loss(out: torch.Tensor, step: int, bad: bool) -> torch.Tensor:
    if bad and step == 3:
        raise ValueError(f"loss is NaN at step {step}")
    return out.pow(2).mean()


def evaluate(model: torch.nn.Module) -> None:
    """An evaluation loop that never ends (a stuck metric server, say)."""
    print("EVALUATING", flush=True)
    while True:
        time.sleep(0.05)


def train(args: argparse.Namespace, rank: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("READY", flush=True)
    for step in range(args.steps):
        if args.scenario == "eval_sleep" and rank == args.culprit and step == 3:
            evaluate(model)
        out = model(torch.ones(4, 8))
        loss = compute_loss(out, step, args.scenario == "raise_mid" and rank == args.culprit)
        opt.zero_grad()
        loss.backward()
        opt.step()


def run(args: argparse.Namespace, rank: int, world: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.pg_timeout),
    )
    try:
        if args.scenario == "raise_early":
            load_config("/nonexistent/config.yaml")
        train(args, rank)
        print("DONE", flush=True)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)
    run(args, rank, world)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["destroy", "eval_sleep", "raise_mid", "raise_early"])
    parser.add_argument("--spawn", type=int, default=0, help="start this many ranks with mp.spawn")
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args.spawn, args), nprocs=args.spawn)
    else:
        run(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    main()
