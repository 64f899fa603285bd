"""Per-call cost of numbering a group's collectives as its ProcessGroup does (issue 31).

A group whose numbers parted from torch's (DDP's reducer, FSDP2 or funcol ran collectives
flightrec never saw) reads the ProcessGroup's counter on every recorded call
(``GroupInfo.follow_native``). This measures ``dist.all_reduce`` of a 4-element tensor on a
1-rank gloo group, traced, with the group's counter taking its numbers from:

  own           flightrec's own counter (a group torch has not parted from)
  pg method     ``ProcessGroup._get_sequence_number_for_group`` itself (what a group gets
                while nothing is to be taken off)
  native_seq    ``GroupInfo.native_seq`` (gloo with point-to-point calls: sends and receives
                taken off in Python)

Modes are interleaved, ``--rounds`` rounds of ``--calls`` calls each; the figure per mode is
the median over rounds of its difference from ``own`` in the same round.

Run: ``FLIGHTREC=1 python benchmarks/bench_native_numbers.py [--rounds N] [--calls N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    import flightrec
    from flightrec.recorder import runtime

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    flightrec.enable()
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(4)
    dist.all_reduce(t)
    rt = runtime.current()
    assert rt is not None
    info = rt.recorder.groups.by_pg[None]
    modes = {"own": None, "pg method": info.native, "native_seq": info.native_seq}

    def run() -> float:
        start = time.perf_counter_ns()
        for _ in range(args.calls):
            dist.all_reduce(t)
        return (time.perf_counter_ns() - start) / args.calls / 1000

    res: dict[str, list[float]] = {k: [] for k in modes}
    for _ in range(args.rounds):
        for name, source in modes.items():
            info.counter.source = source
            res[name].append(run())
    info.counter.source = None
    own = res["own"]
    for name, values in res.items():
        diff = statistics.median(a - b for a, b in zip(values, own, strict=True))
        print(
            f"{name:<11} {statistics.median(values):7.2f} us/call (median), "
            f"{diff:+.2f} us against own (median of paired rounds)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
