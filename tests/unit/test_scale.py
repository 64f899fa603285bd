"""Simulated 64-rank jobs: every fault kind the simulator injects is diagnosed as injected.

The expected verdict comes from the simulator's fault, never from the analyzer; the first
finding must agree on kind and ranks, and on group, seq, op and field where the fault fixes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flightrec.analysis import AnalysisOptions, Report, analyze, analyze_dir
from flightrec.analysis.loading.loader import load_dir
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate

FAULTS = [f for f in Fault if f is not Fault.NONE]


def diagnose(
    folder: Path,
    ranks: int,
    entries: int,
    fault: Fault,
    rank: int,
    workers: int = 1,
    form: str = "flightrec",
) -> tuple[Report, dict[str, Any]]:
    """Simulate the job into ``folder``, analyse it; return the report and the expected finding."""
    config = SimConfig(parse_layout("tp=8,pp=4", ranks), entries, fault, rank)
    expected = simulate(config, folder, processes=1, form=form)
    return analyze_dir(str(folder), AnalysisOptions(workers=workers)), expected


def assert_first_finding(report: Report, expected: dict[str, Any]) -> None:
    assert report.findings, f"nothing found; expected {expected}"
    first = report.findings[0]
    got = {
        "kind": first.kind,
        "ranks": list(first.ranks),
        "process_group": first.process_group,
        "seq": first.seq,
        "op": first.op,
        "field": first.field,
    }
    assert {k: got[k] for k in expected} == expected, first.summary


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.value)
def test_every_fault_is_diagnosed_at_64_ranks(tmp_path: Path, fault: Fault) -> None:
    report, expected = diagnose(tmp_path, 64, 300, fault, 17)
    assert expected["kind"]
    assert_first_finding(report, expected)


def test_healthy_job_at_64_ranks_has_no_finding(tmp_path: Path) -> None:
    report, expected = diagnose(tmp_path, 64, 300, Fault.NONE, 0)
    assert expected == {}
    assert report.findings == []


@pytest.mark.parametrize("fault", [Fault.STALL, Fault.SIZE_MISMATCH], ids=lambda f: f.value)
def test_native_form_of_the_same_job_gets_the_same_verdict(tmp_path: Path, fault: Fault) -> None:
    report, expected = diagnose(tmp_path, 64, 300, fault, 42, form="native")
    assert sorted(p.name for p in tmp_path.iterdir())[0] == "nccl_trace_rank_0"
    assert all(d.header.source == "torch-native-pickle" for d in report.run.dumps.values())
    assert_first_finding(report, expected)


def test_parallel_loading_gives_the_same_report_as_serial(tmp_path: Path) -> None:
    config = SimConfig(parse_layout("tp=8,pp=4", 256), 200, Fault.DTYPE_MISMATCH, 77)
    simulate(config, tmp_path, processes=1)
    serial = analyze_dir(str(tmp_path), AnalysisOptions(workers=1))
    seen: list[tuple[int, int]] = []
    parallel = analyze_dir(
        str(tmp_path), AnalysisOptions(workers=2, progress=lambda d, t: seen.append((d, t)))
    )
    assert [(f.kind, f.ranks, f.seq, f.field) for f in serial.findings] == [
        (f.kind, f.ranks, f.seq, f.field) for f in parallel.findings
    ]
    assert seen[0] == (0, 256) and seen[-1] == (256, 256)


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
def test_reading_the_tails_of_long_rings_gives_the_verdict_of_reading_them_whole(
    tmp_path: Path, fault: Fault
) -> None:
    """Rings of 1,000 entries: the loader reads the newest 256 of each (schema 1.3)."""
    config = SimConfig(parse_layout("tp=8,pp=4", 64), 1000, fault, 17)
    expected = simulate(config, tmp_path, processes=1)
    tail = analyze_dir(str(tmp_path), AnalysisOptions(workers=1, tail=True))
    assert all(d.dump.older for d in tail.run.dumps.values()), "expected tails only"
    whole = analyze_dir(str(tmp_path), AnalysisOptions(workers=1, tail=False))
    if expected:
        assert_first_finding(tail, expected)
    # The same findings; a straggler's sample counts come from fewer collectives.
    assert [(f.kind, f.ranks, f.process_group, f.seq, f.field) for f in tail.findings] == [
        (f.kind, f.ranks, f.process_group, f.seq, f.field) for f in whole.findings
    ]


@pytest.mark.parametrize("fault", [Fault.STRAGGLER, Fault.STALL], ids=lambda f: f.value)
def test_a_pass_run_beside_the_others_gives_the_same_findings(tmp_path: Path, fault: Fault) -> None:
    """From 256 ranks with two CPUs, the straggler pass runs in a forked process."""
    config = SimConfig(parse_layout("tp=8,pp=4", 256), 300, fault, 77)
    simulate(config, tmp_path, processes=1)
    run = load_dir(tmp_path, AnalysisOptions(workers=1))
    serial, beside = analyze(run, workers=1), analyze(run, workers=2)
    assert serial.findings == beside.findings
    assert serial.findings and (
        fault is not Fault.STRAGGLER or serial.findings[0].kind == "straggler"
    )
