"""The paths users hit most, tried as a new user would: a small DDP script (its only
collectives are DDP's) under torchrun with each rendezvous, 4 gloo ranks
(``scripts/ddp_job.py``), analysed through the CLI and read from the job's own log.

- torch's own process-group timeout shorter than ``FLIGHTREC_TIMEOUT``: gloo's timeout kills
  the ranks waiting in the backward's all-reduces before flightrec's watchdog fires; the
  verdict (log and ``analyze``) still names the rank that never arrived, with its line;
- one rank's extra all-reduce meets its peers' gradient bucket: the peers that gloo's reset
  connection killed are folded under the mismatch, not a second finding.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from tests.integration.jobs import SCRIPTS, Job, start_job
from tests.integration.test_cli_analyze import flightrec


def line_of(text: str, after: str = "") -> int:
    """The line of ``scripts/ddp_job.py`` holding ``text`` (the first after ``after``)."""
    lines = (SCRIPTS / "ddp_job.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines[start:], start + 1) if text in line)


STALL_LINE = line_of("time.sleep(0.05)", after="def load_batch")
METRIC_LINE = line_of("dist.all_reduce(value)")


def analyze(job: Job) -> dict[str, Any]:
    result = flightrec("analyze", job.dump_dir, "--json")
    assert result.returncode == 1, result.stderr + job.output()
    return dict(json.loads(result.stdout))


def finish(job: Job, timeout: float = 150) -> str:
    try:
        job.wait(timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
    return job.output()


@pytest.mark.parametrize(
    ("launch", "hook"),
    [("torchrun", ""), ("torchrun-c10d", ""), ("torchrun-standalone", ""), ("torchrun", "0")],
)
def test_torchs_own_timeout_first_still_names_the_rank_that_never_arrived(
    tmp_path: Path, launch: str, hook: str
) -> None:
    """Rank 2 stalls before its backward; gloo's 4 s timeout raises in the others' backward
    long before flightrec's 60 s watchdog; torchrun then stops rank 2. ``FLIGHTREC_DDP_HOOK=0``:
    the buckets are known only from PyTorch's recorder, which marks a failed one retired
    like a finished one."""
    env = {"FLIGHTREC_TIMEOUT": "60", **({"FLIGHTREC_DDP_HOOK": hook} if hook else {})}
    args = ["stall", "--culprit", "2", "--pg-timeout", "4"]
    with start_job("ddp_job.py", args, env=env, launch=launch, workdir=tmp_path) as job:
        out = finish(job)
    where = f"load_batch at scripts/ddp_job.py:{STALL_LINE}"
    # The job's log.
    assert out.count("Verdict:") == 1, out
    assert "Verdict: not_arrived" in out, out
    assert re.search(r"Rank 2 \([^)]*\) never entered DDP gradient-bucket all_reduce #\d+", out), (
        out
    )
    assert where in out, out
    assert "out of step" not in out, out
    # flightrec analyze.
    report = analyze(job)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("not_arrived", [2]), report["findings"]
    assert first["op"] == "all_reduce" and where in first["summary"], first["summary"]
    assert [f["kind"] for f in report["findings"]] == ["not_arrived"], report["findings"]
    assert first["consequences"][0]["waiting_ranks"] == [0, 1, 3]
    assert first["consequences"][0]["ended_ranks"] == [0, 1, 3]
    folded = {r for x in first["explains"] for r in x["ranks"] if x["kind"] == "dead_rank"}
    assert folded == {0, 1, 3}, first["explains"]
    # What a user sees next: the progress table lists no rank whose dump the panel lists as
    # having none, the HTML says what the terminal says, and show counts what it shows.
    assert "no dump:" not in out, out
    page = tmp_path / "report.html"
    assert flightrec("analyze", job.dump_dir, "--html", page).returncode == 1
    html = page.read_text()
    assert "waited in DDP gradient-bucket all_reduce" in html and "then died" in html
    assert "ranks 0-1,3 wait in" not in html
    exit_dump = next(p for p in job.dump_files() if "rank00001" in p.name and "exit" in p.name)
    shown = flightrec("show", exit_dump, env={"COLUMNS": "200"}).stdout
    assert "(0 recorded)" not in shown, shown
    if hook == "0":  # the buckets came from PyTorch's recorder: no record id of flightrec's
        assert "entries from PyTorch's recorder" in shown, shown
    helped = flightrec("analyze", "-h", env={"COLUMNS": "200"}).stdout
    assert "pip install 'torch-flightrec[s3]'" in helped, helped


@pytest.mark.parametrize("hook", ["", "0"])
def test_the_peers_an_extra_all_reduce_broke_are_folded_under_it(tmp_path: Path, hook: str) -> None:
    """Rank 3 all-reduces one metric more than its peers, whose gradient bucket meets it:
    gloo fails the exchange and resets its peers' connections; they die inside their
    backward. One finding: rank 3's extra call; their deaths are what it explains."""
    env = {"FLIGHTREC_TIMEOUT": "60", **({"FLIGHTREC_DDP_HOOK": hook} if hook else {})}
    args = ["extra", "--culprit", "3", "--pg-timeout", "20"]
    with start_job("ddp_job.py", args, env=env, launch="torchrun", workdir=tmp_path) as job:
        out = finish(job)
    report = analyze(job)
    first = report["findings"][0]
    assert first["ranks"] == [3], report["findings"]
    assert f"scripts/ddp_job.py:{METRIC_LINE}" in first["summary"], first["summary"]
    assert not [f for f in report["findings"][1:] if f["kind"] == "dead_rank"], report["findings"]
    dead = {r for x in first["explains"] for r in x["ranks"] if x["kind"] == "dead_rank"}
    assert dead - {3}, (first["explains"], out)  # its peers' deaths (its own, when gloo aborted it)


def test_after_a_trigger_the_hang_the_watchdog_declared_is_the_verdict(tmp_path: Path) -> None:
    """``flightrec trigger`` while the others have waited a moment (under the 15 s timeout),
    then the watchdog declares the hang: the default analysis describes the declared hang,
    not the trigger's snapshot (low confidence, below the timeout)."""
    from tests.integration.test_live_workflows import flightrec as cli
    from tests.integration.test_live_workflows import wait_for_marker, wait_for_text

    env = {"FLIGHTREC_TIMEOUT": "15"}
    args = ["stall", "--culprit", "2", "--pg-timeout", "120"]
    with start_job("ddp_job.py", args, env=env, launch="torchrun", workdir=tmp_path) as job:
        wait_for_marker(job, "WAITING", 3)
        triggered = cli("trigger", "--host", "127.0.0.1", "--port", str(job.port))
        assert triggered.returncode == 0, (triggered.stdout, triggered.stderr)
        out = wait_for_text(job, "Dumps (on each rank's host)", 90)
        assert "Verdict: not_arrived" in out, out
    report = analyze(job)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("not_arrived", [2]), report["findings"]
    assert "low confidence" not in first["summary"] and "below_timeout" not in first, first
    assert not any("CLI_TRIGGER dump at" in n for n in report["notes"]), report["notes"]
    reasons = {p.name.rsplit("-", 1)[1].split(".")[0] for p in job.dump_files()}
    assert {"cli_trigger", "watchdog_timeout"} <= reasons, reasons
