"""Every sample scenario recorded live: a real 4-rank gloo job traced by FLIGHTREC=1, then
`flightrec analyze` on its dumps must name the right culprit first.

Each job runs with a short watchdog timeout; once every rank that can dump has dumped, the
test sends SIGTERM (as torchrun does to survivors), which makes the recorder dump again, so
the default (latest) view is the SIGTERM dumps, and kills whatever is left.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_cli_analyze import ROOT, flightrec

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

JOB = """
import datetime, os, sys, time
import torch
import torch.distributed as dist


def load_batch():
    time.sleep(120)  # stuck outside any collective


def main():
    scenario, rank, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4, timeout=datetime.timedelta(seconds=60))
    pair = dist.new_group([0, 1]), dist.new_group([2, 3])
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if scenario == "healthy":
        dist.barrier()
        import flightrec
        flightrec.dump("end of a healthy run")
        return
    if scenario == "stalled":
        if rank == 2:
            load_batch()
        dist.all_reduce(t)
    elif scenario == "crashed":
        if rank == 2:
            os._exit(1)
        dist.all_reduce(t)
    elif scenario == "op_mismatch":
        if rank == 3:
            dist.broadcast(t, 0)
        else:
            dist.all_reduce(t)
    elif scenario == "size_mismatch":
        dist.all_reduce(torch.ones(8) if rank == 1 else t)
    elif scenario == "dtype_mismatch":
        dist.all_reduce(t.double() if rank == 0 else t)
    elif scenario == "p2p_deadlock":
        if rank in (0, 1):
            dist.recv(t, 1 - rank)  # both receive first: each waits for the other's send
            dist.send(t, 1 - rank)
        else:
            dist.all_reduce(t)
    elif scenario == "subgroup_hang":
        if rank == 3:
            load_batch()
        if rank in (2, 3):
            dist.all_reduce(t, group=pair[1])
        dist.all_reduce(t)
    time.sleep(120)


main()
"""

# scenario -> (exit status, first finding kind, its ranks, extra fields)
SCENARIOS: dict[str, tuple[int, str | None, list[int], dict[str, object]]] = {
    "healthy": (0, None, [], {}),
    "stalled": (1, "not_arrived", [2], {"process_group": "0", "seq": 4, "op": "all_reduce"}),
    "crashed": (1, "missing_dump", [2], {"process_group": "0", "seq": 4}),
    "op_mismatch": (1, "mismatch", [3], {"field": "op", "seq": 4}),
    "size_mismatch": (1, "mismatch", [1], {"field": "shape", "seq": 4}),
    "dtype_mismatch": (1, "mismatch", [0], {"field": "dtype", "seq": 4}),
    "p2p_deadlock": (1, "p2p_deadlock", [0, 1], {}),
    "subgroup_hang": (1, "not_arrived", [3], {"seq": 1, "op": "all_reduce"}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(scenario: str, tmp: Path) -> Path:
    """Run the 4-rank job and return the folder of its dumps."""
    script = tmp / "job.py"
    script.write_text(JOB)
    out = tmp / "dumps"
    env = {
        "FLIGHTREC": "1",
        "FLIGHTREC_DIR": str(out),
        "FLIGHTREC_TIMEOUT": "1.5",
        "PYTHONPATH": f"{ROOT}:{ROOT / 'cli'}",
        "PATH": "/usr/bin:/bin",
    }
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), scenario, str(r), port],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(4)
    ]
    can_dump = 3 if scenario == "crashed" else 4
    deadline = time.monotonic() + 45
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            ranks = {f.name.split("-")[1] for f in out.glob("*.frdump")} if out.exists() else set()
            if len(ranks) >= can_dump:
                time.sleep(0.5)
                break
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 8
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, end - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_live_scenario(scenario: str, tmp_path: Path) -> None:
    status, kind, ranks, fields = SCENARIOS[scenario]
    folder = record(scenario, tmp_path)
    result = flightrec("analyze", folder, "--json")
    assert result.returncode == status, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    if kind is None:
        assert report["findings"] == []
        return
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == (kind, ranks), first["summary"]
    for key, value in fields.items():
        assert first[key] == value, (key, first["summary"])
    # The terminal report leads with the same verdict.
    text = flightrec("analyze", folder).stdout
    assert text.splitlines()[0].strip("╭─ ").startswith(f"Verdict: {kind}")
