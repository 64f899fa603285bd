"""The training script tools/torch_matrix.py runs under torchrun on each torch it checks.

A 4-rank gloo DDP job that never imports flightrec (``FLIGHTREC=1`` traces it through the
start-up hook of the installed package), in one of three shapes:

  stall    after three steps, rank 2 hangs in ``save_checkpoint_shard`` while the others wait
           in DDP's gradient all-reduce: the watchdog declares the hang and rank 0 prints the
           verdict into the log;
  killed   the same stall with a hang timeout longer than the run: the launcher kills every
           rank with SIGKILL, and only the black boxes are left;
  healthy  five steps and a normal exit (FLIGHTREC_DUMP_ON_EXIT=1 makes every rank dump).

Prints STALLING (rank 2) and DONE (every rank of a healthy run) on stdout.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def save_checkpoint_shard() -> None:
    print("STALLING", flush=True)
    time.sleep(3600)  # a write to a hung network filesystem


def main() -> None:
    shape = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        if shape != "healthy" and step == 3 and rank == 2:
            save_checkpoint_shard()
        loss = model(torch.randn(16, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    print("DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
