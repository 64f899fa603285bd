"""A small training job with one injectable fault, used to record the shipped samples.

It never imports flightrec: tracing comes from FLIGHTREC=1 in the environment, as in a real job.
Launched once per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (see generate.py).

Each step looks like a 2-stage toy of a real loop: load a batch, a pipeline exchange between
neighbouring ranks (forward activations to rank+1, gradients back to rank-1), a gradient
all-reduce on the tensor-parallel pair group, and a loss all-reduce on the whole world.

SCENARIO_FAULT picks what goes wrong on rank SCENARIO_RANK at step SCENARIO_FAULT_STEP:
  none           healthy run
  stall          a checkpoint-shard write hangs before the loss all-reduce (outside any collective)
  crash          the process dies hard, as under the OOM killer (SIGKILL)
  op_mismatch    a rank-dependent branch calls broadcast where the others all-reduce the loss
  size_mismatch  the loss tensor has an extra element on one rank
  dtype_mismatch the loss is float64 on one rank, float32 on the others
  p2p_deadlock   the rank waits for its gradient before sending its activations
  subgroup_stall a data-loader wait before the tensor-parallel all-reduce that never ends
  skip_collective a rank-dependent branch skips the tensor-parallel all-reduce on one rank
  extra_collective one rank all-reduces an extra metric (same shape as the loss) on the world
  early_exit     one rank's data runs out a step early (uneven batches): it leaves the loop
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

FAULT = os.environ.get("SCENARIO_FAULT", "none")
CULPRIT = int(os.environ.get("SCENARIO_RANK", "2"))
FAULT_STEP = int(os.environ.get("SCENARIO_FAULT_STEP", "3"))
STEPS = int(os.environ.get("SCENARIO_STEPS", "5"))
HIDDEN = 64


def faulty(rank: int, step: int, kind: str) -> bool:
    return kind == FAULT and rank == CULPRIT and step == FAULT_STEP


def load_batch(rank: int, step: int) -> torch.Tensor:
    time.sleep(0.1)  # a step's compute: a real rank runs a while between its collectives
    return torch.full((HIDDEN,), float(rank + step))


def save_checkpoint_shard(rank: int, step: int, weights: torch.Tensor) -> None:
    if faulty(rank, step, "stall"):
        time.sleep(3600)  # a write to a hung network filesystem that never returns


def pipeline_exchange(rank: int, world: int, step: int, act: torch.Tensor) -> torch.Tensor:
    grad = torch.zeros_like(act)
    if faulty(rank, step, "p2p_deadlock") and rank + 1 < world:
        dist.recv(grad, src=rank + 1)  # waits for a gradient its neighbour cannot send yet
    if rank > 0:
        dist.recv(act, src=rank - 1)
    if rank + 1 < world:
        dist.send(act, dst=rank + 1)
        if not faulty(rank, step, "p2p_deadlock"):
            dist.recv(grad, src=rank + 1)
    if rank > 0:
        dist.send(grad + 1, dst=rank - 1)
    return act + grad


def sync_gradients(rank: int, step: int, grad: torch.Tensor, tp_group: dist.ProcessGroup) -> None:
    if faulty(rank, step, "subgroup_stall"):
        time.sleep(3600)  # waiting on a prefetch queue that is never filled
    if faulty(rank, step, "skip_collective"):
        return  # e.g. "no gradient this step" decided from rank-local state
    dist.all_reduce(grad, group=tp_group)


def reduce_loss(rank: int, step: int, loss: torch.Tensor) -> torch.Tensor:
    if faulty(rank, step, "op_mismatch"):
        dist.broadcast(loss, src=0)  # a rank-dependent branch took the wrong collective
        return loss
    if faulty(rank, step, "size_mismatch"):
        loss = torch.cat([loss, loss])  # an extra metric appended on one rank only
    if faulty(rank, step, "dtype_mismatch"):
        loss = loss.double()
    if faulty(rank, step, "extra_collective"):
        dist.all_reduce(loss.clone())  # a debug metric logged on one rank only
    dist.all_reduce(loss)
    return loss


def train(rank: int, world: int) -> None:
    pairs = [list(range(r, min(r + 2, world))) for r in range(0, world, 2)]
    groups = [dist.new_group(p, group_desc=f"tp{i}") for i, p in enumerate(pairs)]
    tp_group = groups[rank // 2]
    weights = torch.ones(HIDDEN)
    for step in range(STEPS):
        if faulty(rank, step, "early_exit"):
            break  # this rank's shard of the data set is one batch shorter
        batch = load_batch(rank, step)
        act = pipeline_exchange(rank, world, step, batch * weights)
        if faulty(rank, step, "crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        grad = act / world
        sync_gradients(rank, step, grad, tp_group)
        save_checkpoint_shard(rank, step, weights)
        reduce_loss(rank, step, (act * weights).sum().reshape(1))
        weights -= 1e-3 * grad


def main() -> None:
    timeout = timedelta(seconds=float(os.environ.get("SCENARIO_PG_TIMEOUT", "30")))
    dist.init_process_group("gloo", timeout=timeout)
    try:
        train(dist.get_rank(), dist.get_world_size())
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
