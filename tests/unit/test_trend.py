"""The onset and shape of a straggler's lateness, from hand-built series and jobs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from flightrec.analysis import analyze
from flightrec.analysis.facts.lateness import StragglerEvidence
from flightrec.analysis.timing.trend import (
    GROWING,
    INTERMITTENT,
    STEADY,
    describe_trend,
    sparkline,
    trend_phrase,
)
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from tests.unit.test_clocks import timed_job

STEP_NS = 100_000_000  # 100 ms a collective


def series(late_ms, n: int = 200, noise_ms: float = 1.0, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    return [(i * STEP_NS, late_ms(i) + rng.gauss(0, noise_ms)) for i in range(n)]


def test_a_step_gives_its_onset_and_a_steady_shape() -> None:
    t = describe_trend(series(lambda i: 0.0 if i < 120 else 40.0))
    assert t is not None
    assert t.shape == STEADY and t.onset_seen
    assert t.onset_ns == 120 * STEP_NS
    assert t.before_ms < 2.0 and 38.0 < t.after_ms < 42.0
    assert t.late_share == 1.0


def test_a_ramp_is_growing_from_where_it_starts() -> None:
    t = describe_trend(series(lambda i: 0.0 if i < 80 else 1.0 * (i - 80)))
    assert t is not None and t.shape == GROWING and t.onset_seen
    assert abs(t.onset_ns - 80 * STEP_NS) <= 3 * STEP_NS
    # 1 ms per collective of 100 ms: 600 ms a minute
    assert 450.0 < t.growth_ms_per_min < 750.0
    assert t.latest_ms > 80.0


def test_slow_every_fourth_collective_is_intermittent() -> None:
    t = describe_trend(series(lambda i: 40.0 if i >= 60 and i % 4 == 0 else 0.0))
    assert t is not None and t.shape == INTERMITTENT and t.onset_seen
    assert abs(t.onset_ns - 60 * STEP_NS) <= 4 * STEP_NS
    assert 0.2 <= t.late_share <= 0.3
    assert 38.0 < t.late_ms < 42.0


def test_late_from_the_start_has_no_visible_onset() -> None:
    t = describe_trend(series(lambda i: 30.0))
    assert t is not None and t.shape == STEADY and not t.onset_seen
    assert t.onset_ns == 0
    assert "since at least" in trend_phrase(t)


def test_never_late_has_no_trend() -> None:
    assert describe_trend(series(lambda i: 0.0)) is None
    assert describe_trend(series(lambda i: 40.0, n=5)) is None  # too short to say


def test_a_long_history_is_averaged_down_but_keeps_the_exact_onset() -> None:
    t = describe_trend(series(lambda i: 0.0 if i < 1000 else 40.0, n=2000))
    assert t is not None and t.shape == STEADY
    assert t.onset_ns == 1000 * STEP_NS
    assert t.samples == 2000 and t.span_s == pytest.approx(199.9)


def test_sparkline_scales_to_its_peak_and_reads_negative_as_zero() -> None:
    assert sparkline([0.0, 0.0, 10.0, 10.0]) == "▁▁██"
    assert sparkline([-5.0, 0.0]) == "▁▁"
    assert len(sparkline([float(i) for i in range(1000)])) == 24
    assert sparkline([]) == ""


def test_straggler_finding_carries_its_trend() -> None:
    job = timed_job(steps=40, late={2: 40.0}, offset_ms={1: 6.0, 2: -4.0, 3: 9.0})
    report = analyze(job.run())
    f = report.findings[0]
    ev = f.evidence
    assert isinstance(ev, StragglerEvidence) and ev.trend is not None
    assert ev.trend.shape == STEADY and not ev.trend.onset_seen
    assert "late since at least" in f.summary and "steady" in f.summary
    data = json.loads(rendered(JsonRenderer, report))
    trend = data["findings"][0]["evidence"]["trend"]
    assert trend["shape"] == "steady" and trend["samples"] == 40
    schema = json.loads((Path(__file__).parents[2] / "docs" / "report-schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(data)] == []


def test_timeline_marks_where_the_straggler_began() -> None:
    from flightrec.report.trace import trace_dict
    from tests.unit.test_trace_format import trace_errors

    job = timed_job(steps=40, late={2: 40.0})
    data = trace_dict(analyze(job.run()))
    assert trace_errors(data) == []
    (mark,) = [e for e in data["traceEvents"] if e.get("cat") == "straggler"]
    assert mark["ph"] == "i" and mark["tid"] == 2 * 64
    assert mark["args"]["shape"] == "steady" and mark["name"] == "straggler from here: steady"
