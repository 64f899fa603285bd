"""Verdicts on real 4-rank gloo jobs shaped unlike the samples: outputs and snapshots below the timeout."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.jobs import start_job
from tests.integration.test_cli_analyze import flightrec
from tests.integration.test_recorder_jobs import _trigger

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

WORLD = 4


def test_all_gather_output_too_large_on_one_rank_blames_that_rank(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": "3"}
    with start_job("exchange.py", ["--bad-rank", "1"], env=env, workdir=tmp_path) as job:
        job.wait_for_output(1, "RAISED", timeout=90)
        # The others wait in the all-gather until flightrec's watchdog dumps them.
        job.wait_for_dumps(WORLD, timeout=60)
        time.sleep(4)
    result = flightrec("analyze", job.dump_dir, "--json")
    assert result.returncode == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"], first["op"]) == (
        "mismatch",
        [1],
        "all_gather_into_tensor",
    ), first["summary"]
    assert first["field"] == "output_shape", first["summary"]
    assert "[40]" in first["summary"] and "[32]" in first["summary"]
    assert all(f["kind"] != "stuck" for f in report["findings"]), report["findings"]


def test_all_to_all_split_sizes_one_rank_got_wrong_blame_that_rank(tmp_path: Path) -> None:
    # Rank 2 sends rank 0 one row more and rank 1 one row less than they expect; the totals
    # add up. gloo aborts the process that receives too much (a C++ abort: only its black box
    # is left), and the others fail or wait in the all_reduce after it.
    env = {"FLIGHTREC_TIMEOUT": "3"}
    args = ["--op", "all_to_all", "--bad-rank", "2", "--pg-timeout", "5"]
    with start_job("exchange.py", args, env=env, workdir=tmp_path) as job:
        job.wait(60)
    result = flightrec("analyze", job.dump_dir, "--json")
    assert result.returncode == 1, (result.stdout, result.stderr)
    first = json.loads(result.stdout)["findings"][0]
    assert (first["kind"], first["ranks"], first["op"], first["field"]) == (
        "mismatch",
        [2],
        "all_to_all_single",
        "split_sizes",
    ), first["summary"]
    assert "rank 2 sends 16 elements to rank 0, which expects 12" in first["summary"]
    assert "exchange.py:" in first["summary"]


def test_triggered_snapshot_of_a_hang_below_the_timeout(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": "600"}
    with start_job("scenario.py", ["stall", "--stall-rank", "2"], env=env, workdir=tmp_path) as job:
        for rank in range(WORLD):
            job.wait_for_output(rank, "STALLING" if rank == 2 else "WAITING", timeout=90)
        time.sleep(7)  # the others have waited well over the 5 s of ordinary work in flight
        result = _trigger(job.port)
        assert result.returncode == 0, result.stderr
        job.wait_for_dumps(WORLD, timeout=20, reason="cli_trigger")
    result = flightrec("analyze", job.dump_dir, "--json")
    assert result.returncode == 1, (result.stdout, result.stderr)
    first = json.loads(result.stdout)["findings"][0]
    assert (first["kind"], first["ranks"]) == ("not_arrived", [2]), first["summary"]
    assert first["evidence"]["confidence"] == "low"
    assert first["evidence"]["timeout_s"] == 600.0
    assert "shorter than the 600 s timeout" in first["summary"]
    assert sorted(first["consequences"][0]["waiting_ranks"]) == [0, 1, 3]
    text = flightrec("analyze", job.dump_dir).stdout
    assert "No problem found" not in text
