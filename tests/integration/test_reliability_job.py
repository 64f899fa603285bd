"""Promise 1: the job keeps running, with identical results, whatever goes wrong in flightrec.

Each test runs ``scripts/reliability_job.py`` (2 gloo ranks, a few seconds) traced while one
fault is acted out, then asserts that every rank exited 0 and printed the same checksum of its
final tensors as an untraced run of the same workload, and that the fault cost at most one
``flightrec:`` warning per process and never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.read import read_dump
from tests.integration.jobs import Job, child_env, free_port, start_job

pytestmark = pytest.mark.integration
SCRIPT = "reliability_job.py"
WORLD = 2


@dataclass(frozen=True)
class Outcome:
    """What a finished run left: exit codes, checksums and logs per rank."""

    codes: list[int]
    results: list[str]
    logs: list[str]
    job: Job

    def warnings(self, rank: int) -> list[str]:
        """The ``flightrec:`` warnings rank ``rank`` logged (INFO lines are not printed)."""
        return [line for line in self.logs[rank].splitlines() if line.startswith("flightrec:")]


def finish(job: Job, timeout: float = 60.0) -> Outcome:
    codes = job.wait(timeout)
    logs = [log.read_text(errors="replace") for log in job.logs]
    results = []
    for text in logs:
        found = re.findall(r"^RESULT ([0-9a-f]{64})$", text, re.MULTILINE)
        results.append(found[-1] if found else "")
    return Outcome(codes, results, logs, job)


def run(
    args: Sequence[str],
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    traced: bool = True,
    world: int = WORLD,
) -> Outcome:
    with start_job(
        SCRIPT, args, world_size=world, env=env, flightrec=traced, workdir=workdir
    ) as job:
        return finish(job)


_REFERENCE: dict[str, list[str]] = {}


def reference(workload: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Per rank, the checksum an untraced run of ``workload`` ends with.

    One untraced 2-rank run computes every workload (``--workload reference``), once per
    test session.
    """
    if not _REFERENCE:
        out = run(["--workload", "reference"], tmp_path_factory.mktemp("ref"), traced=False)
        assert out.codes == [0] * WORLD, "\n".join(out.logs)
        for rank_log in out.logs:
            for name, digest in re.findall(r"^REFERENCE (\w+) ([0-9a-f]{64})$", rank_log, re.M):
                _REFERENCE.setdefault(name, []).append(digest)
        assert {len(v) for v in _REFERENCE.values()} == {WORLD}, _REFERENCE
    # nodist runs as a single process: any rank's value (they are all the same) is rank 0's.
    return _REFERENCE[workload][:1] if workload == "nodist" else _REFERENCE[workload]


def assert_unharmed(out: Outcome, expected: list[str], max_warnings: int = 1) -> None:
    """Every rank finished, with the untraced run's tensors, and the fault stayed quiet."""
    text = "\n".join(out.logs)
    assert out.codes == [0] * len(expected), text
    assert out.results == expected, text
    assert "Traceback" not in text, text
    for rank in range(len(expected)):
        assert len(out.warnings(rank)) <= max_warnings, out.warnings(rank)


def dump_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.frdump")) if folder.is_dir() else []


@pytest.mark.parametrize("how", ["under-a-file", "read-only"])
def test_unwritable_dump_folder(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, how: str
) -> None:
    if how == "under-a-file":
        (tmp_path / "file").write_text("not a folder")
        folder = tmp_path / "file" / "dumps"  # mkdir fails with ENOTDIR, even for root
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder anyway; under-a-file covers it")
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    # Every trigger fires: the watchdog (rank 1 is late once), the peer request it posts,
    # and the exit dump; none can be written.
    env = {"FLIGHTREC_DIR": str(folder), "FLIGHTREC_TIMEOUT": "0.3", "FLIGHTREC_DUMP_ON_EXIT": "1"}
    try:
        out = run(["--straggle", "1.0"], tmp_path / "job", env=env)
    finally:
        if how == "read-only":
            folder.chmod(0o700)
    assert_unharmed(out, reference("serial", tmp_path_factory))
    assert dump_files(folder) == []
    for rank in range(WORLD):
        (warning,) = out.warnings(rank)
        assert "cannot write to FLIGHTREC_DIR" in warning


def test_full_disk(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Simulated with RLIMIT_FSIZE in the job (SIGXFSZ ignored): every write that would grow a
    # file past 1,200 bytes fails with EFBIG, as writes on a full disk fail with ENOSPC. The
    # black box (hundreds of KB) cannot be created and no dump (1.5 KB and up) fits, while the
    # job's own small log still does. The limit caps that log too, so the verdict the straggle
    # prints into it (a few KB) would leave no room for the job's own last lines: it is off here
    # (a failed write of the verdict is swallowed: it goes to fd 2 unbuffered, never left
    # pending in sys.stderr for the job's own next write to trip over).
    env = {"FLIGHTREC_TIMEOUT": "0.3", "FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_VERDICT": "0"}
    out = run(["--straggle", "1.0", "--fsize", "1200"], tmp_path, env=env)
    assert_unharmed(out, reference("serial", tmp_path_factory))
    folder = out.job.dump_dir
    assert dump_files(folder) == [] and list(folder.glob(".tmp-*")) == []
    for rank in range(WORLD):
        (warning,) = out.warnings(rank)
        assert "File too large" in warning


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A real filesystem of ``size`` (tmpfs) at ``path``; skips where mounting is not allowed."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(folder: Path) -> None:
    """Write zeros into ``folder`` until its filesystem is full."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.parametrize("when", ["before-start", "during-the-run"])
def test_real_full_disk(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, when: str
) -> None:
    # A 4 MB tmpfs as FLIGHTREC_DIR (needs root: skipped elsewhere, where test_full_disk's
    # RLIMIT_FSIZE stands in). Full before the job starts, or filled by the test once the
    # black boxes exist, after which 4,000 more calls wrap every ring page and the exit dumps
    # fail. The black box is a memory-mapped file: a page the disk has no room for is a
    # SIGBUS in the training process unless its blocks were reserved up front.
    with tiny_filesystem(tmp_path / "tiny", "4m") as folder:
        if when == "before-start":
            fill(folder)
        go = tmp_path / "go"
        env = {
            "FLIGHTREC_DIR": str(folder),
            "FLIGHTREC_BUFFER": "3000",
            "FLIGHTREC_DUMP_ON_EXIT": "1",
        }
        args = ["--go-file", str(go), "--extra-calls", "4000"]
        with start_job(SCRIPT, args, world_size=WORLD, env=env, workdir=tmp_path / "job") as job:
            for rank in range(WORLD):
                job.wait_for_output(rank, "READY")
            if when == "during-the-run":
                assert len(list(folder.glob("*.ring"))) == WORLD
                fill(folder)
            go.touch()
            out = finish(job)
        # One warning for the full disk (the black box's tables journal may add its own).
        assert_unharmed(out, reference("serial", tmp_path_factory), max_warnings=2)
        assert out.job.dump_files() == []


def test_store_unreachable_for_the_dump_request(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The job's store runs in its own process, which is killed once the process groups
    # exist. Then rank 1 is late: rank 0's watchdog dumps and asks the dead store for help.
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom datetime import timedelta\nfrom torch.distributed import TCPStore\n"
         f"s = TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False,"
         " timeout=timedelta(seconds=30))\nprint('UP', flush=True)\ntime.sleep(120)\n"],
        env=child_env(flightrec=False), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        for line in server.stdout:  # torch may warn first
            if line.strip() == b"UP":
                break
        go = tmp_path / "go"
        args = ["--store", f"127.0.0.1:{port}", "--go-file", str(go), "--straggle", "1.5"]
        with start_job(
            SCRIPT, args, world_size=WORLD, env={"FLIGHTREC_TIMEOUT": "0.5"}, workdir=tmp_path
        ) as job:
            for rank in range(WORLD):
                job.wait_for_output(rank, "READY")
            server.kill()
            server.wait(10)
            go.touch()
            out = finish(job)
    finally:
        server.kill()
        server.wait(10)
    assert_unharmed(out, reference("serial", tmp_path_factory))
    # The dump itself never needed the store; the request could not reach rank 1.
    reasons = {
        (d.header.rank, d.header.reason) for d in map(read_dump, dump_files(out.job.dump_dir))
    }
    assert reasons == {(0, pb.WATCHDOG_TIMEOUT)}, out.logs


@pytest.mark.parametrize("where", ["start", "pre", "post"])
def test_internal_error_in_the_recorder(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, where: str
) -> None:
    # start: starting the background machinery raises inside init_process_group's wrapper;
    # pre: the group lookup raises before each collective runs (the call goes unrecorded);
    # post: tracking an async Work raises after the collective returned (the Work must still
    # reach the caller).
    # A short timeout and a pause at the end: calls it lost track of must not look hung.
    env = {"FLIGHTREC_TIMEOUT": "0.3"}
    out = run(["--fault", f"internal-{where}", "--linger", "1.0"], tmp_path, env=env)
    assert_unharmed(out, reference("serial", tmp_path_factory))
    for rank in range(WORLD):
        (warning,) = out.warnings(rank)
        assert "injected recorder fault" in warning
    # No false evidence either: no hang reported for the calls it lost track of, and the
    # healthy exit removed the black box.
    assert out.job.dump_files() == []
    assert not out.job.dump_dir.exists() or list(out.job.dump_dir.glob("*.ring")) == []


def run_unharmed(workload: str, tmp_path: Path, factory: pytest.TempPathFactory) -> Outcome:
    """A traced run of ``workload`` (dumping at exit) that must end as the untraced one did."""
    out = run(["--workload", workload], tmp_path, env={"FLIGHTREC_DUMP_ON_EXIT": "1"})
    assert_unharmed(out, reference(workload, factory), max_warnings=0)
    return out


def test_eight_threads_issuing_collectives_at_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = run_unharmed("threads", tmp_path, tmp_path_factory)
    # And the record is right: per thread, its own group numbered 1..n on both ranks.
    per_rank = []
    for path in dump_files(out.job.dump_dir):
        d = read_dump(path)
        e = d.entries
        threads: dict[str, list[tuple[str, int]]] = {}
        for i in range(len(e.record_id)):
            name = d.strings[e.thread[i]]
            if name.startswith("trainer-"):
                threads.setdefault(name, []).append((d.groups[e.group[i]].name, e.seq[i]))
        assert len(threads) == 8
        for rows in threads.values():
            assert len({g for g, _ in rows}) == 1
            assert [s for _, s in rows] == list(range(1, len(rows) + 1))
        assert set(e.state) == {pb.COMPLETED}
        per_rank.append({n: [s for _, s in rows] for n, rows in threads.items()})
    assert len(per_rank) == WORLD and per_rank[0] == per_rank[1]


def test_ddp_through_the_recording_hook_trains_the_same_weights(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # flightrec replaces DDP's built-in all-reduce with its own hook: the mean over two ranks
    # of several buckets per step must give bit-identical weights, and every bucket is recorded.
    out = run_unharmed("ddp", tmp_path, tmp_path_factory)
    for path in dump_files(out.job.dump_dir):
        d = read_dump(path)
        reduces = [i for i, op in enumerate(d.entries.op) if d.strings[op] == "all_reduce"]
        assert len(reduces) > 12, "several gradient buckets per step, each one entry"


def test_fork_after_tracing_started(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Each rank forks twice while another thread is dumping in a loop (holding the dumper's
    # lock): the first child exits through sys.exit (atexit handlers run), the second sends
    # itself SIGTERM. Neither may hang, write a dump, or touch the parent.
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1"}
    out = run(["--fault", "fork"], tmp_path, env=env)
    assert_unharmed(out, reference("serial", tmp_path_factory), max_warnings=0)
    for rank in range(WORLD):
        children = re.findall(r"^CHILD_EXIT .*$", out.logs[rank], re.MULTILINE)
        # What an untraced child does: exit 0, and die of its own SIGTERM at once.
        assert children == ["CHILD_EXIT exit 0", "CHILD_EXIT sigterm -15"], out.logs[rank]
    parents = {p.pid for p in out.job.procs}
    dumps = [read_dump(p) for p in dump_files(out.job.dump_dir)]
    assert {d.header.pid for d in dumps} == parents
    # The parents' dumps are intact: the children wrote nothing into them (no SIGNAL dumps
    # from a child's SIGTERM reaching the parent's pipe either).
    reasons = {d.header.reason for d in dumps}
    assert reasons == {pb.API_CALL, pb.PROCESS_EXIT}
    assert all(d.header.reason_detail in ("loop", "process exit") for d in dumps)
    # Healthy parents removed their black boxes at exit; the children did not do it for them.
    assert list(out.job.dump_dir.glob("*.ring")) == []


def test_signals_arriving_during_dumps(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A thread sends SIGUSR1 in bursts of three every 20 ms while the main thread calls
    # flightrec.dump() before every step: signals land in the middle of dumps, and dumps of
    # the signal watcher overlap the API's.
    out = run(["--fault", "dump-storm"], tmp_path)
    assert_unharmed(out, reference("serial", tmp_path_factory), max_warnings=0)
    files = dump_files(out.job.dump_dir)
    dumps = [read_dump(p) for p in files]  # every file complete and valid
    for rank in range(WORLD):
        mine = [d for d in dumps if d.header.rank == rank]
        reasons = [d.header.reason for d in mine]
        assert reasons.count(pb.API_CALL) == 12 and reasons.count(pb.SIGNAL_USR1) >= 1
        indices = sorted(d.header.dump_index for d in mine)
        assert indices == list(range(len(mine)))  # none lost, none overwritten
    assert list(out.job.dump_dir.glob(".tmp-*")) == []
    # A healthy exit takes its black box and its (unused) raw-stacks file with it.
    assert [p.name for p in out.job.dump_dir.glob("*.ring*")] == []
    assert [p.name for p in out.job.dump_dir.glob(".*.stacks")] == []


def test_tracing_on_without_torch_distributed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_TIMEOUT": "0.2"}
    start = time.monotonic()
    out = run(["--workload", "nodist"], tmp_path, env=env, world=1)
    elapsed = time.monotonic() - start
    assert_unharmed(out, reference("nodist", tmp_path_factory), max_warnings=0)
    assert "TRACED True" in out.logs[0], out.logs[0]  # tracing was on, not silently off
    assert elapsed < 30, elapsed  # nothing blocked at exit
    # Nothing to report and nothing left behind: no dump, no black box.
    assert dump_files(out.job.dump_dir) == [] and list(out.job.dump_dir.glob("*.ring")) == []


def test_process_groups_are_released_when_destroyed(tmp_path: Path) -> None:
    # In-process: a traced job's groups must die at destroy_process_group as untraced ones
    # do. Kept alive by the recorder, they were torn down at interpreter exit instead, where
    # gloo sometimes aborted the process ("terminate called without an active exception").
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    from tests.integration.gloo import one_rank_gloo, traced_runtime

    with traced_runtime(tmp_path, buffer=16):
        with one_rank_gloo():
            sub = dist.new_group([0])
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(2), group=sub)
            refs = [weakref.ref(dist.group.WORLD), weakref.ref(sub)]
            del sub
        gc.collect()
        assert [r() for r in refs] == [None, None]
