"""A Ray Train job as its users run it: ``python ray_job.py FAULT --dumps /abs/folder``.

``TorchTrainer`` with four CPU workers. flightrec is turned on where the workers run, through
the job's ``runtime_env``: Ray starts each worker with those variables, and flightrec's
start-up hook traces it. ``FLIGHTREC_DIR`` must be absolute: workers run in folders of Ray's.
One fault on world rank ``--bad-rank`` at step 2: ``stall`` (a data step that never ends),
``raise``, or ``none``. Ray Train runs the training function in a thread of its own.
"""

from __future__ import annotations

import argparse
import os
import time

import ray
import torch
import torch.distributed as dist
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer, prepare_model
from torch import nn


def train_loop(config: dict[str, object]) -> None:
    rank = ray.train.get_context().get_world_rank()
    model = prepare_model(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(config["steps"])):  # type: ignore[call-overload]
        bad = rank == config["bad_rank"] and step == 2
        if bad and config["fault"] == "stall":
            time.sleep(3600)  # FAULT stall
        if bad and config["fault"] == "raise":
            raise ValueError("corrupt batch")  # FAULT raise
        loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(loss.detach())
    print(f"rank {rank}: done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["none", "stall", "raise"])
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dumps", required=True, help="FLIGHTREC_DIR, an absolute path")
    parser.add_argument("--timeout", default="5", help="FLIGHTREC_TIMEOUT")
    args = parser.parse_args()
    env = {
        "FLIGHTREC": "1",
        "FLIGHTREC_DIR": os.path.abspath(args.dumps),
        "FLIGHTREC_TIMEOUT": args.timeout,
        # flightrec from a source tree (the tests'); an installed one needs nothing more
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env})
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"fault": args.fault, "bad_rank": args.bad_rank, "steps": args.steps},
        scaling_config=ScalingConfig(num_workers=4, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
    )
    trainer.fit()
    print("ray job: done", flush=True)


if __name__ == "__main__":
    main()
