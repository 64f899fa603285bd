"""`flightrec attach` without a job: py-spy's output read, stillness measured, snapshots
built through the same code the command uses, and the stack_hang verdict on them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from flightrec.analysis import analyze
from flightrec.analysis.facts.places import BACKWARD, place_of
from flightrec.analysis.loading.loader import Run
from flightrec.analysis.model import FindingKind, FrameInfo, RankDump
from flightrec.attach.processes import RankProcess, descendants, find_ranks, process_table
from flightrec.attach.pyspy import StackReadError, ThreadStack, parse_dump
from flightrec.attach.snapshot import Sample, build_snapshot, stillness
from flightrec.attach.torchring import RingUnavailable, _body, fetch_ring
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import FrameTuple

SITE = "/venv/lib/python3.11/site-packages/torch"
C10D: FrameTuple = (f"{SITE}/distributed/distributed_c10d.py", "all_reduce", 3252)
LOGGER: FrameTuple = (
    f"{SITE}/distributed/c10d_logger.py",
    "_exception_logger.<locals>.wrapper",
    83,
)
TRAIN = "/job/train.py"


def _kill_below(pid: int) -> None:
    """SIGKILL every process below ``pid`` (before ``pid`` itself: its children would move
    to init once it is gone), without pkill, which a minimal root may lack."""
    children, _ = process_table()
    for child in descendants(pid, children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _frames(*frames: tuple[str, str, int]) -> list[FrameInfo]:
    return [FrameInfo(f, n, ln) for f, n, ln in frames]


# -- where a stack stands -----------------------------------------------------------------


def test_a_c10d_call_is_its_collective_and_the_user_line_its_place() -> None:
    place = place_of(_frames(C10D, LOGGER, (TRAIN, "train", 88), (TRAIN, "main", 120)))
    assert place.collective == "all_reduce"
    assert place.location == FrameInfo(TRAIN, "train", 88)


def test_machinery_around_a_call_names_it() -> None:
    fsdp = (f"{SITE}/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather", 200)
    gather = (f"{SITE}/distributed/distributed_c10d.py", "all_gather_into_tensor", 4000)
    assert place_of(_frames(gather, fsdp, (TRAIN, "step", 5))).collective == (
        "all_gather_into_tensor (FSDP)"
    )
    ddp = (f"{SITE}/nn/parallel/distributed.py", "DistributedDataParallel._sync_buffers", 1500)
    assert place_of(_frames(ddp, (TRAIN, "step", 5))).collective == "DDP _sync_buffers"
    stage = (f"{SITE}/distributed/pipelining/schedules.py", "_wait_batch_p2p", 600)
    assert place_of(_frames(stage, (TRAIN, "step", 5))).collective == "pipelining _wait_batch_p2p"


def test_backward_is_where_ddp_reduces_gradients() -> None:
    engine = (f"{SITE}/autograd/graph.py", "_engine_run_backward", 829)
    tensor = (f"{SITE}/_tensor.py", "Tensor.backward", 626)
    place = place_of(_frames(engine, tensor, (TRAIN, "step", 40)))
    assert place.collective == BACKWARD and place.location == FrameInfo(TRAIN, "step", 40)


def test_private_helpers_and_user_code_are_outside() -> None:
    helper = (f"{SITE}/distributed/distributed_c10d.py", "_get_default_group", 1000)
    place = place_of(_frames(helper, (TRAIN, "load", 12)))
    assert place.collective is None and place.location == FrameInfo(TRAIN, "load", 12)
    assert place_of([]).collective is None


# -- py-spy's output and the process' view ---------------------------------------------


def test_pyspy_json_is_read_thread_by_thread() -> None:
    text = json.dumps(
        [
            {
                "pid": 7,
                "thread_id": 140,
                "os_thread_id": 7,
                "thread_name": "MainThread",
                "frames": [
                    {"name": "f", "filename": "/a.py", "line": 3},
                    {"name": "g", "filename": "/a.py", "line": -1},
                    {"name": None, "filename": "/a.py", "line": 9},
                ],
            },
            {"pid": 7, "thread_id": 141, "os_thread_id": 8, "thread_name": "w", "frames": []},
            "junk",
        ]
    )
    main, worker = parse_dump(7, text)
    assert main.is_main and not worker.is_main
    assert main.frames == (("/a.py", "f", 3), ("/a.py", "g", 0))
    with pytest.raises(StackReadError, match="other than JSON"):
        parse_dump(7, "Error: something")


def _thread(frames: Sequence[FrameTuple], tid: int = 7) -> ThreadStack:
    return ThreadStack(7, 1, tid, "MainThread", tuple(frames))


def _sample(ms: int, frames: Sequence[FrameTuple], cpu_ms: int = 0) -> Sample:
    return Sample(ms * 1_000_000, (_thread(frames),), {7: cpu_ms * 1_000_000})


def test_stillness_counts_back_to_the_last_change() -> None:
    a, b = [(TRAIN, "f", 1)], [(TRAIN, "f", 2)]
    samples = [_sample(0, a, 0), _sample(500, b, 10), _sample(1000, b, 15), _sample(1500, b, 40)]
    assert stillness(samples, samples[-1].threads[0]) == (1000, 30)
    moved = [_sample(0, a), _sample(500, b)]
    assert stillness(moved, moved[-1].threads[0]) == (0, 0)


def test_a_rank_is_found_by_its_environment_and_its_children_are_not_ranks(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "run-9"}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])",
        ],
        env={**env, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == b"up"
        time.sleep(0.3)  # its child is started
        found = find_ranks([launcher.pid])
        # Its children named too (a pgrep matches a rank's DataLoader workers): still one rank.
        also = find_ranks([launcher.pid, *found.ranks[0].children])
    finally:
        _kill_below(launcher.pid)
        launcher.kill()
        launcher.wait()
    # The launcher carries RANK too (the variables were set above it): it is the rank, and
    # what runs below it with the same variables is its children.
    (rank,) = found.ranks
    assert (rank.rank, rank.local_rank, rank.world_size, rank.job_id) == (5, 1, 8, "run-9")
    assert len(rank.children) == 2 and not found.problems
    assert [r.pid for r in also.ranks] == [launcher.pid]


def test_an_srun_task_is_a_rank_by_slurm_procid() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "42"}
    task = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**env, "PATH": "/usr/bin:/bin"}
    )
    try:
        time.sleep(0.2)
        (rank,) = find_ranks([task.pid]).ranks
    finally:
        task.kill()
        task.wait()
    assert (rank.pid, rank.rank, rank.local_rank, rank.world_size, rank.job_id) == (
        task.pid, 3, 1, 8, "42",
    )  # fmt: skip


def test_a_pid_that_is_gone_is_one_line() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    found = find_ranks([gone.pid])
    assert found.ranks == []
    assert found.problems == [f"pid {gone.pid}: no such process (it has exited)"]


def test_a_process_without_ranks_below_it_says_so() -> None:
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"
    plain = subprocess.Popen([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(0.5)
        found = find_ranks([plain.pid])
    finally:
        _kill_below(plain.pid)
        plain.kill()
        plain.wait()
    assert not found.ranks
    (line,) = found.problems
    assert line.startswith(f"pid {plain.pid} (")
    assert "no rank process found below it (1 descendant process, none with RANK" in line


def test_worker_server_answers_are_checked(tmp_path: Path) -> None:
    assert _body(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") == b"{}"
    with pytest.raises(RingUnavailable, match="404"):
        _body(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(RingUnavailable, match="cut short"):
        _body(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
    with pytest.raises(RingUnavailable, match="no worker server answers"):
        fetch_ring(str(tmp_path / "none.sock"))


# -- snapshots and the verdict ---------------------------------------------------------------


def _proc(rank: int, world: int = 4) -> RankProcess:
    return RankProcess(
        pid=100 + rank, rank=rank, world_size=world, local_rank=rank, host="node", job_id="j"
    )


def _snapshot(
    rank: int,
    frames: Sequence[FrameTuple],
    *,
    moved: bool = False,
    cpu_ms: int = 0,
    world: int = 4,
    child: Sequence[FrameTuple] = (),
) -> RankDump:
    first = [(TRAIN, "elsewhere", 1)] if moved else frames
    pid = 100 + rank
    samples = [
        Sample(0, (ThreadStack(pid, 1, pid, "MainThread", tuple(first)),), {pid: 0}),
        Sample(
            1_000_000_000,
            (ThreadStack(pid, 1, pid, "MainThread", tuple(frames)),),
            {pid: cpu_ms * 1_000_000},
        ),
    ]
    kids = []
    if child:
        worker = ThreadStack(900 + rank, 2, 900 + rank, "MainThread", tuple(child))
        kids = [[Sample(0, (worker,), {}), Sample(1_000_000_000, (worker,), {})]]
    dump = build_snapshot(_proc(rank, world), samples, kids, None, "test", 0)
    assert dump.header.reason == pb.ATTACHED
    return RankDump(f"<rank {rank}>", dump)


WAIT = [C10D, LOGGER, (TRAIN, "train", 88)]
SLEEP = [(TRAIN, "save_checkpoint", 39), (TRAIN, "train", 82)]


def _verdict(*dumps: RankDump, world: int = 4) -> list:  # type: ignore[type-arg]
    run = Run({d.rank: d for d in dumps}, world, (), ())
    return analyze(run).findings


def test_the_rank_outside_while_the_others_wait_is_named_with_its_line() -> None:
    findings = _verdict(*(_snapshot(r, SLEEP if r == 2 else WAIT) for r in range(4)))
    (f,) = findings
    assert f.kind is FindingKind.STACK_HANG and f.ranks == (2,)
    assert f.op == "all_reduce"
    assert "save_checkpoint at job/train.py:39" in f.summary
    assert "ranks 0-1,3 wait in all_reduce at job/train.py:88" in f.summary


def test_a_busy_rank_outside_is_named_as_running() -> None:
    compute = [(TRAIN, "forward", 20), (TRAIN, "train", 80)]
    (f,) = _verdict(*(_snapshot(r, compute if r == 1 else WAIT, moved=r == 1) for r in range(4)))
    assert f.ranks == (1,) and "running" in f.summary


def test_a_rank_in_another_collective_than_most_is_the_odd_one() -> None:
    bcast = [(C10D[0], "broadcast", 2900), (TRAIN, "train", 91)]
    (f,) = _verdict(*(_snapshot(r, bcast if r == 3 else WAIT) for r in range(4)))
    assert f.ranks == (3,) and "broadcast" in f.summary


def test_every_rank_in_one_collective_cannot_be_told_apart() -> None:
    f, *rest = _verdict(*(_snapshot(r, WAIT, world=8) for r in range(4)), world=8)
    assert f.ranks == () and f.evidence.undecided == "same_collective"  # type: ignore[union-attr]
    assert "ranks 4-7 have no snapshot here" in f.summary
    # The ranks attach did not reach (other nodes) are missing dumps, after it.
    assert {r for g in rest if g.kind is FindingKind.MISSING_DUMP for r in g.ranks} == {4, 5, 6, 7}


def test_an_even_split_and_no_collective_are_undecided() -> None:
    bcast = [(C10D[0], "broadcast", 2900), (TRAIN, "train", 91)]
    (f,) = _verdict(*(_snapshot(r, bcast if r >= 2 else WAIT) for r in range(4)))
    assert f.ranks == () and f.evidence.undecided == "even_split"  # type: ignore[union-attr]
    (g,) = _verdict(*(_snapshot(r, SLEEP) for r in range(4)))
    assert g.ranks == () and g.evidence.undecided == "no_collective"  # type: ignore[union-attr]


def test_a_job_that_moves_or_works_has_no_verdict() -> None:
    assert _verdict(*(_snapshot(r, WAIT, moved=r == 0) for r in range(4))) == []
    # Caught in all_reduce at every sample, but their threads used a CPU: a busy loop.
    assert _verdict(*(_snapshot(r, WAIT, cpu_ms=300) for r in range(4))) == []


def test_a_blamed_rank_s_child_process_is_shown() -> None:
    item = [(TRAIN, "Samples.__getitem__", 56)]
    loader = [(f"{SITE}/utils/data/dataloader.py", "_try_get_data", 1291), (TRAIN, "train", 74)]
    dumps = [
        _snapshot(r, loader if r == 3 else WAIT, child=item if r == 3 else ()) for r in range(4)
    ]
    (f,) = _verdict(*dumps)
    assert f.ranks == (3,)
    assert "rank 3's child pid 903 is in Samples.__getitem__ at job/train.py:56" in f.summary


def test_the_json_report_of_a_stack_hang_follows_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jsonschema
    from flightrec_cli import exiting
    from flightrec_cli.app import app
    from typer.testing import CliRunner

    from flightrec.format.write import write_dump

    for r in range(4):
        d = _snapshot(r, SLEEP if r == 2 else WAIT, world=6)
        write_dump(d.dump.meta, tmp_path, f"rank{r}.frdump")
    monkeypatch.setattr(exiting, "_skip", False)
    result = CliRunner().invoke(app, ["analyze", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["findings"][0]["kind"] == "stack_hang"
    assert report["findings"][0]["evidence"]["without_snapshot"] == [4, 5]
    schema = json.loads((Path(__file__).parents[2] / "docs" / "report-schema.json").read_text())
    errors = list(jsonschema.validators.validator_for(schema)(schema).iter_errors(report))
    assert errors == []


def test_the_job_id_is_read_as_the_recorder_reads_it() -> None:
    from flightrec.attach.processes import job_id_of

    assert job_id_of({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}) == "77"
    assert job_id_of({"FLIGHTREC_JOB_ID": "a", "TORCHELASTIC_RUN_ID": "b"}) == "a"
    assert job_id_of({}) == ""


def test_show_says_how_long_a_thread_stood_still_and_whose_child_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flightrec_cli import exiting
    from flightrec_cli.app import app
    from typer.testing import CliRunner

    from flightrec.format.write import write_dump

    d = _snapshot(3, WAIT, cpu_ms=20, child=[(TRAIN, "Samples.__getitem__", 56)])
    path = write_dump(d.dump.meta, tmp_path, "rank3.frdump")
    monkeypatch.setattr(exiting, "_skip", False)
    result = CliRunner().invoke(app, ["show", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "MainThread (main, still for 1.0 s, 20 ms CPU)" in result.output
    assert "MainThread (child process 903, still for 1.0 s, 0 ms CPU)" in result.output
    assert "ATTACHED #0: test" in result.output


def test_attach_refuses_what_cannot_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flightrec.attach import session
    from flightrec.errors import UsageError

    with pytest.raises(UsageError, match="2 or more"):
        session.attach([1], tmp_path, samples=1)
    monkeypatch.setattr(session, "find_pyspy", lambda: None)
    with pytest.raises(UsageError, match=r"pip install 'torch-flightrec\[attach\]'"):
        session.attach([1], tmp_path)
