"""FLIGHTREC_METRICS_PORT: scrape every rank of a live 4-rank gloo job, healthy and then hung."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.jobs import Job, free_port, start_job

WORLD = 4


def free_ports(n: int) -> int:
    """A base port with ``n`` consecutive free ports on 127.0.0.1 (one per local rank)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of one rank's /metrics, keyed by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def by_group(samples: Samples, name: str) -> dict[str, float]:
    return {dict(k[1])["process_group"]: v for k, v in samples.items() if k[0] == name}


def wait_scrape(job: Job, port: int, timeout: float = 20.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metrics on port {port}\n{job.output()}") from None
            time.sleep(0.1)


def test_metrics_move_from_healthy_to_hung(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="metrics need prometheus_client (test extra)")
    base = free_ports(WORLD)
    go = tmp_path / "go"
    env = {
        "FLIGHTREC_METRICS_PORT": str(base),
        "FLIGHTREC_METRICS_ADDR": "127.0.0.1",
        "FLIGHTREC_TIMEOUT": "3",
        "FLIGHTREC_VERDICT": "0",
    }
    with start_job("metrics_job.py", ["--go", str(go)], env=env, workdir=tmp_path) as job:
        for rank in range(WORLD):
            job.wait_for_output(rank, "HEALTHY", timeout=30)
        for rank in range(WORLD):
            m = wait_scrape(job, base + rank)  # on port + LOCAL_RANK
            info = next(k for k in m if k[0] == "flightrec_info")
            assert dict(info[1])["rank"] == str(rank)
            issued = by_group(m, "flightrec_collectives_issued_total")
            assert sorted(issued.values()) == [2, 5], issued
            assert by_group(m, "flightrec_collectives_completed_total") == issued
            assert value(m, "flightrec_pending_operations") == 0
            assert value(m, "flightrec_oldest_pending_seconds") == 0
            assert value(m, "flightrec_timeout_seconds") == 3
            assert value(m, "flightrec_dumps_written_total") == 0
            assert value(m, "flightrec_errors_total") == 0
            assert value(m, "flightrec_blackbox", flightrec_blackbox="recording") == 1

        go.touch()  # rank 2 stalls; the others wait in an all_reduce
        job.wait_for_output(0, "WAITING", timeout=10)
        time.sleep(0.5)
        first = scrape(base)
        time.sleep(0.6)
        later = scrape(base)
        issued = by_group(later, "flightrec_collectives_issued_total")
        completed = by_group(later, "flightrec_collectives_completed_total")
        default = max(issued, key=lambda g: issued[g])
        assert issued[default] == 6 and completed[default] == 5, (issued, completed)
        assert value(later, "flightrec_pending_operations") == 1
        age0 = value(first, "flightrec_oldest_pending_seconds")
        age1 = value(later, "flightrec_oldest_pending_seconds")
        assert 0 < age0 < age1, (age0, age1)
        stalled = scrape(base + 2)  # in its data loader: nothing pending there
        assert value(stalled, "flightrec_pending_operations") == 0

        job.wait_for_dumps(count=WORLD, timeout=20)  # the watchdog fired; every rank dumped
        for rank in range(WORLD):
            m = scrape(base + rank)
            assert value(m, "flightrec_dumps_written_total") >= 1, rank
        hung = scrape(base)
        assert value(hung, "flightrec_oldest_pending_seconds") > 3


@pytest.mark.parametrize("hook", ["", "0"])
def test_a_ddp_hang_shows_in_the_metrics(tmp_path: Path, hook: str) -> None:
    """A DDP job (only DDP's collectives): rank 2 stalls before its backward, the others wait
    in its gradient-bucket all-reduces. Their metrics show the wait, before the watchdog fires.
    ``FLIGHTREC_DDP_HOOK=0``: the buckets go through DDP's C++ hook, and the wait is known from
    PyTorch's recorder (the watchdog's look at its counters, once a second)."""
    pytest.importorskip("prometheus_client", reason="metrics need prometheus_client (test extra)")
    base = free_ports(WORLD)
    go = tmp_path / "go"
    env = {
        "FLIGHTREC_METRICS_PORT": str(base),
        "FLIGHTREC_METRICS_ADDR": "127.0.0.1",
        "FLIGHTREC_TIMEOUT": "30",
        "FLIGHTREC_VERDICT": "0",
        **({"FLIGHTREC_DDP_HOOK": hook} if hook else {}),
    }
    args = ["train", "--steps", "3", "--go", str(go), "--culprit", "2"]
    with start_job("ddp_job.py", args, env=env, workdir=tmp_path) as job:
        for rank in range(WORLD):
            job.wait_for_output(rank, "HEALTHY", timeout=60)
        # Nothing pending once the steps are over (torch's counters are looked at once a
        # second: a step that took over 2 s on a loaded machine reads pending until then).
        deadline = time.monotonic() + 5
        while value(wait_scrape(job, base), "flightrec_pending_operations") != 0:
            assert time.monotonic() < deadline, job.output()
            time.sleep(0.2)
        go.touch()
        job.wait_for_output(0, "WAITING", timeout=20)
        deadline = time.monotonic() + 15  # (the C++ hook's wait is seen after 2 s pending)
        while value(m := scrape(base), "flightrec_oldest_pending_seconds") == 0:
            assert time.monotonic() < deadline, job.output()
            time.sleep(0.2)
        assert value(m, "flightrec_pending_operations") >= 1
        time.sleep(1.1)
        later = scrape(base)
        assert value(later, "flightrec_oldest_pending_seconds") > value(
            m, "flightrec_oldest_pending_seconds"
        )
        stalled = scrape(base + 2)  # in its data loader: nothing pending there
        assert value(stalled, "flightrec_pending_operations") == 0
        assert job.dump_files() == []  # all before the watchdog fired
