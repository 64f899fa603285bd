"""The metrics collector over a hand-fed recorder: what a scrape reads, with a fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flightrec.recorder.config import Config
from flightrec.recorder.hotpath.groups import GroupInfo
from flightrec.recorder.hotpath.ring import COMPLETED, ENQUEUED
from flightrec.recorder.metrics import (
    BLACKBOX_STATES,
    Counts,
    FlightrecCollector,
    WarningCounter,
    blackbox_state,
    metrics_port,
)

pytest.importorskip("prometheus_client", reason="metrics need prometheus_client (test extra)")
pytest.importorskip("torch", reason="the recorder needs torch")

S = 1_000_000_000


def recorder(tmp_path: Path, blackbox: bool = False):  # type: ignore[no-untyped-def]
    from flightrec.recorder.recording.recorder import Recorder

    return Recorder(
        Config(enabled=True, directory=str(tmp_path), buffer=8, timeout_s=10, blackbox=blackbox)
    )


def issue(rec, group: GroupInfo, at_ns: int, done: bool) -> None:  # type: ignore[no-untyped-def]
    seq = group.next_seq()
    rid = rec.ring.append(at_ns, ENQUEUED, seq, 0, group.index, 0, 0, -1, 0, 0, 0, 0, 0, 0)
    if done:
        rec.ring.finish(rid, COMPLETED, at_ns + 1000)


def samples(collector: FlightrecCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_issued_completed_pending_and_oldest_age_per_group(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    world = GroupInfo(0, "0", "default_pg", (0, 1, 2, 3), "gloo")
    pair = GroupInfo(1, "5", "tp", (0, 1), "gloo")
    rec.groups.groups.extend([world, pair])
    for i in range(3):
        issue(rec, world, i * S, done=True)
    issue(rec, world, 10 * S, done=False)
    issue(rec, pair, 12 * S, done=False)
    now = [14 * S]
    counts = Counts(dumps_written=2, dumps_failed=1, warnings=3)
    c = FlightrecCollector(rec, counts, None, lambda: (1, 4, "job-7"), clock=lambda: now[0])
    m = samples(c)
    issued = (
        "flightrec_collectives_issued_total",
        (("pg_desc", "default_pg"), ("process_group", "0")),
    )
    done = ("flightrec_collectives_completed_total", issued[1])
    assert m[issued] == 4 and m[done] == 3
    tp = (("pg_desc", "tp"), ("process_group", "5"))
    assert m[("flightrec_collectives_issued_total", tp)] == 1
    assert m[("flightrec_collectives_completed_total", tp)] == 0
    assert m[("flightrec_pending_operations", ())] == 2
    assert m[("flightrec_oldest_pending_seconds", ())] == pytest.approx(4.0)
    assert m[("flightrec_timeout_seconds", ())] == 10
    assert m[("flightrec_dumps_written_total", ())] == 2
    assert m[("flightrec_dump_failures_total", ())] == 1
    assert m[("flightrec_errors_total", ())] == 3
    assert m[("flightrec_blackbox", (("flightrec_blackbox", "off"),))] == 1
    info = next(k for k in m if k[0] == "flightrec_info")
    assert dict(info[1])["rank"] == "1" and dict(info[1])["job_id"] == "job-7"
    # The oldest pending op completes: the age falls to the next one's.
    for i in rec.ring.pending_slots():
        if rec.ring.read(i).group == 0:
            rec.ring.finish(rec.ring.read(i).record_id, COMPLETED, 13 * S)
    now[0] = 15 * S
    m = samples(c)
    assert m[("flightrec_oldest_pending_seconds", ())] == pytest.approx(3.0)
    assert m[done] == 4


def test_collectives_only_pytorchs_recorder_sees_count_as_pending(tmp_path: Path) -> None:
    """DDP's C++ hook (flightrec's own off), FSDP2, functional collectives: the watchdog's
    look at torch's counters finds the group's collective unfinished; a scrape counts it, and
    its age, unless the ring already holds a pending entry of that group."""
    from flightrec.recorder.native.watch import PendingNative

    rec = recorder(tmp_path)
    world = GroupInfo(0, "0", "default_pg", (0, 1, 2, 3), "gloo")
    pair = GroupInfo(1, "5", "tp", (0, 1), "gloo")
    rec.groups.groups.extend([world, pair])
    issue(rec, world, 1 * S, done=True)
    issue(rec, pair, 9 * S, done=False)
    native = [
        PendingNative("0", 7, "all_reduce", 5 * S),
        PendingNative("5", 2, "all_reduce", 8 * S),
    ]
    c = FlightrecCollector(
        rec, Counts(), None, lambda: (0, 4, ""), clock=lambda: 14 * S, native=lambda: native
    )
    m = samples(c)
    assert m[("flightrec_pending_operations", ())] == 2  # the ring's tp entry, torch's world one
    assert m[("flightrec_oldest_pending_seconds", ())] == pytest.approx(9.0)
    world_labels = (("pg_desc", "default_pg"), ("process_group", "0"))
    assert m[("flightrec_collectives_completed_total", world_labels)] == 1
    native.clear()
    assert samples(c)[("flightrec_oldest_pending_seconds", ())] == pytest.approx(5.0)


def test_a_quiet_recorder_reports_nothing_pending(tmp_path: Path) -> None:
    rec = recorder(tmp_path, blackbox=True)
    c = FlightrecCollector(rec, Counts(), None, lambda: (-1, 0, ""))
    m = samples(c)
    assert m[("flightrec_oldest_pending_seconds", ())] == 0
    assert m[("flightrec_pending_operations", ())] == 0
    state = blackbox_state(rec)
    assert state in BLACKBOX_STATES and state != "off"
    assert m[("flightrec_blackbox", (("flightrec_blackbox", state),))] == 1
    assert (
        sum(m[("flightrec_blackbox", (("flightrec_blackbox", s),))] for s in BLACKBOX_STATES) == 1
    )
    rec.blackbox.close(healthy=True)
    assert blackbox_state(rec) == "closed"


def test_flightrec_warnings_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    counts = Counts()
    counter = WarningCounter(counts)
    log = logging.getLogger("flightrec")
    handlers = list(log.handlers)
    log.addFilter(counter)
    try:
        # No handler added: the warnings still reach the job's log (Python's last resort).
        assert log.handlers == handlers
        log.info("flightrec: wrote x")
        log.warning("flightrec: could not write a dump")
        log.error("flightrec: worse")
    finally:
        log.removeFilter(counter)
    assert counts.warnings == 2
    assert [r.getMessage() for r in caplog.records] == [
        "flightrec: could not write a dump",
        "flightrec: worse",
    ]


def test_port_is_base_plus_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert metrics_port(9400) == 9403
    monkeypatch.delenv("LOCAL_RANK")
    assert metrics_port(9400) == 9400


def test_without_prometheus_client_the_server_says_which_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from flightrec.recorder.metrics import MetricsServer

    c = FlightrecCollector(recorder(tmp_path), Counts(), None, lambda: (0, 1, ""))
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"torch-flightrec\[metrics\]"):
        MetricsServer(c, 0, "127.0.0.1").start()
