"""Jobs whose verdict must name the cause and fold what it explains (issue 31, points 4, 6, 8).

Run one process per rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun does).
With ``--native DIR`` the job runs under PyTorch's own Flight Recorder instead of flightrec's
(TORCH_FR_BUFFER_SIZE set by the caller) and every rank writes its native dump by hand (gloo
has no dump on timeout) into DIR, as ``<DIR>/pickle/_dump_<rank>`` and
``<DIR>/json/<host>_trace.<rank>`` — names no tool would guess.

Scenarios:
  moe_stale   an MoE dispatch: every step all_to_all_single with per-rank split sizes, then an
              all_reduce; at step 3 ``--culprit`` passes last step's split sizes (stale), so
              what it sends and expects disagrees with what its peers expect and send. Gloo aborts one
              side of the exchange; the others' connections are reset.
  hang        a few all_reduce steps, then ``--culprit`` sits in ``load_batch`` (a sleep) while
              the others wait in the next all_reduce until gloo's timeout kills them.
  subgroups   ``new_subgroups(2)``; ``--culprit`` never enters its subgroup's all_reduce at step
              3, so its partner waits there (then in the next world all_reduce, the others).
  p2p_pair    a pipeline pair: rank 2 sends a microbatch to rank 3 each step (isend/irecv);
              at step 3 rank 2 sits in ``load_batch`` and rank 3 waits in its irecv.

Progress markers on stdout: READY, STUCK, DONE.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_batch(seconds: float) -> None:
    """A data loader that hangs (a dead storage mount, say)."""
    print("STUCK", flush=True)
    time.sleep(seconds)


def dispatch(tokens: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
    """Send each expert's tokens to the rank that holds it (MoE all-to-all dispatch)."""
    out = torch.empty(sum(recv_splits))
    dist.all_to_all_single(out, tokens, recv_splits, send_splits)
    return out


def splits_for(step: int, rank: int, world: int) -> list[int]:
    """Tokens rank ``rank`` routes to each peer at ``step`` (changes every step; the tokens
    it keeps for its own experts do not)."""
    return [2 if peer == rank else 1 + (step + rank + peer) % 3 for peer in range(world)]


def moe_stale(args: argparse.Namespace, rank: int, world: int) -> None:
    stale: tuple[list[int], list[int]] | None = None
    for step in range(5):
        send = splits_for(step, rank, world)
        recv = [splits_for(step, peer, world)[rank] for peer in range(world)]
        if rank == args.culprit and step == 3 and stale is not None:
            send, recv = stale  # the bug: last step's routing table reused
        stale = (send, recv)
        dispatch(torch.ones(sum(send)), send, recv)
        dist.all_reduce(torch.ones(4))


def hang(args: argparse.Namespace, rank: int, world: int) -> None:
    t = torch.ones(4)
    for step in range(5):
        if rank == args.culprit and step == 3:
            load_batch(args.stall)
        dist.all_reduce(t)


def subgroups(args: argparse.Namespace, rank: int, world: int) -> None:
    mine, _ = dist.new_subgroups(2)
    t = torch.ones(4)
    for step in range(5):
        if rank == args.culprit and step == 3:
            load_batch(args.stall)
        else:
            dist.all_reduce(t, group=mine)
        dist.all_reduce(t)


def p2p_pair(args: argparse.Namespace, rank: int, world: int) -> None:
    t = torch.ones(4)
    for step in range(5):
        dist.all_reduce(t)
        if rank == 2:
            if step == 3:
                load_batch(args.stall)
            dist.isend(torch.ones(3), dst=3).wait()
        elif rank == 3:
            dist.irecv(torch.zeros(3), src=2).wait()


SCENARIOS = {"moe_stale": moe_stale, "hang": hang, "subgroups": subgroups, "p2p_pair": p2p_pair}


def write_native(folder: str, rank: int) -> None:
    """This rank's native dumps, under names only their content identifies."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    host = socket.gethostname().split(".")[0] or "host"
    for form, name, data in (
        ("pickle", f"_dump_{rank}", _dump_fr_trace),
        ("json", f"{host}_trace.{rank}", _dump_fr_trace_json),
    ):
        os.makedirs(os.path.join(folder, form), exist_ok=True)
        with open(os.path.join(folder, form, name), "wb") as f:
            f.write(data())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--stall", type=float, default=30.0)
    parser.add_argument("--pg-timeout", type=float, default=3.0)
    parser.add_argument("--native", default="")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Meet on a store with a long timeout first: ranks finish importing torch seconds apart on
    # a loaded machine, and only the faulty step may time out.
    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    else:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
            timeout=timedelta(seconds=60),
        )  # fmt: skip
        store.set(f"ready/{rank}", "1")
        store.wait([f"ready/{r}" for r in range(world)])
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world,
            timeout=timedelta(seconds=args.pg_timeout),
        )  # fmt: skip
    print("READY", flush=True)
    if args.native:
        # Native dumps are written by hand once the faulty step has failed (gloo has no dump on
        # timeout); the exception is what a real job would die of.
        with contextlib.suppress(RuntimeError):
            SCENARIOS[args.scenario](args, rank, world)
        write_native(args.native, rank)
        os._exit(0)
    SCENARIOS[args.scenario](args, rank, world)
    print("DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
