"""A 4-rank gloo job in which one rank passes an all_gather_into_tensor output of the wrong size,
or (``--op all_to_all``) all_to_all_single split sizes that disagree with its peers'.

Run one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (as torchrun does).
A few all_reduces, then every rank all-gathers 8 elements into an output of world x 8, except
``--bad-rank``, whose output has 8 more: gloo rejects it on that rank alone, which raises (and
dies of it, as an ordinary script does), while the other ranks wait in the all-gather.

With ``--op all_to_all``, rank r sends r + 1 rows to every peer (uneven, as an MoE router's
counts), except ``--bad-rank``, whose counts are stale (same total, other peers): a peer
receiving more than it expects aborts inside gloo, and the job breaks down in the all_reduce
that follows.

Progress markers printed on stdout: READY, GATHERING, RAISED <exception type>.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad-rank", type=int, default=1)
    parser.add_argument("--pg-timeout", type=float, default=20.0)
    parser.add_argument("--op", choices=("all_gather", "all_to_all"), default="all_gather")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    print("READY", flush=True)
    if args.op == "all_to_all":
        exchange(rank, world, args.bad_rank)
        return
    extra = 8 if rank == args.bad_rank else 0
    out = torch.empty(world * 8 + extra)
    print("GATHERING", flush=True)
    try:
        dist.all_gather_into_tensor(out, torch.ones(8))
    except Exception as exc:
        print("RAISED", type(exc).__name__, flush=True)
        raise


def exchange(rank: int, world: int, bad_rank: int) -> None:
    sends = [rank + 1] * world
    if rank == bad_rank:
        sends = [rank + 1 + (1 if p == 0 else -1 if p == 1 else 0) for p in range(world)]
    receives = [p + 1 for p in range(world)]
    out = torch.empty(sum(receives), 4)
    print("GATHERING", flush=True)
    try:
        dist.all_to_all_single(
            out, torch.ones(sum(sends), 4), output_split_sizes=receives, input_split_sizes=sends
        )
        dist.all_reduce(torch.ones(2))
    except Exception as exc:
        print("RAISED", type(exc).__name__, flush=True)
        raise


if __name__ == "__main__":
    main()
