"""A small DistributedDataParallel training job, as a new user writes one, for the tests of
the paths users hit most (tests/integration/test_ddp_live.py).

Run one process per rank with the torchrun variables (``torchrun`` itself, any rendezvous):
it reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment. It never imports
flightrec: FLIGHTREC=1 traces it. Its only collectives are DDP's (the construction-time
broadcasts, then the reducer's gradient-bucket all-reduces, three buckets a step), unless a
scenario adds one.

Scenarios:
  stall   ``--culprit`` sits in ``load_batch`` before its backward at step ``--step`` (a
          data loader that never returns); the others wait in the backward's all-reduces
          until a timeout (gloo's, ``--pg-timeout``, or flightrec's) ends them.
  extra   ``--culprit`` all-reduces one extra metric before its backward at step ``--step``;
          its peers' bucket all-reduce meets it instead.
  train   ``--steps`` steps; ``--go FILE``: then waits (outside any collective) until FILE
          exists, and stalls as ``stall`` does.

Progress markers on stdout: READY, STEP <n>, STALLING, WAITING, DONE.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout
from torch.nn.parallel import DistributedDataParallel as DDP


def load_batch() -> None:
    """A data loader that never returns (a dead storage mount, a hung worker)."""
    print("STALLING", flush=True)
    while True:
        time.sleep(0.05)


def log_metric(value: torch.Tensor) -> None:
    """One rank averages a metric the others never do: one collective more than its peers."""
    dist.all_reduce(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["stall", "extra", "train"])
    parser.add_argument("--culprit", type=int, default=2)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    parser.add_argument("--go", default="", help="train: stall once this file exists")
    args = parser.parse_args()
    # Set-up and the healthy steps get a timeout a loaded machine never reaches; the group's
    # timeout is ``--pg-timeout`` from the step that hangs on (as if set at init).
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(60.0, args.pg_timeout)))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 8),
    )  # fmt: skip
    ddp = DDP(model, bucket_cap_mb=0.1)  # three buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    print("READY", flush=True)
    for step in range(args.steps):
        if step == args.step:
            _set_pg_timeout(timedelta(seconds=args.pg_timeout))
        loss = ddp(x).pow(2).mean()
        if rank == args.culprit and step == args.step:
            if args.scenario == "stall":
                load_batch()
            elif args.scenario == "extra":
                log_metric(loss.detach().clone())
        if args.scenario != "train" and step == args.step and rank != args.culprit:
            print("WAITING", flush=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"STEP {step}", flush=True)
    if args.go:
        _set_pg_timeout(timedelta(seconds=args.pg_timeout))
        print("HEALTHY", flush=True)
        while not os.path.exists(args.go):
            time.sleep(0.05)
        loss = ddp(x).pow(2).mean()
        if rank == args.culprit:
            load_batch()
        print("WAITING", flush=True)
        loss.backward()
    dist.destroy_process_group()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
