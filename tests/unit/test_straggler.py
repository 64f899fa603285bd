"""The straggler pass: who arrives last, by how much, and what it costs the others."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from flightrec.analysis import analyze, analyze_dir
from flightrec.analysis.facts.lateness import StragglerEvidence, chance_of_as_many, percentile
from flightrec.analysis.model import FindingKind
from flightrec.analysis.timing import lastarrivals
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from tests.unit.factories import user_stack
from tests.unit.paths import c_and_python
from tests.unit.test_clocks import timed_job

C_LOOPS = lastarrivals._arrivals


# Every test with the per-group tally in C (where built), then in Python.
loops = c_and_python(lastarrivals, "_arrivals")


def test_late_rank_is_named_with_its_numbers() -> None:
    job = timed_job(late={2: 40.0}, offset_ms={1: 6.0, 2: -4.0, 3: 9.0})
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (2,))]
    ev = findings[0].evidence
    assert isinstance(ev, StragglerEvidence)
    assert ev.last_arrivals == 30 and ev.collectives == 30 and ev.last_share == 1.0
    assert 38.0 < ev.median_lateness_ms < 41.0  # 40 ms minus up to 1 ms of others' jitter
    assert ev.median_lateness_ms <= ev.p90_lateness_ms < 41.0
    # Three ranks waited about 40 ms at each of 30 collectives.
    assert ev.others_waited_s == pytest.approx(3 * 30 * 0.0395, rel=0.05)
    assert ev.job_delay_s == pytest.approx(30 * 0.0395, rel=0.05)
    assert ev.confidence == "high"
    rows = {row.rank: row for row in ev.lateness_by_rank}
    assert rows[2].last_share == 1.0 and rows[2].median_behind_ms > 38
    assert all(rows[r].median_behind_ms < 1 for r in (0, 1, 3))
    assert rows[3].clock_offset_ms == pytest.approx(9.0, abs=0.1)
    assert rows[2].clock_offset_ms == pytest.approx(-4.0, abs=0.1)
    assert 0 < rows[2].clock_uncertainty_ms < 0.1
    assert ev.clock.reference_rank == 0
    assert ev.clock.max_offset_ms == pytest.approx(9.0, abs=0.1)
    assert "Rank 2" in findings[0].summary and "30 of the 30" in findings[0].summary


def test_healthy_job_on_skewed_clocks_has_no_straggler() -> None:
    # Wall clocks 6-9 ms apart: more than the lateness threshold. Only alignment from the
    # completions keeps rank 3 from looking late at every collective.
    for seed in range(20):
        job = timed_job(offset_ms={1: 6.0, 2: -4.0, 3: 9.0}, seed=seed)
        assert analyze(job.run()).findings == [], seed


def test_occasional_lateness_is_not_a_straggler() -> None:
    job = timed_job(late={1: 40.0}, late_every=5)  # late at one step in five
    assert analyze(job.run()).findings == []


def test_lateness_under_the_margin_is_not_a_straggler() -> None:
    job = timed_job(late={1: 3.0})
    assert analyze(job.run()).findings == []


def test_last_as_often_as_chance_makes_it_is_not_a_straggler() -> None:
    # Two ranks: one of them is last at every collective, so a few late arrivals (a loaded
    # machine descheduling one process) are no evidence; the same count among 8 members is.
    assert analyze(timed_job(world=2, steps=5, late={1: 20.0}).run()).findings == []
    findings = analyze(timed_job(world=2, steps=12, late={1: 20.0}).run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (1,))]
    findings = analyze(timed_job(world=8, steps=5, late={5: 20.0}).run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (5,))]


def test_chance_of_being_last_is_the_binomial_tail() -> None:
    assert chance_of_as_many({2: 5}, 5) == pytest.approx(1 / 32)
    assert chance_of_as_many({2: 5}, 0) == pytest.approx(1.0)
    assert chance_of_as_many({4: 3}, 2) == pytest.approx(3 * (1 / 16) * (3 / 4) + 1 / 64)
    # Two groups: last at both collectives of a 2-rank and an 8-rank group.
    assert chance_of_as_many({2: 1, 8: 1}, 2) == pytest.approx(1 / 16)
    assert chance_of_as_many({2: 3}, 4) == 0.0


def test_rank0_extra_work_is_reported_as_such_with_low_confidence() -> None:
    job = timed_job(late={0: 35.0})
    job.ranks[0].threads = [("MainThread", user_stack("save_checkpoint", 120)[1:], True, False)]
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (0,))]
    f = findings[0]
    assert f.evidence.confidence == "low"
    assert "checkpoint" in str(f.evidence.likely_cause)
    assert "save_checkpoint" in f.summary and "by design rather than a fault" in f.summary


def test_straggler_ranks_below_a_hang() -> None:
    job = timed_job(late={3: 40.0})
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    findings = analyze(job.run()).findings
    assert findings[0].kind == FindingKind.NOT_ARRIVED and findings[0].ranks == (2,)
    assert (FindingKind.STRAGGLER, (3,)) in [(f.kind, f.ranks) for f in findings[1:]]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.9) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(x) for x in range(11)], 0.9) == 9.0


def test_terminal_table_and_json_fields() -> None:
    report = analyze(timed_job(late={2: 40.0}).run())
    out = io.StringIO()
    TerminalRenderer(Console(file=out, width=100, color_system=None)).render(report)
    text = out.getvalue()
    assert "Arrival lateness per rank" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("2 "))
    assert "100%" in row and "█" in row and "±0.0" in row
    assert "clocks aligned on rank 0" in text
    first = json.loads(rendered(JsonRenderer, report))["findings"][0]
    assert first["kind"] == "straggler" and first["ranks"] == [2]
    assert first["confidence"] == "high" and first["last_share"] == 1.0
    assert first["median_lateness_ms"] > 38 and first["others_waited_s"] > 3


@pytest.mark.parametrize("fault_rank", [5, 21])
def test_simulated_straggler_is_found_across_hosts(tmp_path: Path, fault_rank: int) -> None:
    layout = parse_layout("tp=4,pp=2", 32)
    simulate(SimConfig(layout, entries=200, fault=Fault.STRAGGLER, fault_rank=fault_rank), tmp_path)
    findings = analyze_dir(str(tmp_path)).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.STRAGGLER, (fault_rank,))]
    assert 30.0 <= findings[0].evidence.median_lateness_ms <= 50.0


def test_simulated_healthy_jobs_have_no_straggler(tmp_path: Path) -> None:
    layout = parse_layout("tp=4,pp=2", 32)
    for seed in range(3):
        out = tmp_path / str(seed)
        simulate(SimConfig(layout, entries=200, fault=Fault.NONE, seed=seed), out)
        assert analyze_dir(str(out)).findings == [], seed
