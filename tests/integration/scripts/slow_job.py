"""A small gloo "training loop" in which one rank slows down in one of three shapes.

Shapes (``--shape``), from step ``--onset-step`` on, for the rank ``--slow-rank``:

* ``growing``: sleeps ``--grow-ms`` more at every step (a rank slowing step by step);
* ``every``: sleeps ``--delay-ms`` at one step in ``--every`` (slow every k-th step);
* ``halfway``: sleeps ``--delay-ms`` at every step (becomes slow, then stays slow);
* ``none``: a healthy job.

``--ddp``: each step is a DistributedDataParallel step of a small model instead of one
``all_reduce`` (the job's only collectives are DDP's gradient all-reduces; the stop flag of
``--stop-on-line`` travels in a gradient).

The slow rank prints ``ONSET <wall time s>`` when its slowdown starts. Two ways to run it:

* one rank per process, as ``tests/integration/jobs.start_job`` launches it (FLIGHTREC=1
  traces it; the script never imports flightrec);
* ``--runs K --out DIR``: one process that imports torch once, then forks K jobs of
  ``--world`` ranks one after the other (``--stop-on-line``: each ends soon after the line). Each rank's stdout and stderr go to
  ``DIR/run-k/rank-r.log``; while a run goes on, the driver watches rank 0's log for the
  slow check's line and writes ``DIR/run-k/result.json``: the onset (wall time), when the
  first line appeared, and every line. ``--cycle-slow``: run k's slow rank is ``k % world``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MARK = "flightrec: slow rank:"


def extra_s(args: argparse.Namespace, step: int) -> float:
    """The slow rank's extra sleep at ``step`` (seconds)."""
    if args.shape == "none" or step < args.onset_step:
        return 0.0
    k = step - args.onset_step
    if args.shape == "growing":
        return min(args.max_ms, args.grow_ms * (k + 1)) / 1e3
    if args.shape == "every":
        return args.delay_ms / 1e3 if k % args.every == 0 else 0.0
    return args.delay_ms / 1e3


def loop(args: argparse.Namespace, rank: int, slow: int, stop: str = "") -> None:
    """The training loop: a little compute, then an all_reduce; the slow rank sleeps more.

    With ``stop``, rank 0 sets the tensor's first element when that file exists, and every
    rank leaves the loop after the step whose all_reduce carried it (all at the same step)."""
    rng = random.Random(rank)
    t = torch.ones(256)
    print("READY", flush=True)
    step = 0
    while args.steps <= 0 or step < args.steps:
        t[0] = 1.0 if (stop and rank == 0 and os.path.exists(stop)) else 0.0
        time.sleep(args.work_ms / 1e3 * rng.uniform(0.8, 1.2))  # forward/backward
        if rank == slow:
            if step == args.onset_step and args.shape != "none":
                print(f"ONSET {time.time():.3f}", flush=True)
            time.sleep(extra_s(args, step))
        dist.all_reduce(t)
        step += 1
        if step % 50 == 0:
            print(f"STEP {step}", flush=True)
        if t[0] > 0:
            print(f"STOPPED {step}", flush=True)
            break
    dist.barrier()
    print("DONE", flush=True)


def ddp_loop(args: argparse.Namespace, rank: int, slow: int, stop: str = "") -> None:
    """``loop`` with a DDP step in place of the all_reduce: DDP's gradient all-reduces are the
    only collectives until the end. With ``stop``, rank 0 sets the gradient of a flag
    parameter when that file exists; every rank leaves after the step whose all-reduced
    gradient carried it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rng = random.Random(rank)
    torch.manual_seed(0)
    flag = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.register_parameter("flag", flag)
    ddp = DDP(model)
    x = torch.randn(8, 32)
    print("READY", flush=True)
    step = 0
    while args.steps <= 0 or step < args.steps:
        time.sleep(args.work_ms / 1e3 * rng.uniform(0.8, 1.2))  # forward/backward
        if rank == slow:
            if step == args.onset_step and args.shape != "none":
                print(f"ONSET {time.time():.3f}", flush=True)
            time.sleep(extra_s(args, step))
        stopping = 1.0 if (stop and rank == 0 and os.path.exists(stop)) else 0.0
        ddp.zero_grad()
        (ddp(x).pow(2).mean() + flag.sum() * stopping).backward()
        step += 1
        if step % 50 == 0:
            print(f"STEP {step}", flush=True)
        if flag.grad is not None and float(flag.grad[0]) > 0:
            print(f"STOPPED {step}", flush=True)
            break
    dist.barrier()
    print("DONE", flush=True)


def job(args: argparse.Namespace) -> None:
    """One rank of a job launched by torchrun-style environment variables."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    (ddp_loop if args.ddp else loop)(args, dist.get_rank(), args.slow_rank)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(args: argparse.Namespace, run_dir: str, port: int, rank: int, slow: int) -> None:
    log = os.open(os.path.join(run_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(
        FLIGHTREC="1",
        FLIGHTREC_DIR=run_dir,
        RANK=str(rank),
        WORLD_SIZE=str(args.world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import flightrec

    flightrec.enable()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    stop = os.path.join(run_dir, "stop") if args.stop_on_line else ""
    (ddp_loop if args.ddp else loop)(args, rank, slow, stop)
    from flightrec.recorder import runtime

    rt = runtime.current()
    check = rt.peers.slowcheck if rt is not None else None
    if check is not None:  # what the checks cost this rank's flightrec thread
        print(f"SLOWCHECK {rank} {check.checks} {check.cost_s * 1e3:.3f}", flush=True)
    dist.destroy_process_group()


def _watch(run_dir: str, pids: list[int], started: float) -> dict[str, object]:
    """Wait for the run's processes, noting when rank 0's log first shows the line."""
    first: float | None = None
    left = set(pids)
    codes: list[int] = []
    path = os.path.join(run_dir, "rank-0.log")
    while left:
        for pid in list(left):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                left.discard(pid)
                codes.append(os.waitstatus_to_exitcode(status))
        if first is None and os.path.exists(path):
            with open(path, errors="replace") as f:
                if MARK in f.read():
                    first = time.time()
                    with open(os.path.join(run_dir, "stop"), "w"):
                        pass  # (the ranks stop once rank 0 sees it, with --stop-on-line)
        time.sleep(0.05)
    text = ""
    onset = None
    all_lines: list[str] = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("rank-") and name.endswith(".log"):
            with open(os.path.join(run_dir, name), errors="replace") as f:
                body = f.read()
            text += body if name == "rank-0.log" else ""
            all_lines += body.splitlines()
            for line in body.splitlines():
                if line.startswith("ONSET "):
                    onset = float(line.split()[1])
    lines = [ln for ln in text.splitlines() if MARK in ln]
    costs = [ln.split()[1:] for ln in all_lines if ln.startswith("SLOWCHECK ")]
    return {"started": started, "onset": onset, "first_line": first, "lines": lines,
            "codes": codes, "check_costs": costs}  # fmt: skip


def runs(args: argparse.Namespace) -> int:
    """Fork ``args.runs`` jobs one after the other; returns how many failed."""
    failed = 0
    for k in range(args.runs):
        run_dir = os.path.join(args.out, f"run-{k:03d}")
        os.makedirs(run_dir, exist_ok=True)
        port = _free_port()
        slow = k % args.world if args.cycle_slow else args.slow_rank
        pids = []
        started = time.time()
        for rank in range(args.world):
            pid = os.fork()
            if pid == 0:  # the rank: run, then leave without unwinding the parent's stack
                code = 0
                try:
                    _rank(args, run_dir, port, rank, slow)
                except BaseException as e:  # reported through the exit status
                    print(f"rank {rank} of run {k}: {e!r}", file=sys.stderr, flush=True)
                    code = 1
                os._exit(code)
            pids.append(pid)
        result = _watch(run_dir, pids, started)
        result["slow_rank"] = slow
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(result, f)
        failed += int(any(result["codes"]))  # type: ignore[arg-type]
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=("none", "growing", "every", "halfway"), default="none")
    parser.add_argument("--steps", type=int, default=300, help="all_reduces; 0 runs until killed")
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--onset-step", type=int, default=100)
    parser.add_argument("--delay-ms", type=float, default=40.0)
    parser.add_argument("--grow-ms", type=float, default=1.0, help="growing: more per step")
    parser.add_argument("--max-ms", type=float, default=200.0, help="growing: at most this")
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--work-ms", type=float, default=20.0, help="every rank's compute")
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=0, help="fork this many jobs in turn")
    parser.add_argument("--world", type=int, default=4, help="ranks per forked job")
    parser.add_argument("--out", default="", help="folder root for --runs")
    parser.add_argument("--cycle-slow", action="store_true")
    parser.add_argument("--ddp", action="store_true", help="DDP steps instead of all_reduces")
    parser.add_argument(
        "--stop-on-line", action="store_true", help="with --runs: end a run once rank 0 logs a line"
    )
    args = parser.parse_args()
    if args.runs:
        sys.exit(1 if runs(args) else 0)
    job(args)


if __name__ == "__main__":
    main()
