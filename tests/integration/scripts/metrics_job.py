"""A job that is healthy until told otherwise, for the metrics test.

Every rank runs five all-reduces on the default group and two on a subgroup of all ranks,
prints HEALTHY, and waits (outside any collective) until the file named by ``--go`` exists.
Then ``--stall-rank`` sits in a data loader that never returns while every other rank waits
in an all_reduce: a hang in the making. Progress markers: HEALTHY, STALLING, WAITING.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", required=True, help="a file whose appearance ends the healthy part")
    parser.add_argument("--stall-rank", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    sub = dist.new_group(list(range(dist.get_world_size())))
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    for _ in range(2):
        dist.all_reduce(torch.ones(4), group=sub)
    print("HEALTHY", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.05)
    if dist.get_rank() == args.stall_rank:
        print("STALLING", flush=True)
        while True:  # a data loader that never returns
            time.sleep(0.05)
    print("WAITING", flush=True)
    dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    main()
