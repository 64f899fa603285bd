"""A Lightning job as its users run it: ``python lightning_job.py FAULT --strategy ddp``.

Lightning's own launcher starts the other three ranks (it runs this script again in each);
``FLIGHTREC=1`` in the environment traces every rank. ``--strategy fsdp`` shards the model with
FSDP2 (``fully_shard``) under Lightning's ``ModelParallelStrategy``: Lightning's ``"fsdp"``
strategy (FSDP1) refuses to run without a GPU. One fault on rank ``--bad-rank`` at
step 2: ``stall`` (sleeps in ``training_step``), ``raise`` (an exception there), ``mismatch``
(``self.all_gather`` of a tensor of another size), or ``none``.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset


class Net(L.LightningModule):
    def __init__(self, fault: str, bad_rank: int) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.fault, self.bad_rank = fault, bad_rank

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        bad = self.global_rank == self.bad_rank and index == 2
        if bad and self.fault == "stall":
            time.sleep(3600)  # FAULT stall
        if bad and self.fault == "raise":
            raise ValueError("corrupt batch")  # FAULT raise
        if self.fault == "mismatch" and index == 2:
            size = 3 if self.global_rank == self.bad_rank else 2
            self.all_gather(torch.ones(size))  # FAULT mismatch
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["none", "stall", "raise", "mismatch"])
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    ranks = int(os.environ.get("JOB_RANKS", "4"))
    strategy = (
        ModelParallelStrategy(data_parallel_size=ranks, tensor_parallel_size=1)
        if args.strategy == "fsdp"
        else args.strategy
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=ranks, strategy=strategy,
        max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Net(args.fault, args.bad_rank), DataLoader(data, batch_size=4))
    print(f"rank {trainer.global_rank}: done", flush=True)


if __name__ == "__main__":
    main()
