"""What flightrec's DDP hook adds per gradient bucket, paired in one process.

One process, a 1-rank gloo group, two identical DDP models stepped in alternation: one keeps
DDP's own C++ all-reduce hook, the other gets the hook flightrec registers by default
(``ddp_allreduce_passthrough_recorded_by_flightrec``, through the recorded ``all_reduce``).
Each step's time is paired with its neighbour's of the other model, so a change of machine
load moves both alike; the difference over the buckets per step is the hook's cost per
bucket (a Python call, the recorded all-reduce, and the callback that hands DDP its result).
Run with ``FLIGHTREC=1`` (the recorder traces the process as it traces a job):

    FLIGHTREC=1 python benchmarks/ddp_hook_cost.py [--steps 2000] [--buckets 8]

Prints the median step time of each model, the median paired difference and per bucket.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def model(buckets: int) -> torch.nn.Module:
    # Layers of 128 x 128 floats (64 KB each, 65 KB with the bias): one per bucket.
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(buckets)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--hook", choices=["flightrec", "torch"], default="flightrec",
        help="the Python hook to price: flightrec's, or torch's own allreduce_hook",
    )  # fmt: skip
    opts = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("PORT", "29533"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    if opts.hook == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as hook
    else:
        from flightrec.recorder.hooks.ddp import (
            ddp_allreduce_passthrough_recorded_by_flightrec as hook,
        )

    cap = 66_000 / 2**20  # one layer per bucket
    # Registered explicitly on both (flightrec then leaves each model's hook as it is):
    # torch's builtin C++ all-reduce, and the function flightrec registers by default.
    plain = DDP(model(opts.buckets), bucket_cap_mb=cap)
    plain._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    hooked = DDP(model(opts.buckets), bucket_cap_mb=cap)
    hooked.register_comm_hook(None, hook)
    x = torch.randn(4, 128)

    def step(m: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        m(x).sum().backward()
        return time.perf_counter() - t0

    for _ in range(opts.warmup):
        step(plain)
        step(hooked)
    a, b = [], []
    for i in range(opts.steps):
        if i % 2:
            a.append(step(plain))
            b.append(step(hooked))
        else:
            b.append(step(hooked))
            a.append(step(plain))
    diff = [y - x for x, y in zip(a, b, strict=True)]
    per = statistics.median(diff) / opts.buckets
    print(f"{opts.buckets} buckets a step, {opts.steps} paired steps, 1-rank gloo, "
          f"FLIGHTREC={os.environ.get('FLIGHTREC', '')!r}, hook: {opts.hook}'s")  # fmt: skip
    print(f"  DDP's C++ hook:      median step {statistics.median(a) * 1e6:8.1f} us")
    print(
        f"  {opts.hook + chr(39) + 's hook:':<20} median step {statistics.median(b) * 1e6:8.1f} us"
    )
    print(f"  paired difference:   median {statistics.median(diff) * 1e6:+8.1f} us a step, "
          f"{per * 1e6:+.1f} us a bucket")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
