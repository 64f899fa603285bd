"""The timeline file against the Trace Event Format, and what it shows.

``trace_errors`` checks what ui.perfetto.dev and chrome://tracing need from a JSON object trace:
required fields and their types per phase, non-decreasing timestamps along each track, and
complete slices of one track that nest rather than partly overlap. The integration test of a
real job uses it too.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from flightrec.analysis import analyze, analyze_dir
from flightrec.format import flightrec_pb2 as pb
from flightrec.report.renderer import rendered
from flightrec.report.trace import TraceRenderer, trace_dict
from tests.unit.factories import Job, healthy
from tests.unit.test_clocks import timed_job

DATA = Path(__file__).resolve().parents[1] / "data"
_META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def trace_errors(trace: Any) -> list[str]:
    """Every way ``trace`` breaks the Trace Event Format (JSON object form); empty when valid."""
    errors: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errors.append("displayTimeUnit must be ms or ns")
    last_ts: dict[tuple[int, int], float] = {}
    open_ends: dict[tuple[int, int], list[float]] = defaultdict(list)
    for n, e in enumerate(trace["traceEvents"]):
        where = f"event {n}"
        if not isinstance(e, dict):
            errors.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(ph, str) or not ph:
            errors.append(f"{where}: no ph")
            continue
        if not isinstance(e.get("name"), str):
            errors.append(f"{where}: name must be a string")
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            errors.append(f"{where}: pid and tid must be integers")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            errors.append(f"{where}: args must be an object")
        if ph == "M":
            if e["name"] not in _META_NAMES:
                errors.append(f"{where}: unknown metadata event {e['name']}")
            key = "name" if e["name"].endswith("_name") else "sort_index"
            if key not in e.get("args", {}):
                errors.append(f"{where}: metadata without args.{key}")
            continue
        if ph not in ("X", "i", "I"):
            errors.append(f"{where}: unexpected phase {ph}")
            continue
        ts = e.get("ts")
        if not _number(ts):
            errors.append(f"{where}: ts must be a number")
            continue
        track = (e["pid"], e["tid"])
        if ts < last_ts.get(track, float("-inf")):
            errors.append(f"{where}: ts goes back on track {track}")
        last_ts[track] = ts
        if ph == "X":
            dur = e.get("dur")
            if not _number(dur) or dur < 0:
                errors.append(f"{where}: X event needs a duration >= 0")
                continue
            stack = open_ends[track]
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1] + 1e-6:
                errors.append(f"{where}: slice overlaps its parent on track {track}")
            stack.append(ts + dur)
        elif e.get("s", "t") not in ("g", "p", "t"):
            errors.append(f"{where}: instant scope must be g, p or t")
    return errors


def _trace(job: Job) -> dict[str, Any]:
    text = rendered(TraceRenderer, analyze(job.run()))
    out = json.loads(text)
    assert isinstance(out, dict)
    return out


def test_validator_rejects_broken_traces() -> None:
    ok = {"name": "a", "ph": "X", "ts": 5.0, "dur": 2.0, "pid": 1, "tid": 1}
    assert trace_errors({"traceEvents": [ok]}) == []
    assert trace_errors([ok]) == ["not a JSON object with a traceEvents list"]
    back = dict(ok, ts=1.0)
    assert "goes back" in trace_errors({"traceEvents": [ok, back]})[0]
    assert "duration" in trace_errors({"traceEvents": [dict(ok, dur=-1)]})[0]
    partial = dict(ok, ts=6.0, dur=5.0)  # starts inside ok, ends after it
    assert "overlaps" in trace_errors({"traceEvents": [ok, partial]})[0]
    nested = dict(ok, ts=5.5, dur=1.0)
    assert trace_errors({"traceEvents": [ok, nested]}) == []
    assert "pid" in trace_errors({"traceEvents": [{"name": "a", "ph": "X", "ts": 1}]})[0]
    assert "ts" in trace_errors({"traceEvents": [dict(ok, ts="1")]})[0]


def test_hang_trace_is_valid_and_marks_the_hang() -> None:
    job = healthy(Job(), steps=4)
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    trace = _trace(job)
    assert trace_errors(trace) == []
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"node0", "node1"}  # the factory puts two ranks per host
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"rank 0 (cpu)", "rank 1 (cpu)", "rank 2 (cpu)", "rank 3 (cpu)"}
    hang = [e for e in events if e.get("cat") == "hang"]
    assert len(hang) == 1 and hang[0]["s"] == "g" and "#5" in hang[0]["name"]
    incomplete = [e for e in events if e["ph"] == "X" and "incomplete" in e["cat"]]
    assert sorted(e["args"]["rank"] for e in incomplete) == [0, 1, 3]
    assert all(e["name"] == "all_reduce (started, incomplete)" for e in incomplete)
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 4 * 4 + 3
    a = slices[0]["args"]
    assert {"group", "seq", "op", "sizes", "dtype", "state"} <= set(a)
    assert a["sizes"] == [[4, 4]] and a["dtype"] == "float32" and a["group"] == "0"
    dumps = [e for e in events if e.get("cat") == "dump"]
    assert len(dumps) == 4 and all(e["s"] == "t" for e in dumps)


def test_slices_of_one_collective_line_up_on_the_aligned_clock() -> None:
    # Rank 3's clock reads 250 s ahead: on the timeline its completions still meet the others'.
    job = timed_job(late={2: 40.0}, offset_ms={3: 250_000.0, 1: 7.0})
    trace = _trace(job)
    assert trace_errors(trace) == []
    ends: dict[int, list[float]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            ends[e["args"]["seq"]].append(e["ts"] + e["dur"])
    assert all(max(v) - min(v) < 100.0 for v in ends.values())  # within 0.1 ms (in us)
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert "rank 2 (cpu) straggler" in threads
    # The straggler's own slices are short, the others' hold its lateness.
    waits = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            waits[e["args"]["rank"]].append(e["args"]["wait_ms"])
    assert max(waits[2]) < 1.0 and min(waits[0]) > 38.0
    offsets = trace["metadata"]["clock"]["offsets_ms"]
    assert offsets["3"]["offset_ms"] == pytest.approx(250_000.0, abs=0.1)


def test_overlapping_operations_get_their_own_track() -> None:
    job = healthy(Job(world_size=2), steps=2)
    # An async all_reduce still running on rank 0 while it issues the next one.
    first = job.ranks[0].entries[0]
    job.ranks[0].entries[0] = type(first)(
        **{**{k: getattr(first, k) for k in first.__dataclass_fields__}, "complete_ns": 10**12}
    )
    trace = _trace(job)
    assert trace_errors(trace) == []
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert "rank 0 · 2 (cpu)" in threads


def test_recent_limits_entries_per_rank() -> None:
    report = analyze(healthy(Job(), steps=10).run())
    trace = trace_dict(report, recent=3)
    assert trace_errors(trace) == []
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 4 * 3


def test_clock_alignment_is_estimated_only_when_a_timeline_asks() -> None:
    report = analyze(timed_job(offset_ms={1: 5.0}).run())
    assert "timeline_clock" not in vars(report.clocks)  # analyze and JSON never pay for it
    trace_dict(report)
    assert report.timeline_clock.alignment.clocks[1].offset_ns > 4_000_000
    assert "timeline_clock" in vars(report.clocks)


def _with(entry: Any, **changes: Any) -> Any:
    return type(entry)(**{**{k: getattr(entry, k) for k in entry.__dataclass_fields__}, **changes})


def test_operations_without_an_end_are_instants_not_slices_to_the_dump() -> None:
    job = healthy(Job(world_size=2), steps=3)
    r0 = job.ranks[0].entries
    # Completed, but nobody recorded when (PyTorch's gloo recorder: retired, no end time).
    r0[0] = _with(r0[0], complete_ns=0)
    # Never marked complete, though a later collective of its group completed: it did too.
    r0[1] = _with(r0[1], state=pb.ENQUEUED, complete_ns=0)
    job.collective(ranks=[0, 1], complete=False)  # the hang: in flight at the dump
    trace = _trace(job)
    assert trace_errors(trace) == []
    events = trace["traceEvents"]
    rank0 = [e for e in events if e.get("args", {}).get("rank") == 0 and e.get("cat") != "dump"]
    instants = [e for e in rank0 if e["ph"] == "i"]
    assert sorted(e["args"]["seq"] for e in instants) == [1, 2]
    assert all("not recorded" in e["args"]["note"] and e["s"] == "t" for e in instants)
    slices = [e for e in rank0 if e["ph"] == "X"]
    assert [e["args"]["seq"] for e in slices] == [3, 4]
    assert slices[-1]["name"] == "all_reduce (started, incomplete)"
    assert "still running" in slices[-1]["args"]["note"]
    assert slices[0]["dur"] < 1_000  # its real completion, half a millisecond after its start
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert threads == ["rank 0 (cpu)", "rank 1 (cpu)"]


def test_each_thread_of_a_rank_gets_one_track() -> None:
    job = healthy(Job(world_size=2), steps=4)
    for r in (0, 1):
        entries = job.ranks[r].entries
        entries[1] = _with(entries[1], thread="pp-sender")
        entries[3] = _with(entries[3], thread="pp-sender")
    trace = _trace(job)
    assert trace_errors(trace) == []
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert threads == [
        "rank 0 · MainThread (cpu)",
        "rank 0 · pp-sender (cpu)",
        "rank 1 · MainThread (cpu)",
        "rank 1 · pp-sender (cpu)",
    ]
    tids = {(e["args"]["rank"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(tids) == 4


def test_a_real_ddp_job_on_gloo_is_drawn_as_recorded() -> None:
    """4 gloo ranks of DDP with a C++ comm hook (tests/data/ddp_gloo_stall, dumped by a real
    job: ``tests/integration/scripts/native_coverage.py ddp_hook --stall-rank 3``). Its
    reducer's collectives reach the dump only through PyTorch's recorder, which gives no end
    time: they were drawn as 28 slices running ~20 s to the dump, on 31 tracks."""
    report = analyze_dir(str(DATA / "ddp_gloo_stall"))
    trace = trace_dict(report)
    assert trace_errors(trace) == []
    events = trace["traceEvents"]
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert threads == [f"rank {r} (cpu)" for r in range(4)]
    slices = [e for e in events if e["ph"] == "X"]
    # The only slices that run to the dump are the hang itself: ranks 0-2 in the bucket's
    # all_reduce that rank 3 never entered.
    open_ = [e for e in slices if "incomplete" in e["cat"]]
    assert sorted(e["args"]["rank"] for e in open_) == [0, 1, 2]
    assert all(e["dur"] < 1e6 for e in slices if e not in open_)
    no_end = [e for e in events if e["ph"] == "i" and e["cat"].endswith("no_end")]
    assert len(no_end) == 28 and all(e["args"]["state"] == "COMPLETED" for e in no_end)
