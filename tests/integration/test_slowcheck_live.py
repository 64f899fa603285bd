"""The slow check in real 4-rank gloo jobs: a rank slowing in each of three shapes is named in
rank 0's log while the job runs, with its shape; a healthy job's log has no line.

Each job is forked from one driver (scripts/slow_job.py ``--runs 1``) that imports torch once,
with a check every second (FLIGHTREC_SLOW_CHECK=1); the driver watches rank 0's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.jobs import SCRIPTS, child_env

WORLD = 4


def run(tmp_path: Path, *args: str, timeout: float = 120) -> dict[str, object]:
    cmd = [sys.executable, str(SCRIPTS / "slow_job.py"), "--runs", "1", "--out", str(tmp_path),
           "--world", str(WORLD), *args]  # fmt: skip
    env = child_env({"FLIGHTREC_SLOW_CHECK": "1"}, flightrec=False)
    # A session of its own: a driver that runs out of time goes with the ranks it forked.
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as driver:  # fmt: skip
        try:
            _, stderr = driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.communicate()
            raise
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("run-*/*.log")))
    assert driver.returncode == 0, stderr + logs
    assert "Traceback" not in logs and "flightrec: the slow check" not in logs, logs
    result: dict[str, object] = json.loads((tmp_path / "run-000" / "result.json").read_text())
    result["logs"] = logs
    return result


@pytest.mark.parametrize(
    ("shape", "word"), [("growing", "growing"), ("every", "intermittent"), ("halfway", "steady")]
)
def test_a_slowing_rank_is_named_in_the_log_while_the_job_runs(
    tmp_path: Path, shape: str, word: str
) -> None:
    # A rank is named once it has been late for 5 s; the job ends soon after the line (or
    # after about 20 s of slowness: growing steps grow 1 ms longer each, up to 150 ms).
    steps = str(80 + {"growing": 220, "every": 600, "halfway": 320}[shape])
    r = run(tmp_path, "--shape", shape, "--slow-rank", "2", "--onset-step", "80", "--steps", steps,
            "--stop-on-line", "--max-ms", "150")  # fmt: skip
    lines: list[str] = r["lines"]  # type: ignore[assignment]
    named = [ln for ln in lines if "is persistently late" in ln]
    assert named, r["logs"]
    assert all(ln.startswith("flightrec: slow rank: rank 2 (") for ln in named), lines
    assert any(word in ln for ln in named), lines
    assert "in group 0 (4 ranks)" in named[0] and "% of their time waiting for it" in named[0]
    # Named while the job ran, after the slowdown began.
    assert r["onset"] is not None and r["first_line"] is not None
    assert float(r["first_line"]) > float(r["onset"])  # type: ignore[arg-type]
    assert len(lines) <= 3, lines  # again only when what it says changes


def test_a_slowing_rank_is_named_in_a_plain_ddp_job(tmp_path: Path) -> None:
    """The job's only collectives are DDP's gradient all-reduces (no FLIGHTREC_DDP_HOOK set):
    rank 2 grows 20 ms slower at every step."""
    r = run(tmp_path, "--ddp", "--shape", "growing", "--grow-ms", "20", "--max-ms", "200",
            "--slow-rank", "2", "--onset-step", "30", "--steps", "250", "--stop-on-line",
            timeout=240)  # fmt: skip
    lines: list[str] = r["lines"]  # type: ignore[assignment]
    named = [ln for ln in lines if "is persistently late" in ln]
    assert named, r["logs"]
    assert named[0].startswith("flightrec: slow rank: rank 2 ("), lines
    assert "in group 0 (4 ranks)" in named[0], named[0]
    assert float(r["first_line"]) > float(r["onset"])  # type: ignore[arg-type]


def test_a_healthy_job_has_no_line(tmp_path: Path) -> None:
    r = run(tmp_path, "--shape", "none", "--steps", "200")
    assert r["lines"] == [], r["lines"]
    logs = sorted(tmp_path.glob("run-000/rank-*.log"))
    assert len(logs) == WORLD and all("STEP 200" in p.read_text() for p in logs)  # every step ran
