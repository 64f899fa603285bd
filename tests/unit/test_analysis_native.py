"""The analyzer on PyTorch's native gloo dumps: enqueue times only, no completion, no dump time."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from flightrec.analysis import analyze, analyze_dir
from flightrec.analysis.model import FindingKind
from tests.unit.factories import Job, as_native, healthy

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "native"


@pytest.mark.parametrize(("field", "value"), [("shape", (8,)), ("dtype", "float64")])
def test_mismatch_among_remaining_dumps_outranks_the_rank_gloo_aborted(
    field: str, value: object
) -> None:
    # gloo aborts the receiver of a wrong-size or wrong-dtype message: rank 3 leaves no dump,
    # ranks 0-2 (every entry ENQUEUED, as PyTorch's gloo recorder leaves them) show the cause.
    job = healthy(Job())
    job.collective(shape=(4,), ranks=[0, 1, 2], override={1: {field: value}})
    findings = analyze(as_native(job).run(ranks=[0, 1, 2])).findings
    assert [(f.kind, f.ranks, f.seq) for f in findings] == [
        (FindingKind.MISMATCH, (1,), 4),
        (FindingKind.MISSING_DUMP, (3,), 4),
    ]
    assert findings[0].field == field


def test_without_completion_only_the_newest_entry_holds_a_rank() -> None:
    job = healthy(Job(), steps=5)
    job.collective(ranks=[0, 1, 2])
    report = analyze(as_native(job).run(ranks=[0, 1, 2]))
    first = report.findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.MISSING_DUMP, (3,), 6)
    assert "all_reduce #6" in first.summary


def test_native_sample_with_the_aborted_rank_removed(tmp_path: Path) -> None:
    # The real size_mismatch job (rank 1 passes 8 elements, the others 4), rank 3's dump gone.
    for r in (0, 1, 2):
        shutil.copy(SAMPLES / "size_mismatch" / f"nccl_trace_rank_{r}", tmp_path)
    findings = analyze_dir(str(tmp_path)).findings
    assert [(f.kind, f.ranks) for f in findings[:2]] == [
        (FindingKind.MISMATCH, (1,)),
        (FindingKind.MISSING_DUMP, (3,)),
    ]


@pytest.mark.parametrize("scenario", ["hang", "subgroup_hang", "hang-json"])
def test_waits_are_measured_to_the_dump_not_to_the_analysis(tmp_path: Path, scenario: str) -> None:
    # A checked-out or copied dump has the copy's file time: days after the job.
    for p in (SAMPLES / scenario).glob("*trace_rank_*"):
        shutil.copy(p, tmp_path)
        os.utime(tmp_path / p.name)  # now
    report = analyze_dir(str(tmp_path))
    first = report.findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED
    waits = [c.waited_s for c in first.consequences]
    assert waits and all(0 < w <= 3.5 for w in waits)  # the samples' gloo timeout is 3 s
    detail = report.run.dumps[0].header.reason_detail
    assert "dump time taken as its newest entry + the 3 s timeout" in detail
