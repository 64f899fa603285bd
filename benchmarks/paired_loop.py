"""flightrec's hooks alone, measured in one process: the user's loop (``user_loop.py``: a
1-element all_reduce on a 1-rank gloo group, ``step(t)`` called 16 frames deep) run in
alternating batches through the traced ``dist.all_reduce`` and through torch's original, which
the wrapper keeps. Both see the same process, the same torch state (PyTorch's recorder as
configured) and the same machine load, so the per-round difference is the hooks' cost, far
steadier on a busy machine than comparing fresh processes.

With ``HELPER=1`` the loop calls the collective through one more function (``step`` ->
``reduce`` -> all_reduce). Run it with ``FLIGHTREC=1`` and ``PORT`` set; it prints the median
over rounds of the per-round difference in µs per call (the traced batch's time minus the
original's).
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(1)
traced = dist.all_reduce
original = getattr(traced, "__flightrec_original__", None)
if original is None:
    sys.exit("dist.all_reduce is not traced: run with FLIGHTREC=1")


def reduce(fn, t):  # type: ignore[no-untyped-def]
    fn(t)


if os.environ.get("HELPER"):
    # One helper more (HELPER=1): the collective's caller is ``reduce``, whose caller ``step``
    # is a new activation at every call, as with a loss or metric reduced in a helper.
    def step_traced(t):  # type: ignore[no-untyped-def]
        reduce(traced, t)

    def step_original(t):  # type: ignore[no-untyped-def]
        reduce(original, t)

else:

    def step_traced(t):  # type: ignore[no-untyped-def]
        traced(t)

    def step_original(t):  # type: ignore[no-untyped-def]
        original(t)


def train(step, n):  # type: ignore[no-untyped-def]
    for _ in range(n):
        step(t)


def nest(depth, fn):  # type: ignore[no-untyped-def]
    return fn() if depth == 0 else nest(depth - 1, fn)


def batch(step, n=5000):  # type: ignore[no-untyped-def]
    train(step, 500)
    t0 = time.perf_counter_ns()
    train(step, n)
    return (time.perf_counter_ns() - t0) / n / 1000


diffs = []
for _ in range(int(os.environ.get("ROUNDS", "15"))):
    a = nest(14, lambda: batch(step_original))
    b = nest(14, lambda: batch(step_traced))
    diffs.append(b - a)
print(statistics.median(diffs))
dist.destroy_process_group()
