"""A DeepSpeed job on CPU as its users run it: ``torchrun --nproc-per-node 4 deepspeed_job.py FAULT``.

DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) talks gloo where oneCCL is not
installed. ZeRO stage 1 with a torch optimizer (DeepSpeed's CPU Adam would compile a C++ op
first). One fault on rank ``--bad-rank`` at step 2: ``stall`` (a data step that never ends),
``mismatch`` (``deepspeed.comm.all_reduce`` of a tensor of another size), or ``none``.
"""

from __future__ import annotations

import argparse
import time

import deepspeed
import deepspeed.comm as ds_comm
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["none", "stall", "mismatch"])
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), config=config
    )
    rank = ds_comm.get_rank()
    for step in range(args.steps):
        bad = rank == args.bad_rank and step == 2
        if bad and args.fault == "stall":
            time.sleep(3600)  # FAULT stall
        loss = nn.functional.mse_loss(engine(torch.randn(4, 8)), torch.randn(4, 1))
        engine.backward(loss)
        engine.step()
        if args.fault == "mismatch" and step == 2:
            size = 3 if rank == args.bad_rank else 2
            ds_comm.all_reduce(torch.ones(size))  # FAULT mismatch
        ds_comm.all_reduce(loss.detach())
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
