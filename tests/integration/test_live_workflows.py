"""The live workflow as a user meets it, on real 4-rank gloo jobs launched the ways users launch
them: ``srun``-style processes (MASTER_ADDR/MASTER_PORT), ``torchrun`` with a static
``--master-port``, with a c10d rendezvous, with ``--standalone``, and ``mp.spawn``.

- a trigger, SIGUSR1 or ``flightrec.dump()`` during a hang never costs the hang its watchdog:
  it is still declared at its timeout, dumped, and its verdict printed;
- ``flightrec trigger`` reaches the job at the address the user knows, waits for the ranks'
  acknowledgements and says how many dumped (and which did not);
- one start-up line per node says that tracing is on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from flightrec.format import flightrec_pb2 as pb
from tests.integration.jobs import REPO, Job, child_env, free_port, start_job

TIMEOUT_S = "3"
STARTUP = "flightrec "  # the start-up line begins "flightrec <version>: tracing on"


def flightrec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, as a user runs it from another shell (no job variables set)."""
    base = child_env(flightrec=False)
    for name in ("MASTER_ADDR", "MASTER_PORT", "FLIGHTREC_DIR"):
        base.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", *args], env={**base, **(env or {})},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def wait_for_text(job: Job, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while text not in (out := job.output()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in the job's output after {timeout}s\n{out}")
        time.sleep(0.1)
    return out


def wait_for_marker(job: Job, text: str, count: int, timeout: float = 180) -> None:
    """Until ``count`` ranks printed ``text`` (every launch: the output may be one log)."""
    deadline = time.monotonic() + timeout
    while job.output().count(text) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} x {text!r} not in the output\n{job.output()}")
        time.sleep(0.1)


def startup_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"flightrec \S+: tracing on", line)]


def reasons(job: Job) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[1].split(".")[0] for p in job.dump_files())


def the_hang_is_declared(job: Job) -> str:
    """The hang's verdict in the log, and every rank's dump for it."""
    wait_for_marker(job, "WAITING", 3)  # (starting 4 ranks takes a minute on a busy machine)
    out = wait_for_text(job, "Dumps (on each rank's host)", 40)
    assert "Verdict: not_arrived" in out, out
    assert re.search(r"Rank 2 \([^)]*\) never entered all_reduce", out), out
    assert "data_loader_next at scripts/workflow.py" in out, out
    hang = [r for r in reasons(job) if r in ("watchdog_timeout", "peer_request")]
    assert len(hang) == 4, reasons(job)
    return out


# -- point 1: a trigger never costs the hang its watchdog ----------------------------------------
def test_a_trigger_at_the_rendezvous_endpoint_during_a_hang(tmp_path: Path) -> None:
    """torchrun with a c10d rendezvous: the user knows only ``--rdzv-endpoint``. (The issue's
    timeout: the trigger, torch's import included, must land before the hang is declared,
    and on a busy machine that takes seconds.)"""
    env = {"FLIGHTREC_TIMEOUT": "15"}
    with start_job(
        "workflow.py", ["loader"], env=env, launch="torchrun-c10d", workdir=tmp_path
    ) as job:
        wait_for_marker(job, "WAITING", 3)
        result = flightrec("trigger", "--host", "127.0.0.1", "--port", str(job.port))
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert re.match(r"4 of 4 ranks dumped \(request 1 at \S+ via the rendezvous", result.stdout)
        out = the_hang_is_declared(job)
        assert out.count("Verdict:") == 1, out
        assert len(startup_lines(out)) == 1, out  # one node: its lowest rank
    for items in job.dumps().values():  # each rank: the trigger's dump, then the hang's
        assert [pb.DumpReason.Name(d.header.reason) for _, d in items][:1] == ["CLI_TRIGGER"]


def test_sigusr1_during_a_hang(tmp_path: Path) -> None:
    """``srun``-style ranks: SIGUSR1 to a waiting rank and to the stalled one."""
    env = {"FLIGHTREC_TIMEOUT": TIMEOUT_S}
    with start_job("workflow.py", ["loader"], env=env, workdir=tmp_path) as job:
        for rank in (0, 1, 3):
            job.wait_for_output(rank, "WAITING", 180)
        job.signal(0, signal.SIGUSR1)
        job.signal(2, signal.SIGUSR1)
        job.wait_for_dumps(2, 10, reason="signal_usr1")
        the_hang_is_declared(job)


def test_flightrec_dump_from_the_script_during_a_hang(tmp_path: Path) -> None:
    """``mp.spawn``: every rank calls ``flightrec.dump()`` from a thread while the hang begins."""
    env = {"FLIGHTREC_TIMEOUT": TIMEOUT_S}
    with start_job(
        "workflow.py", ["loader", "--api-dump"], env=env, launch="spawn", workdir=tmp_path
    ) as job:
        wait_for_marker(job, "API DUMPED", 4)
        the_hang_is_declared(job)
    assert reasons(job).count("api_call") == 4


# -- point 2: the trigger reaches the job at the address the user knows --------------------------
@pytest.mark.parametrize("launch", ["torchrun-standalone", "spawn"])
def test_trigger_reaches_the_job(tmp_path: Path, launch: str) -> None:
    """``--standalone``: the job's FLIGHTREC_DIR (torchrun chose the port); ``mp.spawn``: the
    port the script chose, from the start-up line. (Static torchrun's ``--master-port`` and
    the c10d rendezvous endpoint: the tests above and below.)"""
    with start_job("workflow.py", ["train"], launch=launch, workdir=tmp_path) as job:
        wait_for_marker(job, "READY", 4)
        out = job.output()
        (line,) = startup_lines(out)
        assert f"dumps in {job.dump_dir}" in line and "verdict in the log: on" in line, line
        if launch == "torchrun-standalone":
            args = ["trigger", str(job.dump_dir)]
        else:
            args = line.split("dump now with: flightrec ")[1].split()
        result = flightrec(*args)
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert result.stdout.startswith("4 of 4 ranks dumped (request 1 at "), result.stdout
    assert reasons(job).count("cli_trigger") == 4


def test_trigger_names_the_ranks_that_did_not_answer(tmp_path: Path) -> None:
    """``srun``-style ranks, the trigger run with the job's MASTER_ADDR/MASTER_PORT: one rank
    stopped (SIGSTOP) is named, and the exit status says not every rank dumped."""
    with start_job("workflow.py", ["train"], workdir=tmp_path) as job:
        wait_for_marker(job, "READY", 4)
        job.signal(2, signal.SIGSTOP)
        try:
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(job.port)}
            result = flightrec("trigger", "--wait", "3", env=env)
        finally:
            job.signal(2, signal.SIGCONT)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stdout.startswith("3 of 4 ranks dumped (request 1 at 127.0.0.1:"), result
        assert "no answer within 3 s from rank 2" in result.stdout, result.stdout


def test_trigger_says_when_no_rank_answered(tmp_path: Path) -> None:
    """Static torchrun, every worker stopped (the agent's store still answers): exit 2, and
    the same trigger once they run again: every rank dumps."""
    with start_job("workflow.py", ["train"], launch="torchrun", workdir=tmp_path) as job:
        wait_for_marker(job, "READY", 4)
        workers = [int(p) for p in subprocess.check_output(
            ["pgrep", "-P", str(job.procs[0].pid)], text=True).split()]  # fmt: skip
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            stopped = flightrec("trigger", "--port", str(job.port), "--wait", "2")
        finally:
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        running = flightrec("trigger", "--port", str(job.port))
    assert stopped.returncode == 2, (stopped.stdout, stopped.stderr)
    assert re.match(r"flightrec: 0 of 4 ranks answered within 2 s \(request 1 at ", stopped.stderr)
    assert stopped.stdout == ""
    # Request 1 reached them when they ran again; request 2 is answered at once.
    assert running.returncode == 0, (running.stdout, running.stderr)
    assert running.stdout.startswith("4 of 4 ranks dumped (request 2 at "), running.stdout


def test_trigger_at_a_dead_address_is_one_line_within_the_timeout() -> None:
    started = time.monotonic()
    result = flightrec("trigger", "--port", str(free_port()), "--timeout", "2")
    took = time.monotonic() - started
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1 and "nothing answers at 127.0.0.1:" in result.stderr
    assert took < 2 + 10, took  # the CLI's own start on a busy machine, never a retry loop


def test_trigger_at_a_store_with_no_traced_job() -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    result = flightrec("trigger", "--port", str(store.port), "--wait", "1")
    assert result.returncode == 2, result
    assert "no traced job registered there" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_trigger_with_a_folder_no_job_wrote(tmp_path: Path) -> None:
    result = flightrec("trigger", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"flightrec: error: {tmp_path}: no .flightrec-endpoint file")


# -- point 3: one hang, one verdict --------------------------------------------------------------
def test_a_pipeline_hang_gets_one_verdict(tmp_path: Path) -> None:
    """torchrun (static): stage 2 of a 4-stage send/recv pipeline stalls. Rank 1 reaches its
    final barrier seconds after the others declared the hang, so it declares it again (request
    2) while ranks 0 and 3 are still covered by their own hang dumps. They answer request 2 all
    the same, and its report says that the verdict of request 1 stands: never a second panel,
    never "left no dump" for a live rank."""
    env = {"FLIGHTREC_TIMEOUT": TIMEOUT_S}
    args = ["pipe", "--late", "4.5"]
    with start_job("workflow.py", args, env=env, launch="torchrun", workdir=tmp_path) as job:
        wait_for_marker(job, "WAITING", 3)
        wait_for_text(job, "Dumps (on each rank's host)", 40)
        time.sleep(float(TIMEOUT_S) + 6)  # rank 1's own declaration, and its round
        out = job.output()
    assert out.count("Verdict:") == 1, out
    assert "missing_dump" not in out and "left no dump" not in out, out
    assert re.search(r"Rank 2 \([^)]*\) never entered the send matching rank 3's recv", out), out
    again = [line for line in out.splitlines() if "request 2" in line]
    for line in again:  # (a busy machine may fold rank 1's wait into request 1)
        assert "4 of 4 ranks answered): the verdict of request 1 stands: not_arrived" in line, out
    print(f"request 2: {again}")


# -- point 4: tracing adds nothing to the job's log but its own lines ----------------------------
def _log_lines(out: str) -> list[str]:
    """The log's lines, timestamps and the harness's headers left out, flightrec's own too."""
    lines = []
    for line in out.splitlines():
        if line.startswith(("--- process", "flightrec ")) or not line.strip():
            continue
        lines.append(re.sub(r"\d{4} \d\d:\d\d:\d\d\.\d+", "<time>", line))
    return sorted(lines)


def test_a_traced_pipelining_job_logs_what_an_untraced_one_does(tmp_path: Path) -> None:
    """torchrun (static), torch.distributed.pipelining's GPipe over 4 stages, torch's C++
    warnings shown (the harness hides them elsewhere): the traced log holds the untraced
    log's lines, and beyond them only flightrec's start-up line."""
    logs = {}
    for traced in (False, True):
        with start_job(
            "workflow.py", ["gpipe", "--steps", "3"], env={"TORCH_CPP_LOG_LEVEL": "WARNING"},
            launch="torchrun", flightrec=traced, workdir=tmp_path / str(traced),
        ) as job:  # fmt: skip
            assert job.wait(300) == [0], job.output()
            logs[traced] = job.output()
    assert "DONE" in logs[True]
    assert _log_lines(logs[True]) == _log_lines(logs[False]), logs[True]
    assert len(startup_lines(logs[True])) == 1 and not startup_lines(logs[False])


# -- points 6, 7, 8: a reused FLIGHTREC_DIR, black boxes, file modes ----------------------------
@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The jobs started inside inherit ``mask`` (a site's group-readable setting)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_a_reused_folder_of_two_jobs(tmp_path: Path) -> None:
    """An ``mp.spawn`` job hangs, then a ``torchrun --standalone`` job runs in the same
    FLIGHTREC_DIR. While the second runs, its black boxes are all the folder holds of it: the
    report of the default (newest) job says what they are and names the other job; ``--job``
    picks that one. Every file follows the umask (027: group-readable)."""
    shared = tmp_path / "dumps"
    env = {"FLIGHTREC_TIMEOUT": TIMEOUT_S, "FLIGHTREC_DIR": str(shared)}
    with umask(0o027):
        with start_job("workflow.py", ["loader"], env=env, launch="spawn", workdir=tmp_path) as a:
            the_hang_is_declared(a)
        first = read_job_id(shared)
        args = ["train", "--steps", "5", "--idle"]
        with start_job(
            "workflow.py", args, env=env, launch="torchrun-standalone", workdir=tmp_path
        ) as b:
            wait_for_marker(b, "IDLE", 4)
            newest = flightrec("analyze", str(shared))
            chosen = flightrec("analyze", str(shared), "--job", first, "--json")
            rings = sorted(shared.glob("*.ring"))
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in shared.iterdir()}
    assert newest.returncode == 0, (newest.stdout, newest.stderr)
    text = " ".join(newest.stdout.split())
    assert "no rank wrote a dump: this is each rank's black box" in text, text
    assert "FLIGHTREC_DUMP_ON_EXIT=1" in text, text
    assert f"ignored another job {first!r} (4 ranks" in text and "choose one with --job ID" in text
    assert chosen.returncode == 1, chosen.stderr
    report = json.loads(chosen.stdout)
    assert (report["findings"][0]["kind"], report["findings"][0]["ranks"]) == ("not_arrived", [2])
    assert len(rings) == 8  # the hung job was killed: its black boxes stay too
    assert set(modes.values()) == {0o640}, modes  # dumps, black boxes, their tables, endpoint


def read_job_id(folder: Path) -> str:
    from flightrec.format.read import read_dump

    return read_dump(next(folder.glob("*.frdump"))).header.job_id


def test_cli_conventions(tmp_path: Path) -> None:
    """``-h`` is ``--help``; ``--trace`` into a missing folder and an empty folder are one line
    each, exit 2."""
    assert flightrec("trigger", "-h").stdout == flightrec("trigger", "--help").stdout
    trace = flightrec(
        "analyze", str(REPO / "samples" / "op_mismatch"), "--trace", str(tmp_path / "no" / "t.json")
    )
    assert trace.returncode == 2 and trace.stderr.count("\n") == 1, trace.stderr
    assert "no such folder" in trace.stderr
    empty = flightrec("analyze", str(tmp_path))
    assert empty.returncode == 2
    assert (
        empty.stderr
        == f"flightrec: error: {tmp_path}: no readable dump (the folder holds no files)\n"
    )
