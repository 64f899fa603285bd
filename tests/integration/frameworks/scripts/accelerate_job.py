"""An Accelerate job as its users run it: ``accelerate launch --num_processes 4 accelerate_job.py FAULT``.

One fault on rank ``--bad-rank`` at step 2: ``stall`` (a data step that never ends),
``raise`` (an exception in the loop), ``mismatch`` (``accelerator.gather`` of a tensor of
another size), or ``none``.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["none", "stall", "raise", "mismatch"])
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    rank = accelerator.process_index
    for step, (x, y) in enumerate(data):
        if step == args.steps:
            break
        bad = rank == args.bad_rank and step == 2
        if bad and args.fault == "stall":
            time.sleep(3600)  # FAULT stall
        if bad and args.fault == "raise":
            raise ValueError("corrupt batch")  # FAULT raise
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if args.fault == "mismatch" and step == 2:
            size = 3 if rank == args.bad_rank else 2
            accelerator.gather(torch.ones(size))  # FAULT mismatch
        accelerator.reduce(loss.detach(), reduction="mean")
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
