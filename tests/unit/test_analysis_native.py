"""The analyzer on PyTorch's native gloo dumps: enqueue times only, no completion, no dump time."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from flightrec.analysis import analyze, analyze_dir
from flightrec.analysis.loading.loader import Run
from flightrec.analysis.model import FindingKind
from flightrec.format.builder import EntryValues
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
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
    # The aborted rank is the mismatch's consequence, folded into it (issue 31).
    assert [(f.kind, f.ranks, f.seq) for f in findings] == [(FindingKind.MISMATCH, (1,), 4)]
    assert [(x.kind, x.ranks, x.seq) for x in findings[0].explains] == [
        (FindingKind.MISSING_DUMP, (3,), 4)
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
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.MISMATCH, (1,))]
    assert [(x.kind, x.ranks) for x in findings[0].explains] == [(FindingKind.MISSING_DUMP, (3,))]


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


def _native_straggler(rank: int, steps: int = 8, late_ms: float = 40.0) -> Job:
    """``steps`` all_reduces at which ``rank`` enqueues ``late_ms`` after the others, on one
    wall clock shared by every rank (as ranks on one host read it)."""
    job = as_native(healthy(Job(), steps=steps))
    for r, st in job.ranks.items():
        lag = int(late_ms * 1e6) if r == rank else r * 100_000  # others: 0.1 ms apart
        st.entries = [
            EntryValues(**{**_fields(e), "enqueue_ns": 1_000_000_000 + k * 100_000_000 + lag})
            for k, e in enumerate(st.entries)
        ]
        st.clock = st.entries[-1].enqueue_ns
    return job


def _fields(e: EntryValues) -> dict[str, object]:
    return {k: getattr(e, k) for k in e.__dataclass_fields__}


def _one_host(run: Run, host: str = "vm") -> Run:
    for d in run.dumps.values():
        d.header.hostname = host
    return run


def test_straggler_from_enqueue_times_alone_on_one_host() -> None:
    findings = analyze(_one_host(_native_straggler(2).run())).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (2,))]
    evidence = findings[0].evidence
    assert evidence.last_arrivals == 8
    assumption = "assumes ranks 0-3 on host vm share one clock"
    assert assumption in evidence.clock_assumption
    assert assumption in findings[0].summary
    assert "enqueue times alone" in findings[0].summary


def test_enqueue_times_of_different_hosts_are_never_compared() -> None:
    # The factory puts ranks 0-1 on node0 and 2-3 on node1: rank 2 is late only against
    # rank 3, on its own host.
    findings = analyze(_native_straggler(2).run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (2,))]
    assert "ranks 2-3 on host node1" in findings[0].summary


def test_unnamed_hosts_are_assumed_one_and_said_so() -> None:
    first = analyze(_one_host(_native_straggler(1).run(), host="")).findings[0]
    assert "on one host (their dumps do not name it)" in first.summary


def test_small_jitter_in_enqueue_times_is_not_a_straggler() -> None:
    assert analyze(_one_host(_native_straggler(1, late_ms=1.0).run())).findings == []


def test_report_says_when_timing_is_missing_altogether() -> None:
    job = as_native(healthy(Job()))
    for st in job.ranks.values():
        st.entries = [EntryValues(**{**_fields(e), "enqueue_ns": 0}) for e in st.entries]
    report = analyze(job.run())
    assert report.findings == []
    assert any("timing is missing altogether" in n for n in report.notes)
    assert any(
        "timing is missing" in n for n in json.loads(rendered(JsonRenderer, report))["notes"]
    )
    assert analyze(healthy(Job()).run()).notes == ()


@pytest.mark.parametrize(
    ("sample", "name"),
    [("hang", "_dump_{}"), ("hang-json", "job7_trace.{}.json"), ("hang", "fr-{}.pkl")],
)
def test_native_dumps_are_found_by_their_content_whatever_their_name(
    tmp_path: Path, sample: str, name: str
) -> None:
    # Whatever prefix TORCH_FR_DUMP_TEMP_FILE named: the content says what the file is, the
    # number its name ends with says which rank. A JSON file of something else is no dump.
    for p in sorted((SAMPLES / sample).glob("*trace_rank_*")):
        shutil.copy(p, tmp_path / name.format(p.name.rsplit("_", 1)[1]))
    (tmp_path / "config_2.json").write_text('{"version": 2, "steps": 10}')
    report = analyze_dir(str(tmp_path))
    assert report.ranks_with_dump == (0, 1, 2, 3) and report.run.problems == ()
    first = report.findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.NOT_ARRIVED, (2,), 5)
    assert "its last call was broadcast #4 on group 0" in first.summary
    assert "it was in" not in first.summary


def test_a_native_dump_that_names_no_rank_anywhere_is_one_problem(tmp_path: Path) -> None:
    for p in sorted((SAMPLES / "hang").glob("*trace_rank_*"))[:3]:
        shutil.copy(p, tmp_path)
    shutil.copy(SAMPLES / "hang" / "nccl_trace_rank_3", tmp_path / "latest_dump")
    report = analyze_dir(str(tmp_path))
    assert report.ranks_with_dump == (0, 1, 2)
    (problem,) = report.run.problems
    assert problem.path.endswith("latest_dump") and "gives its rank" in problem.reason
