"""A small gloo "training loop" in which one rank may arrive late at every all_reduce.

Two ways to run it:

* one rank per process, as ``tests/integration/jobs.start_job`` launches it (FLIGHTREC=1 traces
  it; the script never imports flightrec)::

      straggler.py --steps 40 --slow-rank 2      # rank 2 sleeps 30-50 ms before each all_reduce
      straggler.py --steps 0 --slow-rank 2       # runs until killed (for ``flightrec trigger``)

* ``--runs K --out DIR``: one process that imports torch once, then forks K jobs of
  ``--world`` ranks one after the other (fresh processes, ports and process groups each time);
  every rank of run k enables flightrec itself, dumps into ``DIR/run-k`` with ``flightrec.dump``
  when its loop ends, and exits. Fast enough to repeat a healthy job many times.
  ``--cycle-slow`` makes rank ``k % world`` the slow one in run k.

Progress markers on stdout: READY, STEP <n> (every 10 steps), DONE.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from forked import run_ranks


def loop(args: argparse.Namespace, rank: int, slow_rank: int | None = None) -> None:
    """The training loop: a little compute, then an all_reduce; the slow rank sleeps first."""
    slow = args.slow_rank if slow_rank is None else slow_rank
    lo, hi = (float(x) / 1e3 for x in args.delay_ms.split(","))
    rng = random.Random(rank)
    t = torch.ones(256)
    print("READY", flush=True)
    step = 0
    while args.steps <= 0 or step < args.steps:
        time.sleep(args.work_ms / 1e3)  # every rank's forward/backward
        if rank == slow:
            time.sleep(rng.uniform(lo, hi))  # the straggler's extra work, every step
        dist.all_reduce(t)
        step += 1
        if step % 10 == 0:
            print(f"STEP {step}", flush=True)
    dist.barrier()
    print("DONE", flush=True)


def job(args: argparse.Namespace) -> None:
    """One rank of a job launched by torchrun-style environment variables."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    loop(args, dist.get_rank())
    dist.destroy_process_group()


def _rank(args: argparse.Namespace, run_dir: str, port: int, rank: int, slow: int) -> None:
    os.environ.update(
        FLIGHTREC="1",
        FLIGHTREC_DIR=run_dir,
        RANK=str(rank),
        WORLD_SIZE=str(args.world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import flightrec

    flightrec.enable()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    loop(args, rank, slow)
    flightrec.dump("end of run")
    dist.destroy_process_group()


def runs(args: argparse.Namespace) -> int:
    """Fork ``args.runs`` jobs one after the other; returns how many ranks failed."""
    failed = 0
    for k in range(args.runs):
        run_dir = os.path.join(args.out, f"run-{k:03d}")
        slow = k % args.world if args.cycle_slow else args.slow_rank
        failed += run_ranks(
            args.world,
            lambda rank, port, d=run_dir, s=slow: _rank(args, d, port, rank, s),
            f"run {k}",
        )
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40, help="all_reduces; 0 runs until killed")
    parser.add_argument("--slow-rank", type=int, default=-1, help="-1: a healthy job")
    parser.add_argument("--delay-ms", default="30,50", help="the slow rank's sleep range")
    parser.add_argument("--work-ms", type=float, default=2.0, help="every rank's compute")
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=0, help="fork this many jobs in turn")
    parser.add_argument("--world", type=int, default=4, help="ranks per forked job")
    parser.add_argument("--out", default="", help="dump folder root for --runs")
    parser.add_argument(
        "--cycle-slow", action="store_true", help="with --runs: run k's slow rank is k %% world"
    )
    args = parser.parse_args()
    if args.runs:
        sys.exit(1 if runs(args) else 0)
    job(args)


if __name__ == "__main__":
    main()
