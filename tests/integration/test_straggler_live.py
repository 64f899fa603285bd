"""Stragglers in real 4-rank gloo jobs: exit dumps, on-demand dumps of a running job, healthy runs.

The job (scripts/straggler.py) sleeps a little on every rank, then all_reduces; the slow rank
sleeps another 30-50 ms first, every step. Healthy jobs are the same loop without a slow rank,
run 20 times from one forking driver so that torch is imported once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flightrec.analysis import analyze_dir
from flightrec.analysis.facts.lateness import StragglerEvidence
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from tests.integration.jobs import SCRIPTS, child_env, start_job
from tests.integration.test_cli_analyze import flightrec
from tests.unit.test_trace_format import trace_errors

WORLD = 4
HEALTHY_RUNS = 20


def _stragglers(path: Path) -> list[tuple[str, tuple[int, ...]]]:
    return [(f.kind, f.ranks) for f in analyze_dir(str(path)).findings if f.kind == "straggler"]


def test_slow_rank_is_named_from_exit_dumps(tmp_path: Path) -> None:
    args = ["--steps", "25", "--slow-rank", "2"]
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1"}
    with start_job("straggler.py", args, env=env, workdir=tmp_path) as job:
        assert job.wait(90) == [0] * WORLD, job.output()
    dumps = job.dumps()
    assert sorted(dumps) == list(range(WORLD))
    assert all(items[-1][1].header.reason == pb.PROCESS_EXIT for items in dumps.values())

    report = analyze_dir(str(job.dump_dir))
    assert [(f.kind, f.ranks) for f in report.findings] == [(FindingKind.STRAGGLER, (2,))]
    ev = report.findings[0].evidence
    assert isinstance(ev, StragglerEvidence)
    assert ev.last_share >= 0.8, report.findings[0].summary
    assert 20.0 <= ev.median_lateness_ms <= 60.0, report.findings[0].summary
    assert ev.others_waited_s > 0.5

    # The CLI: exit 1, the verdict, the table, and a valid timeline.
    trace = tmp_path / "trace.json"
    result = flightrec("analyze", job.dump_dir, "--trace", trace)
    assert result.returncode == 1, result.stderr
    assert "Verdict: straggler" in result.stdout and "Arrival lateness per rank" in result.stdout
    data = json.loads(trace.read_text())
    assert trace_errors(data) == []
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["rank"] for e in slices} == set(range(WORLD))
    assert sum(e["args"]["op"] == "all_reduce" for e in slices) >= WORLD * 25


def test_slow_rank_is_named_from_trigger_dumps_of_a_running_job(tmp_path: Path) -> None:
    args = ["--steps", "0", "--slow-rank", "1"]  # runs until killed
    with start_job("straggler.py", args, env={"FLIGHTREC_TIMEOUT": "600"}, workdir=tmp_path) as job:
        for rank in range(WORLD):
            job.wait_for_output(rank, "STEP 20", timeout=60)
        code = "from flightrec_cli.app import main; main()"
        result = subprocess.run(
            [sys.executable, "-c", code, "trigger", "--host", "127.0.0.1", "--port", str(job.port)],
            env=child_env(flightrec=False), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        job.wait_for_dumps(WORLD, timeout=20, reason="cli_trigger")
        assert all(p.poll() is None for p in job.procs)  # still running: slow, not hung
    assert _stragglers(job.dump_dir) == [(FindingKind.STRAGGLER, (1,))]


def test_healthy_job_run_20_times_has_no_straggler(tmp_path: Path) -> None:
    cmd = [
        sys.executable, str(SCRIPTS / "straggler.py"), "--runs", str(HEALTHY_RUNS),
        "--steps", "25", "--world", str(WORLD), "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(
        cmd, env=child_env(flightrec=False), capture_output=True, text=True, timeout=150
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = sorted(tmp_path.glob("run-*"))
    assert len(runs) == HEALTHY_RUNS
    false_positives = {run.name: _stragglers(run) for run in runs}
    assert {k: v for k, v in false_positives.items() if v} == {}
    for run in runs:  # every run really recorded its 25 all_reduces on all ranks
        report = analyze_dir(str(run))
        assert report.ranks_with_dump == tuple(range(WORLD)), run
        issued = max(
            p.last_seq for g in report.matched.groups.values() for p in g.progress.values()
        )
        assert issued >= 25, run
        assert report.findings == [], (run, [f.summary for f in report.findings])
