"""A transformers ``Trainer`` job as its users run it: ``torchrun --nproc-per-node 4 hf_trainer_job.py FAULT``.

A tiny GPT-2 built from its config (nothing is downloaded). One fault on rank ``--bad-rank``
at step 2: ``stall`` (a callback that never returns), ``raise`` (a callback raises),
``mismatch`` (``self.accelerator.gather`` of a tensor of another size in ``compute_loss``),
or ``none``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(i, i + 16) % 64
        return {"input_ids": ids, "labels": ids}


class Faulty(TrainerCallback):
    def __init__(self, fault: str, bad_rank: int) -> None:
        self.fault, self.bad_rank = fault, bad_rank

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if int(os.environ["RANK"]) != self.bad_rank or state.global_step != 2:
            return
        if self.fault == "stall":
            time.sleep(3600)  # FAULT stall
        if self.fault == "raise":
            raise ValueError("corrupt batch")  # FAULT raise


class GatheringTrainer(Trainer):
    """Gathers a per-rank statistic at step 2 with the Trainer's own accelerator."""

    def __init__(self, *args: Any, fault: str, bad_rank: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault, self.bad_rank = fault, bad_rank

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.fault == "mismatch" and self.state.global_step == 2:
            size = 3 if self.args.process_index == self.bad_rank else 2
            self.accelerator.gather(torch.ones(size))  # FAULT mismatch
        return loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["none", "stall", "raise", "mismatch"])
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(), max_steps=args.steps, per_device_train_batch_size=2,
        use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = GatheringTrainer(
        model=GPT2LMHeadModel(config), args=training, train_dataset=Tokens(),
        callbacks=[Faulty(args.fault, args.bad_rank)], fault=args.fault, bad_rank=args.bad_rank,
    )  # fmt: skip
    trainer.train()
    print(f"rank {training.process_index}: done", flush=True)


if __name__ == "__main__":
    main()
