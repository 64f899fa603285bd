"""Training steps whose collectives flightrec's Python hooks cannot see, for issue 16's tests.

One process per rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them), traced
by FLIGHTREC=1 alone. Every case runs ``--steps`` steps on 4 ranks; with ``--stall-rank`` that
rank sits in ``stalled_data_loader()`` at step ``--stall-step`` instead of running it.

Cases:
  tp         DTensor tensor parallelism on a 2-D mesh (dp x tp = 2 x 2): ColwiseParallel and
             RowwiseParallel, and the loss all-reduced over dp with a functional collective.
  compiled   a step function built on functional collectives, compiled with torch.compile
             (inductor on CPU).
  ddp_hook   DDP with the builtin C++ ALLREDUCE comm hook.
  ddp_unused DDP with find_unused_parameters=True and a branch that leaves a layer unused.
  fsdp_tp    FSDP2 (fully_shard over dp) plus tensor parallelism (over tp) on one 2-D mesh.

Progress markers on stdout: GROUPS <json> (torch's group names of this rank's tp and dp
groups), STEP <n>, STALLING, DONE.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

Step = Callable[[int], None]


def stalled_data_loader() -> None:
    """Stands for a data loader that never returns: a rank stuck outside any collective."""
    while True:
        time.sleep(0.05)


class MLP(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.spare = nn.Linear(8, 8) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _mesh() -> tuple[object, dict[str, str]]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    names = {dim: mesh[dim].get_group().group_name for dim in ("dp", "tp")}
    return mesh, names


def _tp_plan() -> dict[str, object]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def tensor_parallel() -> tuple[Step, dict[str, str]]:
    from torch.distributed.tensor.parallel import parallelize_module

    mesh, names = _mesh()
    model = parallelize_module(MLP(), mesh["tp"], _tp_plan())  # type: ignore[index]
    dp = mesh["dp"].get_group()  # type: ignore[index]
    dp_index = dist.get_rank() // 2

    def step(n: int) -> None:
        torch.manual_seed(100 * n + dp_index)  # one batch per tp pair
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        funcol.all_reduce(loss.detach(), "sum", dp).wait()

    return step, names


def compiled() -> tuple[Step, dict[str, str]]:
    world = dist.group.WORLD

    @torch.compile(backend="inductor", fullgraph=True)
    def reduce_step(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", world)
        return funcol.wait_tensor(y) + 1

    def step(n: int) -> None:
        reduce_step(torch.full((4,), float(n)))

    return step, {"world": dist.group.WORLD.group_name}  # type: ignore[union-attr]


def ddp(unused: bool) -> tuple[Step, dict[str, str]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(MLP(unused), find_unused_parameters=unused)
    if not unused:
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(n: int) -> None:
        torch.manual_seed(n)
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()

    return step, {"world": dist.group.WORLD.group_name}  # type: ignore[union-attr]


def fsdp_tp() -> tuple[Step, dict[str, str]]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh, names = _mesh()
    model = parallelize_module(MLP(), mesh["tp"], _tp_plan())  # type: ignore[index]
    fully_shard(model, mesh=mesh["dp"])  # type: ignore[index]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dp_index = dist.get_rank() // 2

    def step(n: int) -> None:
        torch.manual_seed(100 * n + dp_index)
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()

    return step, names


CASES: dict[str, Callable[[], tuple[Step, dict[str, str]]]] = {
    "tp": tensor_parallel,
    "compiled": compiled,
    "ddp_hook": lambda: ddp(False),
    "ddp_unused": lambda: ddp(True),
    "fsdp_tp": fsdp_tp,
}


def native_dumps_on_request() -> None:
    """With NATIVE_DUMP_TRIGGER and NATIVE_DUMP_DIR set: once the trigger file exists, write
    PyTorch's own dump of this process (pickle, ``rank_<r>``) into the folder, from a thread,
    as torch's recorder would, so a test can mix native and flightrec dumps of one job."""
    trigger, folder = os.environ.get("NATIVE_DUMP_TRIGGER"), os.environ.get("NATIVE_DUMP_DIR")
    if not trigger or not folder:
        return

    def wait_and_dump() -> None:
        while not os.path.exists(trigger):
            time.sleep(0.05)
        data = torch._C._distributed_c10d._dump_fr_trace(
            includeCollectives=True, includeStackTraces=True, onlyActive=False
        )
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank_{dist.get_rank()}")
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        print("NATIVE_DUMPED", flush=True)

    threading.Thread(target=wait_and_dump, name="native-dumper", daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--stall-step", type=int, default=2)
    parser.add_argument("--pg-timeout", type=float, default=120.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    step, groups = CASES[args.case]()
    print("GROUPS", json.dumps(groups), flush=True)
    native_dumps_on_request()
    for n in range(args.steps):
        if rank == args.stall_rank and n == args.stall_step:
            print("STALLING", flush=True)
            stalled_data_loader()
        step(n)
        print("STEP", n, flush=True)
    print("DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
