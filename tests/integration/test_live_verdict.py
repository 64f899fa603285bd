"""The verdict in the job's own log: real 4-rank gloo jobs whose ranks share no dump folder.

Each rank writes into a folder of its own (scripts/live_job.py), so the verdict can only come
through the job's store; the test reads nothing but the processes' combined output.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from tests.integration.jobs import SCRIPTS, Job, start_job

TIMEOUT_S = 3.0
STALL_LINE = next(
    i
    for i, line in enumerate((SCRIPTS / "live_job.py").read_text().splitlines(), 1)
    if "time.sleep(3600)" in line
)


def wait_for_text(job: Job, text: str, timeout: float) -> float:
    """Wall time at which ``text`` first showed in the job's output (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while text not in job.output():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in the job's output after {timeout}s\n{job.output()}")
        time.sleep(0.1)
    return time.time()


def onset(job: Job) -> float:
    """When the last waiting rank entered the all_reduce that hangs (wall clock)."""
    return max(float(t) for t in re.findall(r"WAITING (\d+\.\d+)", job.output()))


def own_folders_only(root: Path) -> None:
    for rank in range(4):
        names = [p.name for p in (root / "dumps" / f"rank{rank}").glob("*.frdump")]
        assert names and all(n.startswith(f"flightrec-rank{rank:05d}-") for n in names), names


def test_the_job_log_names_the_stalled_rank_the_collective_and_the_line(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": str(TIMEOUT_S)}
    with start_job("live_job.py", ["stall", "--bad-rank", "2"], env=env, workdir=tmp_path) as job:
        printed = wait_for_text(job, "Dumps (on each rank's host)", 60)
        waited = printed - onset(job)
        out = job.output()
    assert "Verdict: not_arrived" in out, out
    assert re.search(r"Rank 2 \([^)]*\) never entered all_reduce #5 on group 0", out), out
    assert f"save_checkpoint_shard at scripts/live_job.py:{STALL_LINE}" in out, out
    assert "hang declared; from 4 of 4 ranks' summaries" in out, out
    for rank in range(4):
        assert re.search(rf"rank {rank} on \S+: \S+/dumps/rank{rank}/flightrec-rank", out), out
    assert out.count("Verdict:") == 1, out  # one rank reports
    assert waited <= TIMEOUT_S + 5.0, f"verdict {waited:.1f} s after the hang's onset\n{out}"
    print(f"{out}\ntime from the hang's onset to the verdict in the log: {waited:.1f} s")
    own_folders_only(tmp_path)


def test_a_ddp_job_gets_its_verdict_too(tmp_path: Path) -> None:
    """DDP's C++ reducer issues collectives only PyTorch's recorder sees (merged into the
    dumps with no record id of flightrec's) and its gradient buckets sit six frames below
    ``loss.backward()``: the summaries keep both, and the log names the rank and the line."""
    env = {"FLIGHTREC_TIMEOUT": str(TIMEOUT_S)}
    with start_job("live_job.py", ["uneven", "--bad-rank", "1"], env=env, workdir=tmp_path) as job:
        wait_for_text(job, "Dumps (on each rank's host)", 60)
        out = job.output()
    assert "hang declared; from 4 of 4 ranks' summaries" in out, out
    assert re.search(r"Rank 1 \([^)]*\) called barrier as collective #\d+ on group 0", out), out
    assert re.search(r"ranks 0,2-3 called all_reduce \(op mismatch\)", out.replace("\n", " ")), out
    assert re.search(r"wait in DDP gradient-bucket all_reduce at\s+scripts/live_job.py:\d+", out), (
        out
    )
    assert "recorder/hooks/ddp.py" not in out, out


def test_flightrec_verdict_0_turns_it_off(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": str(TIMEOUT_S), "FLIGHTREC_VERDICT": "0"}
    with start_job("live_job.py", ["stall"], env=env, workdir=tmp_path) as job:
        job.wait_for_dumps(4, timeout=60)
        time.sleep(TIMEOUT_S + 2)
        out = job.output()
    assert "Verdict" not in out and "flightrec:" not in out, out


def test_under_torchrun_a_rank_that_died_of_an_exception_is_named_with_it(
    tmp_path: Path,
) -> None:
    # The dying rank publishes its summary, exception included, and starts a round; torchrun
    # then stops the others with SIGTERM, which joins that round: one verdict, all 4 ranks.
    env = {"FLIGHTREC_TIMEOUT": "60"}
    with start_job(
        "live_job.py", ["raise", "--bad-rank", "1"], env=env, workdir=tmp_path, launch="torchrun"
    ) as job:
        job.wait(90)
        out = job.output()
    assert out.count("flightrec verdict: ") == 1, out
    assert "flightrec verdict: a rank died; from 4 of 4 ranks' summaries" in out, out
    assert "Verdict: dead_rank" in out, out
    line = next(
        i
        for i, text in enumerate((SCRIPTS / "live_job.py").read_text().splitlines(), 1)
        if "raise ValueError" in text
    )
    verdict = re.search(r"Rank 1 \(.*?\) died of ValueError: bad batch: label 12 out of range", out)
    assert verdict is not None, out
    assert f"scripts/live_job.py:{line}" in out, out
    assert "left no dump" not in out and "no answer from" not in out, out


def test_a_rank_that_dies_of_an_exception_starts_the_verdict_itself(tmp_path: Path) -> None:
    # No torchrun: nothing stops the others, who are in a long step and would never see a
    # hang of their own. The dying rank starts a round; a live rank reports it.
    env = {"FLIGHTREC_TIMEOUT": "60"}
    with start_job("live_job.py", ["raise", "--bad-rank", "1"], env=env, workdir=tmp_path) as job:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Dumps (on each rank's host)" not in job.output():
            time.sleep(0.5)
        out = job.output()
    assert "flightrec verdict: a rank died; from 4 of 4 ranks' summaries" in out, out
    assert re.search(r"Rank 1 \(.*?\) died of ValueError: bad batch", out), out
    assert "ranks 0,2-3 are in long_step at scripts/live_job.py" in out, out


def test_under_torchrun_a_crashed_rank_is_named_before_the_others_are_stopped(
    tmp_path: Path,
) -> None:
    env = {"FLIGHTREC_TIMEOUT": "60"}  # no hang is declared: SIGTERM starts the exchange
    with start_job(
        "live_job.py", ["crash", "--bad-rank", "1"], env=env, workdir=tmp_path, launch="torchrun"
    ) as job:
        job.wait(90)
        out = job.output()
    assert "stopped by SIGTERM; from 3 of 4 ranks' summaries" in out, out
    assert "Verdict: missing_dump" in out and "Rank 1 left no dump" in out, out
    assert "ranks 0,2-3 are in long_step at scripts/live_job.py" in out, out
    assert "no answer from rank 1" in out, out
    for rank in (0, 2, 3):
        names = [p.name for p in (tmp_path / "dumps" / f"rank{rank}").glob("*.frdump")]
        assert any("signal_term" in n for n in names), names
