"""The recorder in real 4-rank gloo jobs: what it records, and every way a dump is triggered.

Each test starts real processes through ``jobs.start_job`` with FLIGHTREC=1 (the scripts never
import flightrec themselves) and reads the dumps back with ``flightrec.format.read.read_dump``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import ASYNC_OP, COALESCED, IS_P2P, SEND
from flightrec.format.members import members_of
from tests.integration.jobs import child_env, start_job

pytestmark = pytest.mark.integration
WORLD = 4


def ops(dump: pb.Dump) -> list[str]:
    return [dump.strings[i] for i in dump.entries.op]


def group_names(dump: pb.Dump) -> list[str]:
    return [dump.groups[i].name for i in dump.entries.group]


def stack_names(dump: pb.Dump, stack: int) -> list[str]:
    return [dump.strings[dump.frames[i].name] for i in dump.stacks[stack].frames]


def main_thread(dump: pb.Dump) -> pb.ThreadState:
    (main,) = [t for t in dump.threads if t.is_main]
    return main


def collectives_by_group(dump: pb.Dump) -> dict[str, list[tuple[int, str]]]:
    """group name -> [(seq, op)] of its collectives, in seq order."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    e = dump.entries
    for i in range(len(e.record_id)):
        if not e.flags[i] & IS_P2P:
            out[dump.groups[e.group[i]].name].append((e.seq[i], dump.strings[e.op[i]]))
    return {name: sorted(items) for name, items in out.items()}


def test_healthy_job_records_every_kind_of_call(tmp_path: Path) -> None:
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1"}
    with start_job("scenario.py", ["healthy", "--api-dump"], env=env, workdir=tmp_path) as job:
        assert job.wait(90) == [0] * WORLD, job.output()
    dumps = job.dumps()
    assert sorted(dumps) == list(range(WORLD))
    for rank, items in dumps.items():
        # flightrec.dump() from code, then FLIGHTREC_DUMP_ON_EXIT at exit; nothing overwritten.
        assert [d.header.reason for _, d in items] == [pb.API_CALL, pb.PROCESS_EXIT]
        assert [d.header.dump_index for _, d in items] == [0, 1]
        # How the process had ended when each was written: running, then exited (schema 1.7).
        assert [d.header.process_end for _, d in items] == [pb.END_RUNNING, pb.END_EXITED]
        h = items[0][1].header
        assert (h.rank, h.world_size, h.backend, h.local_rank) == (rank, WORLD, "gloo", rank)
        assert h.reason_detail == "end of healthy run" and h.job_id and h.pid
        assert h.buffer_capacity == 2000 and h.stack_depth == 16 and h.source == "flightrec"
        assert h.entries_recorded == len(items[0][1].entries.record_id) == 26

    exit_dumps = {rank: items[-1][1] for rank, items in dumps.items()}
    d0 = exit_dumps[0]
    assert ops(d0)[:8] == ["all_reduce"] * 3 + ["broadcast", "all_reduce", "all_reduce",
                                                  "all_gather_into_tensor", "all_reduce"]  # fmt: skip
    # Every entry finished, with monotonic enqueue/complete times.
    for d in exit_dumps.values():
        e = d.entries
        assert set(e.state) == {pb.COMPLETED}
        assert all(0 < a <= b for a, b in zip(e.enqueue_ns, e.complete_ns, strict=True))

    # Collective sequence numbers agree across the ranks of every group (threads included).
    per_rank = {rank: collectives_by_group(d) for rank, d in exit_dumps.items()}
    for d in exit_dumps.values():
        for g in d.groups:
            members = list(members_of(g))
            views = [per_rank[r][g.name] for r in members]
            assert all(v == views[0] for v in views), g.name
            assert [seq for seq, _ in views[0]] == list(range(1, g.last_seq + 1))

    # Reduce op, root as a global rank, tensor shapes and dtypes.
    e = d0.entries
    bcast = ops(d0).index("broadcast")
    assert e.peer[bcast] == 1
    assert d0.strings[e.reduce_op[4]] == "MAX" and d0.strings[e.reduce_op[0]] == "SUM"
    spec = d0.tensor_specs[e.inputs[0]]
    assert list(spec.dims) == [4] and d0.strings[spec.dtype[0]] == "float32"
    agit = d0.tensor_specs[e.outputs[6]]
    assert list(agit.dims) == [WORLD * 2]
    assert d0.strings[e.device[0]] == "cpu"

    # async_op=True is flagged and completed through the Work.
    assert e.flags[5] & ASYNC_OP and e.state[5] == pb.COMPLETED

    # Subgroups: same name and global ranks on both members; the root is a global rank.
    for rank, d in exit_dumps.items():
        members = [0, 1] if rank < 2 else [2, 3]
        sub = [g for g in d.groups if list(members_of(g)) == members]
        assert len(sub) == 1 and sub[0].last_seq == 2
        # Written as a member grid (schema 1.2), not a list: start, one size, one stride.
        assert not sub[0].ranks and sub[0].HasField("rank_grid")
        grid = sub[0].rank_grid
        assert (grid.start, list(grid.shape), list(grid.stride)) == (members[0], [2], [1])
        idx = list(d.groups).index(sub[0])
        sub_ops = [
            (op, d.entries.peer[i]) for i, op in enumerate(ops(d)) if d.entries.group[i] == idx
        ]
        assert sub_ops == [("all_reduce", -1), ("broadcast", members[0])]
    names = {r: {tuple(members_of(g)): g.name for g in d.groups} for r, d in exit_dumps.items()}
    assert names[0][(0, 1)] == names[1][(0, 1)] and names[2][(2, 3)] == names[3][(2, 3)]

    # P2P: send #k from r to r+1 matches recv #k on r+1 from r, with the same shape.
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for rank, d in exit_dumps.items():
        e = d.entries
        for i in range(len(e.record_id)):
            if e.flags[i] & IS_P2P:
                assert e.seq[i] == 0 and e.p2p_seq[i] >= 1
                if e.flags[i] & SEND:
                    sends[(rank, e.peer[i], e.p2p_seq[i])] = list(d.tensor_specs[e.inputs[i]].dims)
                else:
                    recvs[(e.peer[i], rank, e.p2p_seq[i])] = list(d.tensor_specs[e.outputs[i]].dims)
    assert sends == recvs and len(sends) == 3 * WORLD
    assert {dims[0] for dims in sends.values()} == {5, 6, 7}
    batched = [i for i, f in enumerate(d0.entries.flags) if f & COALESCED]
    assert [ops(d0)[i] for i in batched] == ["isend", "irecv"]

    # Two threads: each thread's entries are on its own group, numbered 1..5.
    threads = [d0.strings[i] for i in d0.entries.thread]
    for name in ("worker-0", "worker-1"):
        rows = [i for i, t in enumerate(threads) if t == name]
        assert len({d0.entries.group[i] for i in rows}) == 1
        assert [d0.entries.seq[i] for i in rows] == [1, 2, 3, 4, 5]

    # Stacks are symbolized at dump time, innermost first, pointing into the script.
    first = stack_names(d0, d0.entries.stack[0])
    assert first[:3] == ["steps", "healthy", "run"]
    frame = d0.frames[d0.stacks[d0.entries.stack[0]].frames[0]]
    assert d0.strings[frame.file].endswith("scenario.py") and frame.line > 0


ENDS_NORMALLY = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(float(sys.argv[1]))  # a rank that reaches the end later than the store's host
dist.destroy_process_group()
print("DONE", flush=True)
"""


@pytest.mark.parametrize(("world", "late_s"), [(1, 0.0), (2, 0.0), (2, 0.5)])
def test_a_job_that_ends_normally_leaves_nothing_in_its_log(
    tmp_path: Path, world: int, late_s: float
) -> None:
    # Rank 0's process hosts the store here (no torchrun agent): destroy_process_group takes
    # it down. Every rank's request thread must be out of its store wait by then, or torch
    # logs a C++ warning with a stack trace into that rank's log ("Connection was likely
    # closed") at a normal exit; so the store's host waits (briefly) until every rank says
    # its thread is out, and a rank that ends half a second later is still in time. The
    # tests quiet torch's C++ log; users do not.
    script = tmp_path / "ends_normally.py"
    script.write_text(ENDS_NORMALLY)
    env = {"TORCH_CPP_LOG_LEVEL": "WARNING"}
    with start_job(script, [str(late_s)], world_size=world, env=env, workdir=tmp_path) as job:
        assert job.wait(60) == [0] * world, job.output()
    out = job.output()
    assert out.count("DONE") == world, out
    for sign in ("recvValueWithTimeout", "likely closed", "terminate called", "Traceback"):
        assert sign not in out, out


ENDS_EARLY = """
import time, torch, torch.distributed as dist
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import default_store
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(2):
    dist.all_reduce(t)
if dist.get_rank() == 1:  # its data ran out: it ends cleanly, the others go on
    dist.destroy_process_group()
    raise SystemExit(0)
time.sleep(2.0)
store = default_store()
key = Keys().left("0")
print("LEFT", bytes(store.get(key)).decode() if store.check([key]) else "-", flush=True)
"""


def test_a_rank_that_ends_cleanly_says_so_through_the_store(tmp_path: Path) -> None:
    script = tmp_path / "ends_early.py"
    script.write_text(ENDS_EARLY)
    with start_job(script, world_size=2, workdir=tmp_path) as job:
        codes = job.wait(60)
    out = job.output()
    assert codes[1] == 0, out
    assert "LEFT 1," in out, out  # rank 0 reads what rank 1 announced


def test_stalled_rank_outside_collectives_is_caught_by_peer_request(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": "2"}
    with start_job("scenario.py", ["stall", "--stall-rank", "2"], env=env, workdir=tmp_path) as job:
        job.wait_for_dumps(1, timeout=60, reason="watchdog_timeout")
        job.wait_for_dumps(1, timeout=10, reason="peer_request")
        deadline = time.monotonic() + 10
        while len({d.header.rank for items in job.dumps().values() for _, d in items}) < WORLD:
            assert time.monotonic() < deadline, job.output()
            time.sleep(0.1)
    dumps = job.dumps()
    assert sorted(dumps) == list(range(WORLD))
    first = {rank: items[0][1] for rank, items in dumps.items()}

    # The stalled rank was in no collective; its dump came from a peer's request and its main
    # thread's stack shows where it is stuck.
    stalled = first[2]
    assert stalled.header.reason == pb.PEER_REQUEST
    assert stalled.header.requested_by in (0, 1, 3)
    main = main_thread(stalled)
    assert stack_names(stalled, main.stack)[0] == "stalled_data_loader"
    # Each frame carries the source line the job ran, read by the rank when it dumped.
    inner = stalled.frames[stalled.stacks[main.stack].frames[0]]
    assert stalled.strings[inner.code] == "time.sleep(0.05)"
    assert not main.holds_recorder
    assert set(stalled.entries.state) == {pb.COMPLETED} and stalled.groups[0].last_seq == 3

    # The waiting ranks: all_reduce seq 4 pending, main thread inside the hook.
    watchdog_ranks = set()
    for rank in (0, 1, 3):
        d = first[rank]
        e = d.entries
        assert ops(d)[-1] == "all_reduce" and e.seq[-1] == 4 and e.state[-1] == pb.ENQUEUED
        assert e.complete_ns[-1] == 0
        assert main_thread(d).holds_recorder
        reasons = {x.header.reason for _, x in dumps[rank]}
        if pb.WATCHDOG_TIMEOUT in reasons:
            watchdog_ranks.add(rank)
    assert watchdog_ranks
    # Every rank dumped within a few seconds of the first hang dump.
    walls = [d.header.wall_time_ns for d in first.values()]
    assert (max(walls) - min(walls)) / 1e9 < 3.0


def test_collective_error_dumps_then_raises_unchanged(tmp_path: Path) -> None:
    with start_job("scenario.py", ["crash", "--crash-rank", "3"], workdir=tmp_path) as job:
        codes = job.wait(90)
    assert codes[3] == 3 and all(c != 0 for c in codes[:3]), job.output()
    dumps = job.dumps()
    assert sorted(dumps) == [0, 1, 2]
    for rank in (0, 1, 2):
        assert "RAISED" in job.logs[rank].read_text()
        # The first peer to die of it asks the others to dump (the verdict in the log): that
        # request may reach a rank before its own error does. The error dump is there.
        errors = [d for _, d in dumps[rank] if d.header.reason == pb.COLLECTIVE_ERROR]
        assert len(errors) == 1, [d.header.reason for _, d in dumps[rank]]
        d = errors[0]
        assert "all_reduce" in d.header.reason_detail and "raised" in d.header.reason_detail
        assert ops(d)[-1] == "all_reduce" and d.entries.state[-1] == pb.FAILED
        assert d.entries.seq[-1] == 5  # 3 steps, the barrier, then the failing all_reduce
        # The original exception reached the script: torch's own traceback is in the output.
        log = job.logs[rank].read_text()
        assert "Traceback" in log and "flightrec" not in log.split("RAISED")[1].split("\n")[0]


def _trigger(port: int) -> subprocess.CompletedProcess[str]:
    code = "from flightrec_cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "trigger", "--host", "127.0.0.1", "--port", str(port)],
        env=child_env(flightrec=False), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cli_trigger_sigusr1_and_sigterm(tmp_path: Path) -> None:
    env = {"FLIGHTREC_TIMEOUT": "600"}
    with start_job("scenario.py", ["stall", "--stall-rank", "2"], env=env, workdir=tmp_path) as job:
        for rank in range(WORLD):
            job.wait_for_output(rank, "STALLING" if rank == 2 else "WAITING", timeout=60)
        time.sleep(0.3)  # the waiting ranks enter all_reduce

        result = _trigger(job.port)
        assert result.returncode == 0, result.stderr
        assert "request 1" in result.stdout
        job.wait_for_dumps(WORLD, timeout=10, reason="cli_trigger")

        # SIGUSR1 while rank 1 is blocked inside a gloo collective: dumps, keeps running.
        job.signal(1, signal.SIGUSR1)
        job.wait_for_dumps(1, timeout=10, reason="signal_usr1")
        assert job.procs[1].poll() is None

        # SIGTERM to a rank blocked in a collective and to the stalled one: dump, then die
        # by SIGTERM as they would without flightrec.
        job.signal(0, signal.SIGTERM)
        job.signal(2, signal.SIGTERM)
        job.wait_for_dumps(2, timeout=10, reason="signal_term")
        assert job.procs[0].wait(15) == -signal.SIGTERM
        assert job.procs[2].wait(15) == -signal.SIGTERM

    dumps = job.dumps()
    cli = {
        r: d for r, items in dumps.items() for _, d in items if d.header.reason == pb.CLI_TRIGGER
    }
    assert sorted(cli) == list(range(WORLD))
    assert all(d.header.requested_by == -1 for d in cli.values())
    assert stack_names(cli[2], main_thread(cli[2]).stack)[0] == "stalled_data_loader"
    usr1 = [d for _, d in dumps[1] if d.header.reason == pb.SIGNAL_USR1]
    assert len(usr1) == 1 and main_thread(usr1[0]).holds_recorder
    term = {r for r, items in dumps.items() for _, d in items if d.header.reason == pb.SIGNAL_TERM}
    assert term == {0, 2}


@pytest.mark.parametrize("launch", ["spawn", "torchrun"])
def test_env_activation_in_spawn_children_and_torchrun_workers(tmp_path: Path, launch: str) -> None:
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1"}
    with start_job("scenario.py", ["healthy"], env=env, launch=launch, workdir=tmp_path) as job:
        assert job.wait(120) == [0], job.output()
    dumps = job.dumps()
    # One exit dump per worker, none from the launcher process (it never used a process group).
    assert sorted(dumps) == list(range(WORLD))
    for rank, items in dumps.items():
        assert [d.header.reason for _, d in items] == [pb.PROCESS_EXIT]
        d = items[0][1]
        assert len(d.entries.record_id) == 26 and d.header.local_rank == rank
        assert ops(d)[0] == "all_reduce" and d.groups[0].last_seq == 8
    assert len({d.header.pid for items in dumps.values() for _, d in items}) == WORLD


UNTOUCHED = """
import sys
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
fns = [getattr(c10d, n) for n in ("all_reduce", "broadcast", "send", "isend", "batch_isend_irecv")]
wrapped = [hasattr(f, "__flightrec_original__") for f in fns]
same = all(getattr(dist, f.__name__) is f for f in fns)
files = [getattr(getattr(f, "__code__", None), "co_filename", "?") for f in fns]
torch_code = all(name.startswith(dist.__path__[0]) for name in files)
loaded = any(m == "flightrec" or m.startswith("flightrec.") for m in sys.modules)
print(f"wrapped={any(wrapped)} same={same} torch_code={torch_code} flightrec_loaded={loaded}")
"""


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_disabled_mode_leaves_torch_distributed_untouched(value: str | None) -> None:
    env = child_env(flightrec=False)
    if value is not None:
        env["FLIGHTREC"] = value
    out = subprocess.run(
        [sys.executable, "-c", UNTOUCHED], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    if value == "1":  # the control: the same check sees the wrappers when tracing is on
        assert "wrapped=True same=True torch_code=False flightrec_loaded=True" in out.stdout
    else:
        assert "wrapped=False same=True torch_code=True flightrec_loaded=False" in out.stdout


API = """
import flightrec
import torch.distributed as dist
before = hasattr(dist.all_reduce, "__flightrec_original__")
flightrec.enable()
during = hasattr(dist.all_reduce, "__flightrec_original__")
flightrec.disable()
after = hasattr(dist.all_reduce, "__flightrec_original__")
print(f"before={before} during={during} after={after}")
"""


def test_enable_and_disable_from_code() -> None:
    out = subprocess.run(
        [sys.executable, "-c", API], env=child_env(flightrec=False), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "before=False during=True after=False" in out.stdout


NEVER_JOINS = """
import os, signal, sys, time
import torch.distributed as dist
assert hasattr(dist.all_reduce, "__flightrec_original__")  # traced, as a torchrun agent is
print(sorted(os.listdir(sys.argv[1])), flush=True)  # while it runs
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_a_process_that_never_joins_a_group_leaves_no_files(tmp_path: Path, end: str) -> None:
    """torchrun's agent inherits FLIGHTREC=1 and never joins a process group: no black box, no
    dump and no warning, while it runs or after it exits or is killed."""
    dump_dir = tmp_path / "dumps"
    dump_dir.mkdir()
    env = child_env({"FLIGHTREC_DIR": str(dump_dir), "FLIGHTREC_DUMP_ON_EXIT": "1"})
    out = subprocess.run(
        [sys.executable, "-c", NEVER_JOINS, str(dump_dir), end],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == (0 if end == "exit" else -signal.SIGKILL), out.stderr
    assert out.stdout.strip() == "[]"
    assert "flightrec" not in out.stderr
    assert list(dump_dir.iterdir()) == []
