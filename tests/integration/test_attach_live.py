"""`flightrec attach` on real gloo jobs started without any flightrec variable: hung in a
stall, a lock, a DataLoader worker, or healthy; launched by torchrun, mp.spawn or one process
per rank. Attach, analyze, check the verdict, and check that the job still runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightrec.attach.pyspy import find_pyspy
from tests.integration.jobs import Job, start_job

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "scripts" / "untraced.py"
PYSPY = find_pyspy()

pytestmark = pytest.mark.skipif(
    PYSPY is None, reason="py-spy is not installed (the attach extra; the test extra has it)"
)


def _line(marker: str) -> int:
    """The line of untraced.py that holds ``marker``."""
    for number, text in enumerate(SCRIPT.read_text().splitlines(), start=1):
        if marker in text:
            return number
    raise AssertionError(marker)


def flightrec(*args: str | Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    env.pop("FLIGHTREC", None)
    # py-spy from wherever this test found it (the same venv's bin/, or PATH).
    env["PATH"] = os.pathsep.join([str(Path(PYSPY or "").parent), env.get("PATH", "")])
    return subprocess.run(
        [*prefix, sys.executable, "-m", "flightrec_cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def analyze(folder: Path) -> tuple[int, dict[str, object]]:
    done = flightrec("analyze", folder, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def running(pid: int) -> bool:
    """Alive and not stopped (py-spy let it go): state R or S, never t, T or Z."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("R", "S", "D")


def ranks_of(job: Job) -> list[int]:
    """The processes of the job that are ranks (RANK in their environment, or mp.spawn's)."""
    from flightrec.attach.processes import find_ranks

    return [r.pid for r in find_ranks([p.pid for p in job.procs]).ranks]


def _hung(job: Job, rank: int) -> None:
    job.wait_for_output(rank, "HUNG", timeout=90)
    time.sleep(1.0)  # the others reach their all_reduce
    assert not job.dump_files(), "the job was traced: it must run without flightrec"


def test_torchrun_stall_names_the_stalled_rank_and_its_line(tmp_path: Path) -> None:
    with start_job(
        SCRIPT, ["stall", "--culprit", "2"], flightrec=False, launch="torchrun", workdir=tmp_path
    ) as job:
        job.wait_for_output(0, "HUNG", timeout=90)  # torchrun's log holds every rank's
        time.sleep(1.0)
        assert not job.dump_files()
        out = tmp_path / "snap"
        done = flightrec("attach", job.procs[0].pid, "--out", out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("4 of 4 ranks")
        pids = ranks_of(job)
        assert len(pids) == 4 and all(running(p) for p in pids)
        status, report = analyze(out)
    assert status == 1
    first = report["findings"][0]  # type: ignore[index]
    assert first["kind"] == "stack_hang" and first["ranks"] == [2]
    assert f"untraced.py:{_line('a write to a filesystem')}" in first["summary"]
    assert "wait in all_reduce" in first["summary"]


def test_spawn_rank_stuck_in_a_lock(tmp_path: Path) -> None:
    with start_job(
        SCRIPT, ["lock", "--culprit", "1"], world_size=3, flightrec=False, launch="spawn",
        workdir=tmp_path,
    ) as job:  # fmt: skip
        job.wait_for_output(0, "HUNG", timeout=90)
        time.sleep(1.0)
        out = tmp_path / "snap"
        done = flightrec("attach", job.procs[0].pid, "--out", out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "mp.spawn's index" in done.stdout
        status, report = analyze(out)
    assert status == 1
    first = report["findings"][0]  # type: ignore[index]
    assert first["kind"] == "stack_hang" and first["ranks"] == [1]
    assert f"wait_for_lock at scripts/untraced.py:{_line('held by a thread')}" in first["summary"]


def test_dataloader_worker_hang_names_the_rank_and_its_worker(tmp_path: Path) -> None:
    with start_job(
        SCRIPT, ["dataloader", "--culprit", "3"], flightrec=False, workdir=tmp_path
    ) as job:
        _hung(job, 3)
        out = tmp_path / "snap"
        # Rank processes given directly, not their launcher.
        done = flightrec("attach", *(p.pid for p in job.procs), "--out", out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"rank 3 pid \d+: \d+ threads?, 1 child process", done.stdout), done.stdout
        status, report = analyze(out)
    assert status == 1
    first = report["findings"][0]  # type: ignore[index]
    assert first["kind"] == "stack_hang" and first["ranks"] == [3]
    assert "outside any collective" in first["summary"]
    worker = f"in Samples.__getitem__ at scripts/untraced.py:{_line('a read from storage')}"
    assert any(worker in c for c in first["evidence"]["children"]), first


def test_healthy_job_has_no_verdict_and_keeps_running(tmp_path: Path) -> None:
    with start_job(SCRIPT, ["healthy"], flightrec=False, workdir=tmp_path) as job:
        job.wait_for_output(0, "STEP 20", timeout=90)
        out = tmp_path / "snap"
        done = flightrec("attach", *(p.pid for p in job.procs), "--out", out, "--samples", "4")
        assert done.returncode == 0, done.stdout + done.stderr
        steps = len(re.findall(r"STEP \d+", job.logs[0].read_text()))
        deadline = time.monotonic() + 60
        while len(re.findall(r"STEP \d+", job.logs[0].read_text())) <= steps:
            assert time.monotonic() < deadline, "the job stopped after attach"
            time.sleep(0.2)
        status, report = analyze(out)
    assert status == 0 and report["findings"] == [], report


def test_worker_server_ring_gives_the_usual_verdict_with_lines(tmp_path: Path) -> None:
    sockets = {r: {"TORCH_WORKER_SERVER_SOCKET": str(tmp_path / f"r{r}.sock")} for r in range(4)}
    with start_job(
        SCRIPT, ["stall", "--culprit", "2"], flightrec=False, workdir=tmp_path, rank_env=sockets
    ) as job:
        _hung(job, 2)
        out = tmp_path / "snap"
        done = flightrec("attach", *(p.pid for p in job.procs), "--out", out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("torch's ring: ") == 4, done.stdout
        status, report = analyze(out)
    assert status == 1
    first = report["findings"][0]  # type: ignore[index]
    assert first["kind"] == "not_arrived" and first["ranks"] == [2]
    assert first["op"] == "all_reduce" and first["seq"] == 4
    assert (
        f"save_checkpoint at scripts/untraced.py:{_line('a write to a filesystem')}"
        in first["summary"]
    )


def test_gone_and_unreadable_processes_cost_one_line_each(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = flightrec("attach", gone.pid, "--out", tmp_path / "none")
    assert done.returncode == 2
    assert f"pid {gone.pid}: no such process (it has exited)" in done.stderr
    assert "Traceback" not in done.stderr
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("no setpriv, or not root: cannot take the right to ptrace away")
    with start_job(SCRIPT, ["stall"], flightrec=False, workdir=tmp_path) as job:
        _hung(job, 2)
        # Real uid nobody and no CAP_SYS_PTRACE: ptrace and process_vm_readv are refused. On most
        # kernels /proc/PID/environ stays readable (its check uses the effective uid) and the
        # refusal shows per rank; where it does not (some container sandboxes), it shows per pid.
        drop = (setpriv, "--ruid", "65534", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace")
        probe = flightrec("--version", prefix=drop)
        if probe.returncode != 0:
            pytest.skip(f"setpriv cannot drop ptrace here: {probe.stderr.strip()[:200]}")
        # access(2) answers for the real uid: py-spy in a folder only root may enter (CI's
        # private temporary environment) is not found by uid nobody, ptrace or not.
        reach = subprocess.run(
            [*drop, sys.executable, "-c", "import os, sys; sys.exit(not os.access(sys.argv[1], os.X_OK))",
             str(PYSPY)], check=False,
        )  # fmt: skip
        if reach.returncode != 0:
            pytest.skip(f"uid 65534 cannot reach {PYSPY} (a folder only root may enter)")
        pids = [p.pid for p in job.procs]
        done = flightrec("attach", *pids, gone.pid, "--out", tmp_path / "snap", prefix=drop)
        said = done.stdout + done.stderr
        assert done.returncode == 2, said
        memory = [ln for ln in done.stdout.splitlines() if "no permission to read its memory" in ln]
        environ = [ln for ln in done.stderr.splitlines() if "no permission to read /proc/" in ln]
        assert len(memory) + len(environ) == 4, said
        assert all(any(f"pid {p}:" in ln for ln in memory + environ) for p in pids), said
        assert f"pid {gone.pid}: no such process" in done.stderr
        assert "Traceback" not in said
        assert all(running(p) for p in pids)
