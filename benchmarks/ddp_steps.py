"""Steps per second of a DDP model on 4 gloo ranks (CPU), for ``bench_recorder.py``.

Started as a plain script, so that ``FLIGHTREC=1`` in its environment traces it as it traces a
user's job (the start-up hook, in every spawned rank). Prints the slowest rank's steps/s.

``DDP_MODEL=small`` (the default): an MLP of 100 K parameters in buckets of 0.1 MB (four a
step: the most buckets per unit of work, the worst case for a per-bucket cost).
``DDP_MODEL=wide``: 2.2 M parameters (8.8 MB) in DDP's default 25 MB buckets (one a step),
a step of tens of milliseconds.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RANKS = 4
WARMUP = 30
STEPS = 150


def _rank(rank: int, port: int, out: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(0)
    wide = os.environ.get("DDP_MODEL", "small") == "wide"
    width, depth, cap = (1024, 3, 25.0) if wide else (256, 2, 0.1)
    layers: list[torch.nn.Module] = [torch.nn.Linear(128, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    elapsed = time.perf_counter() - t0
    # A tensor, not all_gather_object: that needs numpy, which torch does not install.
    rates = [torch.zeros(1, dtype=torch.float64) for _ in range(RANKS)]
    dist.all_gather(rates, torch.tensor([STEPS / elapsed], dtype=torch.float64))
    if rank == 0:
        out.put(min(float(r) for r in rates))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> None:
    port = int(sys.argv[1])
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(_rank, args=(port, queue), nprocs=RANKS)
    print(queue.get(), flush=True)


if __name__ == "__main__":
    main()
