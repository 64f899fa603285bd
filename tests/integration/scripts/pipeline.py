"""A small pipeline-parallel "training loop" on gloo: 2 data-parallel replicas x 2 stages.

Ranks 0 and 1 are replica 0 (stages 0 and 1), ranks 2 and 3 replica 1. Each step runs
``torch.distributed.pipelining``'s GPipe schedule over 4 micro-batches on the replica's
pipeline group, then all-reduces each stage's flattened gradients over its data-parallel
group ({0, 2} and {1, 3}). A stage's forward computes for ``--work-ms`` per micro-batch (a
sleep: the timing, not the arithmetic, is under test). Shapes:

* ``healthy``: every stage alike;
* ``slow-rank``: rank ``--slow-rank`` computes twice as long (a throttled GPU);
* ``heavy-last``: every rank of the last stage computes twice as long (stage imbalance).

``--runs SHAPE,SHAPE,... --out DIR`` imports torch once and forks one 4-rank job per shape,
one after the other (fresh processes, ports and groups each time); every rank enables
flightrec itself, dumps into ``DIR/<shape>`` when its loop ends, and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from forked import run_ranks
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

STAGES = 2
MICROBATCHES = 4


class Block(torch.nn.Module):
    """One stage's layer; its forward takes ``work_s`` (the stage's compute)."""

    def __init__(self, work_s: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.work_s = work_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.work_s)
        return torch.relu(self.linear(x))


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def train(args: argparse.Namespace, shape: str) -> None:
    """The loop of one rank (the process group is up)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    stage, replica = rank % STAGES, rank // STAGES
    # Every rank creates every group, in the same order.
    pipes = [
        dist.new_group([r * STAGES + s for s in range(STAGES)]) for r in range(world // STAGES)
    ]
    dps = [dist.new_group(list(range(s, world, STAGES))) for s in range(STAGES)]
    slow = (shape == "slow-rank" and rank == args.slow_rank) or (
        shape == "heavy-last" and stage == STAGES - 1
    )
    torch.manual_seed(0)
    block = Block(args.work_ms * (2.0 if slow else 1.0) / 1e3)
    pipe = PipelineStage(block, stage, STAGES, torch.device("cpu"), group=pipes[replica])
    schedule = ScheduleGPipe(pipe, n_microbatches=MICROBATCHES, loss_fn=_loss)
    x, target = torch.randn(8, 16), torch.zeros(8, 16)
    print("READY", flush=True)
    for step in range(args.steps):
        block.zero_grad()
        if stage == 0:
            schedule.step(x)
        else:
            schedule.step(target=target)
        grads = torch.cat([p.grad.flatten() for p in block.parameters() if p.grad is not None])
        dist.all_reduce(grads, group=dps[stage])
        if (step + 1) % 5 == 0:
            print(f"STEP {step + 1}", flush=True)
    dist.barrier()
    print("DONE", flush=True)


def _rank(args: argparse.Namespace, run_dir: str, port: int, rank: int, shape: str) -> None:
    os.environ.update(
        FLIGHTREC="1",
        FLIGHTREC_DIR=run_dir,
        RANK=str(rank),
        WORLD_SIZE="4",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import flightrec

    flightrec.enable()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    train(args, shape)
    flightrec.dump("end of run")
    dist.destroy_process_group()


def runs(args: argparse.Namespace) -> int:
    """One forked 4-rank job per shape of ``args.runs``; returns how many ranks failed."""
    failed = 0
    for shape in args.runs.split(","):
        run_dir = os.path.join(args.out, shape)
        failed += run_ranks(
            4, lambda rank, port, d=run_dir, s=shape: _rank(args, d, port, rank, s), shape
        )
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--shape", default="healthy", choices=["healthy", "slow-rank", "heavy-last"]
    )
    parser.add_argument("--runs", default="", help="shapes to run, one forked job each")
    parser.add_argument("--out", default="", help="dump folder root for --runs")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--work-ms", type=float, default=25.0, help="a stage's forward, per micro-batch"
    )
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    args = parser.parse_args()
    if args.runs:
        sys.exit(1 if runs(args) else 0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    train(args, args.shape)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
