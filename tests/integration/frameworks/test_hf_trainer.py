"""The transformers ``Trainer``, as its users run it: ``torchrun --nproc-per-node 4
hf_trainer_job.py`` with a tiny GPT-2 built from its config, traced by ``FLIGHTREC=1``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "transformers",
    reason="transformers is not installed (.ci/frameworks.sh installs the frameworks)",
)

from tests.integration.frameworks.common import (
    FAULT_ENV,
    HEALTHY_ENV,
    JOB_S,
    SCRIPTS,
    VERDICT_DONE,
    analyzed,
    assert_names,
    fault_line,
    log_verdict,
    wait_for_text,
)
from tests.integration.jobs import start_job

SCRIPT = SCRIPTS / "hf_trainer_job.py"


def run(tmp_path: Path, fault: str, env: dict[str, str]):  # type: ignore[no-untyped-def]
    return start_job(SCRIPT, [fault], launch="torchrun", env=env, workdir=tmp_path)


def test_a_rank_stalled_in_a_callback_is_named_at_its_line(tmp_path: Path) -> None:
    with run(tmp_path, "stall", FAULT_ENV) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job)
    line = fault_line("hf_trainer_job.py", "stall")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "never entered" in said and line in said, said
    assert_names(report, "not_arrived", 2, line)
    # the others wait inside Trainer.train: their line is the user's call of it
    assert "via Trainer.train" in out, out


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path: Path) -> None:
    with run(tmp_path, "raise", FAULT_ENV) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job, count=3)
    line = fault_line("hf_trainer_job.py", "raise")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "ValueError" in said and line in said, said
    summary = assert_names(report, report.findings[0].kind.value, 2, line)
    assert "ValueError: corrupt batch" in summary, summary


def test_a_mismatched_gather_names_accelerators_gather(tmp_path: Path) -> None:
    with run(tmp_path, "mismatch", FAULT_ENV) as job:
        report = analyzed(job, count=3, timeout=JOB_S)
    line = fault_line("hf_trainer_job.py", "mismatch")
    summary = assert_names(report, "mismatch", 2, line, via="Accelerator.gather")
    assert "[3]" in summary and "[2]" in summary, summary


def test_a_healthy_run_reports_nothing(tmp_path: Path) -> None:
    with run(tmp_path, "none", HEALTHY_ENV) as job:
        codes = job.wait(timeout=JOB_S)
        out = job.output()
        report = analyzed(job)
    assert codes == [0], out
    assert "Verdict" not in out, out
    assert report.findings == [], [f.summary for f in report.findings]
