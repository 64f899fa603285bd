"""Lightning, as its users run it: ``python lightning_job.py`` with ``Trainer(strategy="ddp")``
(or an FSDP strategy); Lightning's launcher starts the other ranks, ``FLIGHTREC=1`` traces them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "lightning", reason="Lightning is not installed (.ci/frameworks.sh installs the frameworks)"
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

SCRIPT = SCRIPTS / "lightning_job.py"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_stalled_rank_is_named_at_its_line(tmp_path: Path, strategy: str) -> None:
    args = ["stall", "--strategy", strategy]
    with start_job(SCRIPT, args, launch="self", env=FAULT_ENV, workdir=tmp_path) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job)
    line = fault_line("lightning_job.py", "stall")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "never entered" in said and line in said, said
    assert_names(report, "not_arrived", 2, line)


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path: Path) -> None:
    with start_job(SCRIPT, ["raise"], launch="self", env=FAULT_ENV, workdir=tmp_path) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job, count=3)
    line = fault_line("lightning_job.py", "raise")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "ValueError" in said and line in said, said
    summary = assert_names(report, report.findings[0].kind.value, 2, line)
    assert "ValueError: corrupt batch" in summary, summary


def test_a_mismatched_all_gather_names_the_lightning_call(tmp_path: Path) -> None:
    with start_job(SCRIPT, ["mismatch"], launch="self", env=FAULT_ENV, workdir=tmp_path) as job:
        report = analyzed(job, count=3, timeout=JOB_S)
    line = fault_line("lightning_job.py", "mismatch")
    summary = assert_names(report, "mismatch", 2, line, via="LightningModule.all_gather")
    assert "[3]" in summary and "[2]" in summary, summary


def test_a_healthy_run_reports_nothing(tmp_path: Path) -> None:
    with start_job(SCRIPT, ["none"], launch="self", env=HEALTHY_ENV, workdir=tmp_path) as job:
        codes = job.wait(timeout=420)
        out = job.output()
        report = analyzed(job)
    assert codes == [0], out
    assert "Verdict" not in out, out
    assert report.findings == [], [f.summary for f in report.findings]
