"""The user's harness of issue 15, verbatim: per-call time of a 1-element all_reduce on a 1-rank
gloo group, called from 16 frames deep (``step`` from ``train`` under 14 ``nest`` frames).

Run it in a fresh process with ``PORT`` set (and ``FLIGHTREC=1`` to trace it); it prints the
best of 5 batches of 5,000 calls in µs per call. ``bench_recorder.py`` drives it.
"""

import os
import time

import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(1)


def step(t):  # type: ignore[no-untyped-def]
    dist.all_reduce(t)


def train(n):  # type: ignore[no-untyped-def]
    for _ in range(n):
        step(t)


def nest(depth, fn):  # type: ignore[no-untyped-def]
    return fn() if depth == 0 else nest(depth - 1, fn)


def measure():  # type: ignore[no-untyped-def]
    train(2000)
    best = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        train(5000)
        best.append((time.perf_counter_ns() - t0) / 5000 / 1000)
    return min(best)


print(nest(14, measure))
dist.destroy_process_group()
