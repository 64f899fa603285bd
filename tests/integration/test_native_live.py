"""Record native dumps from a live gloo job with the installed torch, then diagnose them.

This catches a torch upgrade that changes the native format: the samples were recorded once,
this test records afresh every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "native_scripts" / "fr_job.py"


def _native_env(**extra: str) -> dict[str, str]:
    """The source tree on the path, PyTorch's recorder only (not ours), and ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'cli'}"
    env.pop("FLIGHTREC", None)
    return {**env, **extra}


def _run_job(args: list[str], env: dict[str, str], timeout: float) -> None:
    """Run a native job script; a failed job fails the test with the ranks' own output."""
    job = subprocess.run(
        [sys.executable, *args], env=env, timeout=timeout, capture_output=True, text=True
    )
    assert job.returncode == 0, f"{args[0]} exited {job.returncode}\n{job.stdout}{job.stderr}"


def test_live_gloo_hang_is_recorded_and_diagnosed(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    analysis = pytest.importorskip("flightrec.analysis")
    env = _native_env(FR_JOB_TIMEOUT_S="1")
    pdir, jdir = tmp_path / "pickle", tmp_path / "json"
    # Three ranks keep it short: rank 2 still skips the all_reduce that ranks 0 and 1 enter.
    _run_job([str(SCRIPT), "hang", str(pdir), str(jdir), "3"], env, timeout=90)
    for folder in (pdir, jdir):
        assert len(list(folder.iterdir())) == 3
        report = analysis.analyze_dir(str(folder))
        first = report.findings[0]
        assert (first.kind, first.ranks, first.process_group, first.op) == (
            "not_arrived",
            (2,),
            "0",
            "all_reduce",
        )


STRAGGLER = Path(__file__).resolve().parent / "native_scripts" / "fr_straggler.py"


def test_live_gloo_straggler_is_found_from_enqueue_times(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    analysis = pytest.importorskip("flightrec.analysis")
    env = _native_env()
    pdir, jdir = tmp_path / "pickle", tmp_path / "json"
    _run_job([str(STRAGGLER), str(pdir), str(jdir), "2", "20"], env, timeout=120)
    for folder, where in ((pdir, "their dumps do not name it"), (jdir, "on host ")):
        report = analysis.analyze_dir(str(folder))
        assert [(f.kind, f.ranks) for f in report.findings] == [("straggler", (2,))], [
            f.summary for f in report.findings
        ]
        first = report.findings[0]
        assert first.evidence.clock_assumption is not None
        assert where in first.evidence.clock_assumption
        assert "enqueue times alone" in first.summary


def test_live_gloo_abort_the_mismatch_outranks_the_missing_dump(tmp_path: Path) -> None:
    """Rank 3 all-reduces float64; gloo aborts a rank that receives its message, which leaves
    no dump. The mismatch the remaining native dumps show is the cause, the missing dump its
    consequence."""
    pytest.importorskip("torch.distributed")
    analysis = pytest.importorskip("flightrec.analysis")
    env = _native_env(FR_JOB_TIMEOUT_S="2")
    pdir, jdir = tmp_path / "pickle", tmp_path / "json"
    job = subprocess.run(
        [sys.executable, str(SCRIPT), "dtype_mismatch", str(pdir), str(jdir)],
        env=env,
        timeout=120,
        check=False,
        capture_output=True,
        text=True,
    )
    assert job.returncode != 0, job.stderr  # the aborted rank
    for folder in (pdir, jdir):
        ranks = sorted(p.name[-1] for p in folder.iterdir())
        assert len(ranks) == 3 and "3" in ranks, ranks  # one receiver aborted, without a dump
        report = analysis.analyze_dir(str(folder))
        first = report.findings[0]
        assert (first.kind, first.ranks, first.field) == ("mismatch", (3,), "dtype"), first
        # Folded into the mismatch as its consequence (issue 31), not a finding of its own.
        assert [f for f in report.findings if f.kind == "missing_dump"] == []
        missing = [x for x in first.explains if x.kind == "missing_dump"]
        assert missing and set(missing[0].ranks) == set(report.run.missing_ranks)
