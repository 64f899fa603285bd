"""Verdicts on real training stacks (issue 31): real gloo jobs not in samples/, analyzed through
the CLI as a user would. The job script is ``scripts/stacks.py``.

* One rank's extra ``all_reduce`` under DDP and FSDP2: its black box is numbered as its peers'
  dumps are, so the verdict is that call, at its number and line, in the log and in analyze.
* A hung DDP job whose ranks are all killed hard: the black boxes alone show where the others
  wait (a DDP bucket all-reduce only torch's recorder saw) and who never got there.
* A rank of a plain ``multiprocessing.Process`` job that raises dies of its exception.
* A job kept in a folder named ``flightrec``: its lines are its own.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tests.integration.jobs import SCRIPTS, Job, start_job
from tests.integration.test_cli_analyze import flightrec

SCRIPT = SCRIPTS / "stacks.py"


def line_of(text: str, script: Path = SCRIPT) -> int:
    """The line number of ``text`` in the job script."""
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def analyze(folder: Path, job: Job | None = None) -> tuple[int, dict[str, Any]]:
    result = flightrec("analyze", folder, "--json")
    assert result.returncode in (0, 1), result.stderr + (job.output() if job else "")
    return result.returncode, json.loads(result.stdout)


def wait_for_text(job: Job, rank: int, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in job.logs[rank].read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank} never printed {text!r}\n{job.output()}")
        time.sleep(0.1)


EXTRA = line_of("dist.all_reduce(grad_norm)")


def test_ddp_extra_all_reduce_on_one_rank_is_the_verdict_in_the_log_and_in_analyze(
    tmp_path: Path,
) -> None:
    """gloo aborts a rank on the size mismatch between rank 1's grad-norm all_reduce and its
    peers' next DDP bucket: the aborted rank leaves only its black box, whose numbers (torch's,
    since DDP's reducer runs collectives flightrec never sees) are its peers'."""
    env = {"FLIGHTREC_TIMEOUT": "10"}
    with start_job(
        SCRIPT, ["ddp_extra", "--pg-timeout", "10"], world_size=3, env=env, workdir=tmp_path
    ) as job:
        codes = job.wait(timeout=120)
        out = job.output()
    assert any(c < 0 for c in codes), (codes, out)  # gloo aborted a rank (SIGABRT)
    aborted = [r for r, c in enumerate(codes) if c < 0]
    assert not [p for p in job.dump_files() if f"rank{aborted[0]:05d}" in p.name], out
    status, report = analyze(job.dump_dir, job)
    first = report["findings"][0]
    assert status == 1 and first["kind"] == "mismatch" and first["ranks"] == [1], first
    assert f"scripts/stacks.py:{EXTRA}" in first["summary"], first["summary"]
    seq = first["seq"]
    # The log's verdict (from summaries, and the black box on the reporter's host) agrees.
    assert "Verdict: mismatch" in out, out
    assert re.search(rf"Rank 1 \(.*?\) passed \S+ to all_reduce #{seq} on group 0", out), out
    assert not re.search(r"Verdict: (dead_rank|missing_dump)", out), out


def test_fsdp2_extra_all_reduce_is_numbered_alike_in_the_black_box(tmp_path: Path) -> None:
    """FSDP2 on gloo (it runs on CPU in torch 2.13): the extra all_reduce meets the peers'
    all-gather and everyone hangs.
    Rank 1, killed hard after the hang, is then read from its black box alone: the same
    number, op and line as from its dump."""
    # fully_shard's first call loads torch._dynamo's rules (seconds on a busy machine) while
    # the other ranks wait in the first all-gather: a timeout that does not call that a hang.
    env = {"FLIGHTREC_TIMEOUT": "8"}
    with start_job(
        SCRIPT, ["fsdp_extra", "--pg-timeout", "60"], world_size=3, env=env, workdir=tmp_path
    ) as job:
        job.wait_for_dumps(count=3, timeout=90)  # the hang's: the watchdog's and the peers'
        wait_for_text(job, 0, "Dumps (on each rank's host)", 30)  # the verdict in the log
        out = job.output()
        job.signal(1, signal.SIGKILL)
        status, report = analyze(job.dump_dir, job)
        first = report["findings"][0]
        assert status == 1 and first["kind"] == "mismatch" and first["ranks"] == [1], out
        assert f"scripts/stacks.py:{EXTRA}" in first["summary"], first["summary"]
        seq = first["seq"]
        assert "Verdict: mismatch" in out and f"#{seq} on group 0" in out, out
        # Ranks 0 and 2's dumps, rank 1's black box alone.
        alone = tmp_path / "alone"
        alone.mkdir()
        for p in job.dump_dir.rglob("flightrec-rank*"):
            peer = "rank00001" not in p.name and p.suffix == ".frdump"
            if peer or ("rank00001" in p.name and ".ring" in p.name):
                shutil.copy(p, alone / p.name)
    status, report = analyze(alone)
    first = report["findings"][0]
    assert status == 1 and first["kind"] == "mismatch" and first["ranks"] == [1], first
    assert first["seq"] == seq and f"scripts/stacks.py:{EXTRA}" in first["summary"], first


def test_a_hung_ddp_jobs_black_boxes_alone_show_who_never_arrived(tmp_path: Path) -> None:
    """Rank 1 waits for a batch while rank 0 waits in a DDP bucket all-reduce (only torch's
    recorder sees it); both are killed hard before any hang is declared. Their black boxes
    say where rank 0 waits and that rank 1 never got there: never "no problem found"."""
    env = {"FLIGHTREC_TIMEOUT": "60"}
    with start_job(
        SCRIPT, ["ddp_stall", "--pg-timeout", "60"], world_size=2, env=env, workdir=tmp_path
    ) as job:
        wait_for_text(job, 1, "STALLING", 90)
        time.sleep(4)  # torch's counters stand still for 2 s before they are looked up
        for rank in range(2):
            job.signal(rank, signal.SIGKILL)
        job.wait(timeout=30)
    assert not job.dump_files(), job.dump_files()
    status, report = analyze(job.dump_dir, job)
    assert status == 1, report
    first = report["findings"][0]
    assert first["ranks"] == [1] and first["seq"] and "all_reduce" in first["op"], first
    assert "never entered" in first["summary"], first["summary"]


def test_a_multiprocessing_process_that_raises_dies_of_its_exception(tmp_path: Path) -> None:
    """Plain multiprocessing.Process: its bootstrap prints the traceback and exits 1; neither
    an excepthook nor sys.exit inside an except block sees the exception."""
    env = {"FLIGHTREC_TIMEOUT": "30"}
    with start_job(
        SCRIPT, ["raise", "--pg-timeout", "10"], world_size=2, env=env, launch="spawn",
        workdir=tmp_path,
    ) as job:  # fmt: skip
        codes = job.wait(timeout=120)
    assert codes != [0], job.output()
    status, report = analyze(job.dump_dir, job)
    assert status == 1, report
    crash = next(f for f in report["findings"] if f["ranks"] == [1])
    assert "died of RuntimeError: CUDA error: device-side assert triggered" in crash["summary"]
    assert f"scripts/stacks.py:{line_of('raise RuntimeError')}" in crash["summary"], crash
    assert crash["evidence"]["exception"]["seen_by"] == "multiprocessing.Process", crash
    assert "returned from main" not in json.dumps(report)


def test_a_job_in_a_folder_named_flightrec_keeps_its_line(tmp_path: Path) -> None:
    """The stalled rank waits in threading.Event.wait under the job's own next_batch: the
    verdict names the job's line, although the job lives in a folder named flightrec."""
    script = tmp_path / "flightrec" / "stacks.py"
    script.parent.mkdir()
    shutil.copy(SCRIPT, script)
    env = {"FLIGHTREC_TIMEOUT": "6"}
    with start_job(
        script, ["ddp_stall", "--pg-timeout", "60"], world_size=2, env=env, workdir=tmp_path
    ) as job:
        job.wait_for_dumps(count=2, timeout=90)
        time.sleep(1)
        status, report = analyze(job.dump_dir, job)
    first = report["findings"][0]
    assert status == 1 and first["ranks"] == [1], first
    line = line_of("while not threading.Event().wait", script)
    assert f"flightrec/stacks.py:{line}" in first["summary"], first["summary"]
    assert "threading.py" not in first["summary"], first["summary"]
