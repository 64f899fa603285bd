"""A 4-rank job on a backend without a recorder of its own, dumped by torch's own file writer.

Usage: python hook_job.py SCENARIO OUT_DIR [LAYOUT]

Needs torch 2.15 or later. From 2.15 on, torch attaches its hook-based recorder
(``FlightRecorderHook``) to every group whose backend does not record itself: NCCL through
torchcomms ("nccl2", the default NCCL on 2.15), MPI, UCC, out-of-tree plugins. Its entries are
named ``<backend>:<op>``, and carry no start or completion times (the hook has no GPU events).
Here the backend is ``relay``: a plugin registered the way out-of-tree backends are, which
forwards every call to a gloo group of its own, so that the hook, not gloo, records the job.

Scenarios (two healthy steps, then the faulty one):
  hang      rank 2 never enters step 3's all_reduce (busy elsewhere);
  mismatch  rank 1 all-reduces 8 elements where the others all-reduce 4.

Layouts (how the files are named, all written by torch's ``_dump_fr_trace_file``):
  plain   ``OUT_DIR/comm_lib_trace_rank_<rank>`` (TORCH_FR_DUMP_TEMP_FILE, torch's default
          prefix);
  torchft two replica groups of two ranks, each with a default group of its own, in two
          quorums, as torchft's Manager lays them out: TORCH_FR_DUMP_DYNAMIC_FILE_NAME=1 and
          TORCH_FR_DUMP_TEMP_FILE=``OUT_DIR/trace_quorum_<quorum>/<global rank>``; quorum 1 is
          healthy, the fault is in quorum 2 (its global ranks: replica * 2 + group rank).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time

TIMEOUT_S = float(os.environ.get("FR_JOB_TIMEOUT_S", "3"))


def _relay_backend() -> type:
    from torch._C._distributed_c10d import Backend
    from torch.distributed import ProcessGroupGloo

    class Relay(Backend):  # type: ignore[misc]
        """Forwards every call to a gloo group of its own (gloo's recorder sees nothing of
        the job's groups: torch's hook records them)."""

        def __init__(self, store: object, rank: int, size: int, timeout: object) -> None:
            super().__init__(rank, size)
            self.inner = ProcessGroupGloo(store, rank, size, timeout)

        def allreduce(self, tensors: object, opts: object) -> object:
            return self.inner.allreduce(tensors, opts)

        def broadcast(self, tensors: object, opts: object) -> object:
            return self.inner.broadcast(tensors, opts)

        def barrier(self, opts: object) -> object:
            return self.inner.barrier(opts)

        def getBackendName(self) -> str:
            return "relay"

    return Relay


def _faulty(scenario: str, rank: int, t: object) -> None:
    import torch
    import torch.distributed as dist

    if scenario == "hang":
        if rank == 2:
            time.sleep(TIMEOUT_S + 2)
        else:
            dist.all_reduce(t)  # type: ignore[arg-type]
    elif scenario == "mismatch":
        dist.all_reduce(torch.ones(8) if rank == 1 else t)  # type: ignore[arg-type]
    elif scenario != "healthy":
        raise SystemExit(f"unknown scenario {scenario}")


def _steps(scenario: str, rank: int, dump: object) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
        dist.broadcast(t, 0)
    with contextlib.suppress(RuntimeError):  # the timeout a real job would die of
        _faulty(scenario, rank, t)
    dump()  # type: ignore[operator]


def _rank_main(rank: int, world: int, port: int, scenario: str, out: str, layout: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_file

    dist.Backend.register_backend("relay", _relay_backend(), devices=["cpu"])
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if layout == "plain":
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "comm_lib_trace_rank_")
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, datetime.timedelta(seconds=60))
        store.set(f"ready/{rank}", "1")
        store.wait([f"ready/{r}" for r in range(world)])
        dist.init_process_group("relay", store=store, rank=rank, world_size=world, timeout=timeout)
        _steps(scenario, rank, lambda: _dump_fr_trace_file(rank, backend="relay"))
        os._exit(0)
    # torchft: replica groups of 2; each quorum re-creates the replica's default group.
    replica, group_rank = divmod(rank, 2)
    os.environ["TORCH_FR_DUMP_DYNAMIC_FILE_NAME"] = "1"
    for quorum in (1, 2):
        folder = os.path.join(out, f"trace_quorum_{quorum}")
        os.makedirs(folder, exist_ok=True)
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(folder, str(rank))
        store = dist.TCPStore(
            "127.0.0.1", port + replica * 7 + quorum, 2, group_rank == 0,
            datetime.timedelta(seconds=60),
        )  # fmt: skip
        store.set(f"ready/{group_rank}", "1")
        store.wait(["ready/0", "ready/1"])
        faulty = scenario if quorum == 2 else "healthy"
        # The healthy quorum needs no short timeout (only connecting would feel it).
        wait = timeout if faulty != "healthy" else datetime.timedelta(seconds=60)
        dist.init_process_group("relay", store=store, rank=group_rank, world_size=2, timeout=wait)
        _steps(faulty, 2 if (scenario == "hang" and rank == 3) else group_rank,
               lambda: _dump_fr_trace_file(group_rank, backend="relay"))  # fmt: skip
        if quorum == 1:
            dist.destroy_process_group()
            with contextlib.suppress(Exception):
                from torch._C._distributed_c10d import _reset_fr_trace

                _reset_fr_trace(backend="relay")  # what torchft does at each new quorum
    os._exit(0)


def main() -> None:
    import torch.multiprocessing as mp

    scenario, out = sys.argv[1], sys.argv[2]
    layout = sys.argv[3] if len(sys.argv) > 3 else "plain"
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(
        _rank_main, args=(4, port, scenario, out, layout), nprocs=4, start_method="spawn",
        join=False,
    )  # fmt: skip
    for proc in ctx.processes:
        proc.join()
    failed = [i for i, proc in enumerate(ctx.processes) if proc.exitcode != 0]
    if failed:
        raise SystemExit(f"ranks {failed} failed")


if __name__ == "__main__":
    main()
