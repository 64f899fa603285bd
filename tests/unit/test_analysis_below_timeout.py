"""A requested snapshot of a job that hangs, taken before its hang timeout fired."""

from __future__ import annotations

import io
import json

from rich.console import Console

from flightrec.analysis import analyze
from flightrec.analysis.loading.loader import Run
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer
from tests.unit.factories import Job, healthy


def _snapshot(run: Run, timeout_s: float = 600.0, reason: int = pb.CLI_TRIGGER) -> Run:
    for d in run.dumps.values():
        d.header.reason = reason
        d.header.timeout_s = timeout_s
    return run


def _stalled() -> Job:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)  # waiting 30 s when triggered
    job.stall(2, "load_batch", 18)
    return job


def test_triggered_snapshot_of_a_hang_names_who_waits_for_whom_with_low_confidence() -> None:
    report = analyze(_snapshot(_stalled().run()))
    assert [(f.kind, f.ranks) for f in report.findings] == [(FindingKind.NOT_ARRIVED, (2,))]
    first = report.findings[0]
    assert first.below_timeout is not None
    assert (first.below_timeout.confidence, first.below_timeout.timeout_s) == ("low", 600.0)
    assert first.consequences[0].waiting == (0, 1, 3)
    assert "load_batch at job/train.py:18" in first.summary
    assert "the longest wait (30.0 s) is shorter than the 600 s timeout" in first.summary
    assert "may still be progressing (low confidence)" in first.summary
    evidence = json.loads(rendered(JsonRenderer, report))["findings"][0]["evidence"]
    assert (evidence["confidence"], evidence["longest_wait_s"], evidence["timeout_s"]) == (
        "low",
        30.0,
        600.0,
    )
    out = io.StringIO()
    TerminalRenderer(Console(file=out, width=200)).render(report)
    assert "No problem found" not in out.getvalue()
    assert "ranks 0-1,3 wait in all_reduce #4" in out.getvalue()


def test_every_snapshot_reason_counts() -> None:
    for reason in (pb.SIGNAL_USR1, pb.API_CALL):
        first = analyze(_snapshot(_stalled().run(), reason=reason)).findings[0]
        assert first.ranks == (2,) and first.below_timeout is not None


def test_a_hang_past_the_timeout_is_not_marked() -> None:
    first = analyze(_snapshot(_stalled().run(), timeout_s=10.0)).findings[0]
    assert first.ranks == (2,) and first.below_timeout is None
    assert "low confidence" not in first.summary


def test_a_collective_briefly_in_flight_is_work_in_progress() -> None:
    run = _snapshot(_stalled().run())
    for d in run.dumps.values():
        d.header.mono_time_ns -= 28_000_000_000  # the waits are 2 s old
        d.header.wall_time_ns -= 28_000_000_000
    assert analyze(run).findings == []


def test_healthy_exit_dumps_of_a_finished_job_still_find_nothing() -> None:
    job = healthy(Job(), steps=5)
    for r in job.ranks:
        job.exited(r)
    assert analyze(_snapshot(job.run(), reason=pb.PROCESS_EXIT)).findings == []
    assert analyze(_snapshot(healthy(Job()).run())).findings == []
