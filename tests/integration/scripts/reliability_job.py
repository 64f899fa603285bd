"""A small deterministic training job run under faults, for flightrec's reliability tests.

Every rank trains a tiny linear model with its own seeded generator, averaging gradients with
all_reduce, then prints ``RESULT <sha256>`` of its final tensors: the tests compare that line
between a traced run with a fault and an untraced run of the same arguments. The script never
imports flightrec except where a fault needs its API (``--fault dump-storm`` calls
``flightrec.dump()``; ``--fault internal-*`` patches a recorder internal to raise).

Workloads (``--workload``):
  serial   one training loop on the default group.
  threads  eight threads, each training its own model on its own process group, at once.
  nodist   imports torch.distributed but never initializes it (one process, no collectives).
  ddp      a DistributedDataParallel model with several gradient buckets per step (traced, its
           buckets go through flightrec's recording hook: the weights must not change).
  reference  the four above one after the other, printing ``REFERENCE <workload> <hex>``.

Faults (``--fault``), acted out inside the job:
  none            nothing (the test changes the environment instead: dump folder, file size).
  dump-storm      a helper thread sends SIGUSR1 bursts while the main thread calls
                  ``flightrec.dump()`` between steps: signals arrive during dumps.
  fork            ``os.fork()`` while a helper thread dumps in a loop; the child does tensor
                  work, calls ``flightrec.dump()`` and exits through ``sys.exit`` (atexit runs).
  internal-start  ``SignalHandlers.install`` raises (inside ``init_process_group``'s wrapper).
  internal-pre    ``GroupRegistry.get`` raises (before the collective runs).
  internal-post   ``Tracker.track`` raises (after an async collective returned).
  gil-wedge       rank 1 holds the GIL in a 30 s C call at step 5 (``wedged_in_c_call``).
  dump-forever    ``--fill`` all_reduces, then ``flightrec.dump()`` in a loop until killed.
Other options: ``--straggle S`` (rank 1 sleeps S seconds before step 5, so short
FLIGHTREC_TIMEOUTs fire the watchdog), ``--store HOST:PORT`` (join an external TCPStore
instead of hosting one on rank 0), ``--go-file PATH`` (after READY, wait until PATH exists),
``--fsize N`` (RLIMIT_FSIZE of N bytes, SIGXFSZ ignored: every write past N bytes fails with
EFBIG, as on a full disk), ``--extra-calls N`` (N more all_reduces after the checksum), ``--linger
S`` (sleep S seconds before leaving the process group).

Progress markers on stdout: READY, CHILD_EXIT <how> <status>, WEDGED, DUMPED <n>,
RESULT <hex>, REFERENCE <workload> <hex>, DONE.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

STEPS = 12
THREADS = 8


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--workload",
        choices=["serial", "threads", "nodist", "ddp", "reference"],
        default="serial",
    )
    p.add_argument(
        "--fault",
        choices=[
            "none",
            "dump-storm",
            "fork",
            "internal-start",
            "internal-pre",
            "internal-post",
            "gil-wedge",
            "dump-forever",
        ],
        default="none",
    )
    p.add_argument("--straggle", type=float, default=0.0)
    p.add_argument("--store", default="")
    p.add_argument("--go-file", default="")
    p.add_argument("--fsize", type=int, default=0)
    p.add_argument("--fill", type=int, default=10000)
    p.add_argument("--linger", type=float, default=0.0)
    p.add_argument("--extra-calls", type=int, default=0)
    p.add_argument("--pg-timeout", type=float, default=20.0)
    return p.parse_args()


ARGS = parse()
if ARGS.fsize:
    # Before torch is imported: the recorder starts (and creates its black box) on import.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (ARGS.fsize, ARGS.fsize))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)


def checksum(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(bytes(t.detach().contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


def train(seed: int, group: Any = None, before_step: Any = None) -> list[torch.Tensor]:
    """A few SGD steps of y = xW + b with gradients averaged over ``group``."""
    world = dist.get_world_size(group)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 4, generator=g)
    b = torch.zeros(4)
    dist.broadcast(w, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    rank_g = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    for step in range(STEPS):
        if before_step is not None:
            before_step(step)
        x = torch.randn(8, 16, generator=rank_g)
        y = torch.randn(8, 4, generator=rank_g)
        w.requires_grad_(True)
        b.requires_grad_(True)
        loss = ((x @ w + b - y) ** 2).mean()
        gw, gb = torch.autograd.grad(loss, (w, b))
        work = dist.all_reduce(gw, group=group, async_op=True)  # async: the Work is tracked
        dist.all_reduce(gb, group=group)
        work.wait()
        with torch.no_grad():
            w = (w - 0.1 * gw / world).detach()
            b = (b - 0.1 * gb / world).detach()
    gathered = [torch.empty(4) for _ in range(world)]
    dist.all_gather(gathered, b, group=group)
    return [w, b, *gathered]


def straggle(step: int) -> None:
    if ARGS.straggle and step == 5 and dist.get_rank() == 1:
        time.sleep(ARGS.straggle)


STEP_HOOKS = [straggle]
"""Called before every step of the serial workload (faults add theirs)."""


def serial() -> list[torch.Tensor]:
    return train(7, before_step=lambda step: [hook(step) for hook in STEP_HOOKS])


def threaded() -> list[torch.Tensor]:
    # Groups are created in the same order on every rank, from the main thread; each thread
    # then owns one group, so collectives of different threads never interleave on a group.
    groups = [dist.new_group(list(range(dist.get_world_size()))) for _ in range(THREADS)]
    results: list[list[torch.Tensor]] = [[] for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def worker(i: int) -> None:
        barrier.wait()  # start together: the point is eight threads in collectives at once
        results[i] = train(100 + i, groups[i])

    threads = [threading.Thread(target=worker, args=(i,), name=f"trainer-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [t for r in results for t in r]


def nodist() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(32, 32, generator=g)
    for _ in range(20):
        a = torch.tanh(a @ a.T / 32)
    return [a, torch.tensor([float(dist.is_available()), float(dist.is_initialized())])]


# -- faults --------------------------------------------------------------------------------
def start_dump_storm() -> threading.Event:
    """SIGUSR1 bursts at this process while the main thread dumps through the API."""
    import flightrec

    stop = threading.Event()

    def burst() -> None:
        while not stop.wait(0.02):
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=burst, name="signal-burst", daemon=True).start()
    STEP_HOOKS.append(lambda step: flightrec.dump(f"step {step}"))
    return stop


def fork_during_dump() -> None:
    """Fork while another thread is inside a dump; the children must neither hang nor write.

    The first child does tensor work, calls ``flightrec.dump()`` and exits through
    ``sys.exit`` (so atexit handlers run); the second sends itself SIGTERM, which must kill it
    at once as it would untraced, and reach no one else.
    """
    stop = threading.Event()
    flightrec: Any = None
    if os.environ.get("FLIGHTREC") == "1":
        import flightrec

    def dump_loop() -> None:
        while not stop.is_set():
            if flightrec is not None:
                flightrec.dump("loop")
            time.sleep(0.002)

    t = threading.Thread(target=dump_loop, name="dump-loop", daemon=True)
    t.start()
    time.sleep(0.2)
    for how in ("exit", "sigterm"):
        pid = os.fork()
        if pid == 0:
            a = torch.ones(64, 64)
            for _ in range(10):
                a = a @ a / 64
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            written = flightrec.dump("from the child") if flightrec is not None else None
            sys.exit(0 if written is None else 5)  # atexit runs: exit dump and black box code
        deadline = time.monotonic() + 15
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("CHILD_EXIT", how, os.waitstatus_to_exitcode(status), flush=True)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print("CHILD_EXIT", how, "hung", flush=True)
                break
            time.sleep(0.05)
    stop.set()
    t.join(10)


def wedged_in_c_call() -> None:
    """Stands for a C extension that holds the GIL for a long time: no Python thread runs."""
    import ctypes

    print("WEDGED", flush=True)
    ctypes.PyDLL(None).sleep(30)  # PyDLL keeps the GIL during the call (CDLL would release it)


def wedge_rank_1(step: int) -> None:
    if step == 5 and dist.get_rank() == 1:
        wedged_in_c_call()


def dump_forever(fill: int) -> None:
    """Fill the ring with ``fill`` calls, then write (large) dumps until killed."""
    import flightrec

    t = torch.ones(4)
    for _ in range(fill):
        dist.all_reduce(t)
    n = 0
    while True:
        flightrec.dump("loop")
        n += 1
        print("DUMPED", n, flush=True)


def inject_internal_error(where: str) -> None:
    """Make one recorder internal raise on every call (a bug in flightrec, simulated)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected recorder fault")

    if where == "start":
        from flightrec.recorder.signals import SignalHandlers

        SignalHandlers.install = broken  # type: ignore[method-assign]
    elif where == "pre":
        from flightrec.recorder.hotpath.groups import GroupRegistry

        GroupRegistry.get = broken  # type: ignore[method-assign]
    else:
        from flightrec.recorder.recording.completion import Tracker

        Tracker.track = broken  # type: ignore[method-assign]


def ddp() -> list[torch.Tensor]:
    """SGD on a DDP model whose gradients (per rank, different data) are averaged in buckets."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    wrapped = DistributedDataParallel(model, bucket_cap_mb_list=[0.0005] * 3)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((wrapped(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def references() -> None:
    """Every workload's checksum in one (untraced) run: what the faults are compared with."""
    print("REFERENCE nodist", checksum(nodist()), flush=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=ARGS.pg_timeout))
    print("REFERENCE serial", checksum(serial()), flush=True)
    print("REFERENCE threads", checksum(threaded()), flush=True)
    print("REFERENCE ddp", checksum(ddp()), flush=True)
    dist.destroy_process_group()
    print("DONE", flush=True)


def main() -> None:
    if ARGS.workload == "reference":
        references()
        return
    if ARGS.workload == "nodist":
        print("RESULT", checksum(nodist()), flush=True)
        # Whether tracing was really on: the collectives are flightrec's wrappers (a C Site
        # object or a function compiled as "<flightrec wrapper ...>"), looked at, not imported.
        f = dist.all_reduce
        code = getattr(f, "__code__", None)
        wrapped = "flightrec" in type(f).__module__ or (
            code is not None and code.co_filename.startswith("<flightrec")
        )
        print("TRACED", wrapped, flush=True)
        print("DONE", flush=True)
        return
    timeout = timedelta(seconds=ARGS.pg_timeout)
    if ARGS.store:
        host, port = ARGS.store.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))  # type: ignore[attr-defined]
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        if ARGS.fault == "internal-start":
            inject_internal_error("start")  # fails inside init_process_group's wrapper
        dist.init_process_group("gloo", timeout=timeout)
    if ARGS.fault in ("internal-pre", "internal-post"):
        inject_internal_error(ARGS.fault.split("-", 1)[1])
    stop = start_dump_storm() if ARGS.fault == "dump-storm" else None
    if ARGS.fault == "gil-wedge":
        STEP_HOOKS.append(wedge_rank_1)
    if ARGS.fault == "dump-forever":
        dump_forever(ARGS.fill)
    workload = {"threads": threaded, "ddp": ddp}.get(ARGS.workload, serial)
    if ARGS.workload == "serial":
        dist.barrier()  # every group exists before the store may go away
    print("READY", flush=True)
    if ARGS.go_file:
        deadline = time.monotonic() + 20
        while not os.path.exists(ARGS.go_file) and time.monotonic() < deadline:
            time.sleep(0.05)
    if ARGS.fault == "fork":
        fork_during_dump()
    tensors = workload()
    if stop is not None:
        stop.set()
    print("RESULT", checksum(tensors), flush=True)
    scratch = torch.ones(4)
    for _ in range(ARGS.extra_calls):  # more ring entries (outside the checksum)
        dist.all_reduce(scratch)
    time.sleep(ARGS.linger)  # time for the watchdog to look at what was recorded
    dist.destroy_process_group()  # leaving gloo to the interpreter's exit may abort
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
