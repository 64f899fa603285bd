"""Simulated 512-rank jobs through the real CLI: every fault kind diagnosed as injected.

Rings are kept short (150 entries) so each case takes a few seconds; the full-size figures
(16,384 ranks x 2,000 entries) come from benchmarks/bench_scale.py, not from tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flightrec.simulate import Fault

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}

pytestmark = pytest.mark.integration


def flightrec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


@pytest.mark.parametrize("fault", [f for f in Fault if f is not Fault.NONE], ids=lambda f: f.value)
def test_every_fault_is_diagnosed_at_512_ranks(tmp_path: Path, fault: Fault) -> None:
    sim = flightrec(
        "simulate", "--ranks", "512", "--entries", "150", "--fault", fault.value,
        "--fault-rank", "301", "--processes", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    expected = json.loads((tmp_path / "expected.json").read_text())
    assert json.loads(sim.stdout) == expected["first_finding"]
    run = flightrec("analyze", "--json", str(tmp_path))
    assert run.returncode == expected["exit_status"], run.stderr
    report = json.loads(run.stdout)
    assert report["world_size"] == 512
    first = report["findings"][0]
    want = expected["first_finding"]
    assert {k: first.get(k) for k in want} == want, first["summary"]
    # Not a progress bar in sight when stderr is not a terminal.
    assert "Loading" not in run.stderr
