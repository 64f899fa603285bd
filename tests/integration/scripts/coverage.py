"""Real training stacks and hard deaths, for flightrec's coverage and black-box tests.

One process per rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun does); never
imports flightrec: FLIGHTREC=1 alone traces it.

Scenarios:
  ddp    a DistributedDataParallel training loop; ``--short-rank`` runs one step fewer and
         then sits in ``evaluate()`` (the classic uneven-inputs hang: the others wait in the
         last step's gradient all-reduce).
  fsdp   an FSDP2 (``fully_shard``) training loop on CPU/gloo, then a clean exit.
  die    all_reduces in ``train()``; after ``--steps`` of them ``--die-rank`` ends hard with
         ``--how sigkill`` (kills itself), ``--how exit`` (``os._exit``) or ``--how abort``
         (SIGABRT, as an abort inside the backend), running no Python exit code; the others
         go on to their next all_reduce.

Progress markers printed on stdout: READY, STEP <n>, EVALUATING, DYING, DONE.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def evaluate() -> None:
    """Stands for work outside any collective that takes a long time (an evaluation pass)."""
    while True:
        time.sleep(0.05)


def ddp(args: argparse.Namespace) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    # Small per-bucket caps: several gradient buckets per step, like a real model. (A small
    # bucket_cap_mb alone does not do it in torch 2.13: without find_unused_parameters every
    # parameter starts in one bucket, and these buckets are never rebuilt.)
    ddp_model = DistributedDataParallel(model, bucket_cap_mb_list=[0.0005] * 3)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    steps = args.steps - (1 if dist.get_rank() == args.short_rank else 0)
    print("READY", flush=True)
    for step in range(steps):
        loss = ddp_model(torch.randn(8, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"STEP {step}", flush=True)
    print("EVALUATING", flush=True)
    evaluate()


def fsdp(args: argparse.Namespace) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("READY", flush=True)
    for step in range(args.steps):
        loss = model(torch.randn(8, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"STEP {step}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print("DONE", flush=True)


def train(steps: int) -> None:
    t = torch.ones(4)
    for step in range(steps):
        dist.all_reduce(t)
        print(f"STEP {step}", flush=True)


def die(args: argparse.Namespace) -> None:
    print("READY", flush=True)
    train(args.steps)
    if dist.get_rank() == args.die_rank:
        # A rank dies after running a while, not within the watchdog's first tick (the black
        # box journals source lines from that thread, a tick after a frame is first seen).
        time.sleep(0.3)
        print("DYING", flush=True)
        if args.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.how == "abort":  # what an abort inside gloo or NCCL does
            os.abort()
        os._exit(3)
    train(2)  # the survivors' next step fails (or hangs) without the dead rank
    print("DONE", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["ddp", "fsdp", "die"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--short-rank", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=1)
    parser.add_argument("--how", choices=["sigkill", "exit", "abort"], default="sigkill")
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    {"ddp": ddp, "fsdp": fsdp, "die": die}[args.scenario](args)


if __name__ == "__main__":
    main()
