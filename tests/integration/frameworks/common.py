"""What the framework tests share: how a job is waited for and what its verdicts must say.

Each framework's test starts a real 4-rank gloo job on CPU the way that framework's users
start one (its own launcher, ``accelerate launch``, ``torchrun``, ``TorchTrainer``), injects one
fault, then reads the verdict twice: in the job's log (computed from the ranks' summaries
exchanged through the job's store) and from the dumps (``flightrec analyze``, its HTML page).
Each names the rank and the user's line in the script, never a line inside the framework.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from flightrec.analysis import Report, analyze_dir
from flightrec.report.html import HtmlRenderer
from flightrec.report.renderer import rendered
from tests.integration.jobs import Job

SCRIPTS = Path(__file__).resolve().parent / "scripts"
VERDICT_DONE = "Dumps (on each rank's host)"
"""The last heading of the verdict panel in the log."""
FAULT_ENV = {"FLIGHTREC_TIMEOUT": "8"}
"""A hang is declared 8 s after it starts: quick, and far above a loaded machine's jitter."""
HEALTHY_ENV = {"FLIGHTREC_TIMEOUT": "120", "FLIGHTREC_DUMP_ON_EXIT": "1"}
"""A healthy run dumps at exit; on a loaded machine no wait of its ever comes near 120 s."""
JOB_S = 420.0
"""Longest a job may take to start, hang and print its verdict, on a loaded 2-core machine."""


def fault_line(script: str, fault: str) -> str:
    """``scripts/NAME.py:LINE`` of the line marked ``# FAULT <fault>`` in a job script."""
    for number, text in enumerate((SCRIPTS / script).read_text().splitlines(), 1):
        if f"# FAULT {fault}" in text:
            return f"scripts/{script}:{number}"
    raise AssertionError(f"no '# FAULT {fault}' line in {script}")


def wait_for_text(job: Job, text: str, timeout: float = JOB_S) -> str:
    """The job's combined output once it contains ``text``."""
    deadline = time.monotonic() + timeout
    while True:
        out = job.output()
        if text in out:
            return out
        if all(p.poll() is not None for p in job.procs):
            raise AssertionError(f"the job ended without printing {text!r}\n{out}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in the job's output after {timeout}s\n{out}")
        time.sleep(0.5)


def log_verdict(out: str) -> str:
    """The verdict panel's sentence from the log, on one line (the panel wraps it)."""
    m = re.search(r"Verdict: [^\n]*\n(.*?)╰", out, re.S)
    assert m, out
    lines = (re.sub(r"^.*?│ ?|\s*│\s*$", "", line) for line in m.group(1).splitlines())
    return " ".join(line.strip() for line in lines)


def analyzed(job: Job, count: int = 4, timeout: float = 120.0) -> Report:
    """The report of ``flightrec analyze`` on the job's dumps, once ``count`` are there."""
    job.wait_for_dumps(count=count, timeout=timeout)
    return analyze_dir(job.dump_dir)


def assert_names(report: Report, kind: str, rank: int, line: str, *, via: str = "") -> str:
    """The first finding is ``kind`` on ``rank`` at the user's ``line`` (and names the
    framework call ``via`` when given), in the report and in its HTML page. Returns its text."""
    assert report.findings, "no finding"
    first = report.findings[0]
    summary = first.summary
    assert first.kind.value == kind and first.ranks == (rank,), summary
    assert line in summary, summary
    if via:
        assert f"{line} via {via}" in summary, summary
    assert "site-packages" not in summary, summary
    html = rendered(HtmlRenderer, report)
    assert line in html
    return summary


# -- the scenarios each framework's test runs (on a job started with that fault) --------------
def stalled(job: Job, script: str) -> str:
    """Rank 2 stalled at the line marked ``# FAULT stall``: named so in the log and by the
    analysis of the dumps. Returns the job's output."""
    out = wait_for_text(job, VERDICT_DONE)
    report = analyzed(job)
    line = fault_line(script, "stall")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "never entered" in said and line in said, said
    assert_names(report, "not_arrived", 2, line)
    return out


def raised(job: Job, script: str) -> None:
    """Rank 2 died of the ValueError raised at the line marked ``# FAULT raise``."""
    out = wait_for_text(job, VERDICT_DONE)
    report = analyzed(job, count=3)
    line = fault_line(script, "raise")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "ValueError" in said and line in said, said
    summary = assert_names(report, report.findings[0].kind.value, 2, line)
    assert "ValueError: corrupt batch" in summary, summary


def settled(job: Job, count: int, timeout: float = JOB_S) -> Report:
    """The report on what the job left once ``count`` dumps are written or it has ended
    (a launcher that kills every rank when one aborts leaves black boxes, not dumps)."""
    deadline = time.monotonic() + timeout
    while len(job.dump_files()) < count and any(p.poll() is None for p in job.procs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} dumps not written after {timeout}s\n{job.output()}")
        time.sleep(0.5)
    time.sleep(1.0)  # a dump being renamed into place as the last process ends
    return analyze_dir(job.dump_dir)


def mismatched(job: Job, script: str, via: str) -> None:
    """Rank 2 passed [3] where the others passed [2], at the line marked ``# FAULT
    mismatch``, through the framework's ``via`` (gloo may abort a rank on the size it did
    not expect: the dumps' analysis is what is read)."""
    report = settled(job, count=3)
    line = fault_line(script, "mismatch")
    summary = assert_names(report, "mismatch", 2, line, via=via)
    assert "[3]" in summary and "[2]" in summary, summary


def healthy(job: Job) -> None:
    """The job ends well, prints no verdict, and its exit dumps hold no finding."""
    codes = job.wait(timeout=JOB_S)
    out = job.output()
    report = analyzed(job)
    assert not any(codes), out
    assert "Verdict" not in out, out
    assert report.findings == [], [f.summary for f in report.findings]
