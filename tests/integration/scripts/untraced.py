"""A gloo "training" job that never imports flightrec, hung in one of several ways, for
``flightrec attach`` (tests/integration/test_attach_live.py). Run with FLIGHTREC unset.

One process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (torchrun, or the
tests' own launcher), or ``--spawn N`` for torch.multiprocessing. The process group's timeout
is long (``--pg-timeout``): the hang lasts while the test attaches.

Scenarios (``--culprit`` is the rank that misbehaves):
  healthy     steps of all_reduce and a little compute, forever; prints STEP n now and then.
  stall       a few steps, then the culprit sits in ``save_checkpoint`` while the others
              wait in the loss all_reduce.
  lock        the culprit blocks on a lock a thread of its own holds for good.
  dataloader  the culprit's DataLoader worker hangs in ``__getitem__``; its main thread
              waits for the batch, the others in the all_reduce.

With ``TORCH_WORKER_SERVER_SOCKET`` set (one path per rank), the job runs inside torch's
``worker_main()``, which serves torch's ring on that socket.

Progress markers on stdout: READY, HUNG (the culprit, once it is stuck), STEP n.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def save_checkpoint() -> None:
    print("HUNG", flush=True)
    time.sleep(3600)  # a write to a filesystem that never returns


def wait_for_lock(lock: threading.Lock) -> None:
    print("HUNG", flush=True)
    lock.acquire()  # held by a thread that never lets go


class Samples(Dataset[torch.Tensor]):
    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.hang and index >= 8:
            time.sleep(3600)  # a read from storage that never returns
        return torch.ones(4)


def train(rank: int, scenario: str, culprit: int) -> None:
    loss = torch.ones(4)
    if scenario == "healthy":
        torch.set_num_threads(1)  # four ranks on two cores: no intra-op threads to contend
        step = 0
        while True:
            step += 1
            x = torch.randn(64, 64)
            for _ in range(20):
                x = torch.tanh(x @ x.T / 64)
            dist.all_reduce(loss)
            if step % 10 == 0:
                print(f"STEP {step}", flush=True)
    if scenario == "dataloader":
        loader = DataLoader(Samples(rank == culprit), batch_size=4, num_workers=1)
        for step, batch in enumerate(loader):
            if step == 1 and rank == culprit:
                print("HUNG", flush=True)  # its worker is stuck on the next batch
            dist.all_reduce(loss + batch.sum())
        return
    for _ in range(3):
        dist.all_reduce(loss)
    if rank == culprit and scenario == "stall":
        save_checkpoint()
    if rank == culprit and scenario == "lock":
        lock = threading.Lock()
        lock.acquire()
        threading.Thread(target=time.sleep, args=(3600,), name="holder", daemon=True).start()
        wait_for_lock(lock)
    dist.all_reduce(loss)  # the loss all_reduce the others wait in


@contextlib.contextmanager
def worker_server() -> Iterator[None]:
    if os.environ.get("TORCH_WORKER_SERVER_SOCKET"):
        from torch.distributed.elastic.control_plane import worker_main

        with worker_main():
            yield
    else:
        yield


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    with worker_server():
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.pg_timeout)
        )
        print("READY", flush=True)
        train(rank, args.scenario, args.culprit)
        dist.destroy_process_group()


def _spawned(index: int, world: int, args: argparse.Namespace) -> None:
    run(index, world, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["healthy", "stall", "lock", "dataloader"])
    parser.add_argument("--culprit", type=int, default=2)
    parser.add_argument("--pg-timeout", type=float, default=300.0)
    parser.add_argument("--spawn", type=int, default=0)
    args = parser.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args.spawn, args), nprocs=args.spawn)
        return
    run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
