"""A 1-rank NCCL job for a machine with one GPU (NCCL refuses two ranks on one device).

``stall``: healthy calls, then a kernel that spins about 12 s queued before an all_reduce on the
same stream; with ``FLIGHTREC=1 FLIGHTREC_TIMEOUT=3`` the watchdog declares the hang while the
all_reduce is issued by the CPU and not completed on the GPU, and the verdict says so.

``cost``: the per-call time of a 1-rank all_reduce of 256 floats, 7 runs of 2,000 calls, the
median printed; run it untraced, with PyTorch's recorder and with ``FLIGHTREC=1``, interleaved
(``benchmarks/gpu_check.sh`` does).

Run: ``MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python benchmarks/nccl_job.py stall|cost``
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    mode = sys.argv[1]
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    torch.cuda.synchronize()
    if mode == "stall":
        torch.cuda._sleep(24_000_000_000)  # about 12 s of GPU spin (cycles, at about 2 GHz)
        t0 = time.monotonic()
        dist.all_reduce(t)  # returns at once: queued behind the kernel
        print(f"all_reduce returned after {time.monotonic() - t0:.3f} s", flush=True)
        time.sleep(float(os.environ.get("STALL_WAIT", "9")))  # the watchdog fires meanwhile
        torch.cuda.synchronize()
    elif mode == "cost":
        x = torch.ones(256, device="cuda")
        for _ in range(200):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        per = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) / 2000 * 1e6)
        label = os.environ.get("LABEL", "")
        runs = ", ".join(f"{p:.2f}" for p in per)
        print(f"COST {label} median {statistics.median(per):.2f} us/call (runs {runs})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
