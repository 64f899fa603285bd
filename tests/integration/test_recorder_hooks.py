"""The recorder in-process on a 1-rank gloo group: wrapping, recording, failing, dumping."""

from __future__ import annotations

import inspect
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flightrec.format import flightrec_pb2 as pb  # noqa: E402
from flightrec.format.read import read_dump  # noqa: E402
from flightrec.format.slot import COMPLETED, ENQUEUED, FAILED, decode  # noqa: E402
from flightrec.recorder.config import Config  # noqa: E402
from flightrec.recorder.hooks.specs import TRACED  # noqa: E402
from flightrec.recorder.hotpath.groups import GroupInfo  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from flightrec.recorder.watchdog import Watchdog  # noqa: E402
from tests.integration.gloo import traced_runtime  # noqa: E402
from tests.integration.jobs import free_port  # noqa: E402

c10d = dist.distributed_c10d


@pytest.fixture(params=["c", "python"])
def rt(
    request: pytest.FixtureRequest, pg: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Runtime]:
    """A traced runtime whose wrappers take the C hot path, or only the Python one."""
    from flightrec.recorder.hooks import codegen

    if request.param == "c" and codegen._fast is None:
        pytest.skip("C hot path not built (python setup.py build_ext --inplace)")
    monkeypatch.setattr(codegen, "USE_FAST", request.param == "c")
    early = types.ModuleType("early_importer")
    early.all_reduce = dist.all_reduce  # type: ignore[attr-defined]  # taken before tracing
    sys.modules["early_importer"] = early
    with traced_runtime(tmp_path, buffer=8) as runtime:
        yield runtime
    del sys.modules["early_importer"]


@pytest.fixture
def own_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups keep flightrec's own numbers: the module's gloo group carries earlier tests'
    collectives, which torch numbered (how a group follows torch's numbers is
    test_recorder_fast's and test_stacks_live's)."""
    monkeypatch.setattr(GroupInfo, "follow_native", lambda self: None)


def entries(rt: Runtime) -> list:  # type: ignore[type-arg]
    return decode(rt.recorder.ring.snapshot())


def test_wrappers_keep_signatures_and_reach_early_imports(rt: Runtime) -> None:
    for name, wrapper in rt.hooks.wrappers.items():
        orig = rt.hooks.originals[name]
        assert inspect.signature(wrapper) == inspect.signature(orig), name
        assert getattr(dist, name, wrapper) is wrapper and getattr(c10d, name) is wrapper
    # Every traced function this torch has (gather_single and gather_into_tensor: 2.15 on).
    assert {n for n in TRACED if callable(getattr(c10d, n, None))} <= set(rt.hooks.wrappers)
    assert {"all_reduce", "broadcast", "all_gather_object", "send"} <= set(rt.hooks.wrappers)
    assert sys.modules["early_importer"].all_reduce is rt.hooks.wrappers["all_reduce"]
    original = rt.hooks.originals["all_reduce"]
    rt.disable()
    assert dist.all_reduce is original and c10d.all_reduce is original
    assert sys.modules["early_importer"].all_reduce is original


def test_records_sync_async_and_reduce_op(rt: Runtime, own_numbers: None) -> None:
    t = torch.ones(3, dtype=torch.float64)
    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    sys.modules["early_importer"].all_reduce(t)
    rt.dumper.dump(pb.API_CALL)  # polls async completions first
    rows = entries(rt)
    assert [r.seq for r in rows] == [1, 2, 3]
    assert all(r.state == COMPLETED and r.complete_ns >= r.enqueue_ns for r in rows)
    strings = rt.recorder.strings.values
    assert [strings[r.reduce_op] for r in rows] == ["SUM", "MAX", "SUM"]
    assert [r.flags & 1 for r in rows] == [0, 1, 0]
    assert rt.recorder.tensors.values[rows[0].inputs] == (((3,), "float64"),)


def test_ring_overwrites_and_dump_reports_dropped(
    rt: Runtime, tmp_path: Path, own_numbers: None
) -> None:
    t = torch.ones(1)
    for _ in range(11):
        dist.all_reduce(t)
    path = rt.dump(pb.API_CALL, "test")
    assert path is not None
    d = read_dump(path)
    assert list(d.entries.seq) == list(range(4, 12))
    assert d.groups[0].last_seq == 11 and d.groups[0].dropped == 3
    assert d.header.entries_recorded == 11 and d.header.buffer_capacity == 8


def test_p2pop_built_from_the_original_isend_still_passes_torchs_check(rt: Runtime) -> None:
    original = rt.hooks.originals["isend"]
    dist.P2POp(original, torch.ones(1), 0)
    dist.P2POp(dist.isend, torch.ones(1), 0)


def test_bad_arguments_raise_torchs_own_error(rt: Runtime) -> None:
    with pytest.raises(Exception) as ours:
        dist.all_reduce("not a tensor")
    with pytest.raises(Exception) as theirs:
        rt.hooks.originals["all_reduce"]("not a tensor")
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_raising_call_is_failed_dumped_and_reraised_unchanged(rt: Runtime, tmp_path: Path) -> None:
    with pytest.raises(Exception) as theirs:
        rt.hooks.originals["broadcast"](torch.ones(1), src=5)
    with pytest.raises(type(theirs.value)) as ours:
        dist.broadcast(torch.ones(1), src=5)
    assert str(ours.value) == str(theirs.value)
    assert entries(rt)[-1].state == FAILED and entries(rt)[-1].peer == 5
    (path,) = tmp_path.glob("*collective_error*")
    d = read_dump(path)
    assert d.header.reason == pb.COLLECTIVE_ERROR and "broadcast" in d.header.reason_detail


def test_unwritable_directory_costs_one_warning(
    rt: Runtime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rt.recorder.config = Config(enabled=True, directory=str(blocker / "dumps"))
    with caplog.at_level(logging.WARNING, logger="flightrec"):
        assert rt.dump(pb.API_CALL) is None
        assert rt.dump(pb.API_CALL) is None
    assert len([r for r in caplog.records if r.name == "flightrec"]) == 1


def test_watchdog_fires_once_per_overdue_entry(rt: Runtime) -> None:
    hung: list[int] = []
    dog = Watchdog(rt.recorder, lambda slot: hung.append(slot.record_id), period_s=3600)
    try:
        rid = rt.recorder.ring.append(1_000, ENQUEUED, 1, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0)
        timeout = int(3600 * 1e9)
        dog.check(1_000 + timeout // 2)
        assert hung == []
        dog.check(1_000 + timeout + 1)
        dog.check(1_000 + 3 * timeout)
        assert hung == [rid]
    finally:
        dog.stop()


def test_only_the_outermost_call_is_recorded(rt: Runtime, own_numbers: None) -> None:
    # all_gather_object runs two all_gathers inside; with numpy missing here it cannot run
    # for real, so a stand-in with its signature calls the traced all_reduce twice.
    from flightrec.recorder.hooks.codegen import generate
    from flightrec.recorder.hooks.specs import spec_for

    def inner(object_list, obj, group=None):  # type: ignore[no-untyped-def]
        dist.all_reduce(torch.ones(1), group=group)
        dist.all_reduce(torch.ones(1), group=group)

    spec = spec_for("all_gather_object", rt.hooks.originals["all_gather_object"])
    wrapper = generate(spec, inner, rt.recorder)
    wrapper([None], {"x": 1})
    dist.all_reduce(torch.ones(1))
    rows = entries(rt)
    strings = rt.recorder.strings.values
    assert [(strings[r.op], r.seq) for r in rows] == [("all_gather_object", 1), ("all_reduce", 2)]
    assert rows[0].flags & 2  # OBJECT_API


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_completion_is_tracked_without_blocking(tmp_path: Path) -> None:
    # A separate process: this module's process already holds a gloo default group.
    import subprocess

    from tests.integration.jobs import child_env

    code = (
        "import torch, torch.distributed as dist, flightrec, time\n"
        "from flightrec.format.read import read_dump\n"
        "dist.init_process_group('nccl', rank=0, world_size=1)\n"
        "t = torch.ones(1 << 20, device='cuda')\n"
        "for _ in range(3): dist.all_reduce(t)\n"
        "dist.all_reduce(t, async_op=True).wait()\n"
        "torch.cuda.synchronize(); time.sleep(0.5)\n"
        "d = read_dump(flightrec.dump('nccl'))\n"
        "print('STATES', list(d.entries.state), d.header.device, d.header.device_uuid[:4])\n"
        # Queue about a second of GPU work before a synchronous all_reduce: it returns at once,
        # and a dump taken then sees it pending (the recorder never synchronizes the GPU).
        # Calls just before the kernel complete on their own: only the one behind it waits.
        "for _ in range(3): dist.all_reduce(t)\n"
        "torch.cuda._sleep(2_000_000_000)\n"
        "t0 = time.monotonic(); dist.all_reduce(t); returned = time.monotonic() - t0\n"
        "time.sleep(0.3)\n"
        "p = read_dump(flightrec.dump('pending'))\n"
        "print('PENDING', p.entries.state[-1], returned < 0.5)\n"
        "print('BEFORE', list(p.entries.state[-4:-1]))\n"
        "torch.cuda.synchronize(); time.sleep(0.5)\n"
        "d = read_dump(flightrec.dump('done'))\n"
        "print('SETTLED', d.entries.state[-1])\n"
        "dist.destroy_process_group()\n"
    )
    env = child_env(
        {
            "FLIGHTREC_DIR": str(tmp_path),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "STATES [3, 3, 3, 3] cuda:0 GPU-" in out.stdout
    assert "PENDING 1 True" in out.stdout or "PENDING 2 True" in out.stdout, out.stdout
    assert "BEFORE [3, 3, 3]" in out.stdout, out.stdout
    assert "SETTLED 3" in out.stdout, out.stdout


def test_a_gpu_call_whose_completion_cannot_be_followed_is_not_left_pending() -> None:
    # The CUDA event of a synchronous NCCL call cannot be made (here: no CUDA at all): the
    # tracker says so, and the recorder marks the entry unknown rather than leaving it
    # ENQUEUED for the watchdog to report as a hang.
    if torch.cuda.is_available():
        pytest.skip("CUDA events work here")
    from flightrec.recorder.recording.completion import Tracker

    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises without CUDA
        Tracker(lambda *a: None, lambda rid, exc: None, lambda where, exc: None).track_stream(1)


def test_reduce_op_names_stay_bounded(rt: Runtime) -> None:
    from flightrec.recorder.recording.recorder import _reduce_name

    assert _reduce_name(dist.ReduceOp.SUM) == "SUM"
    assert _reduce_name(dist.ReduceOp(dist.ReduceOp.MAX)) == "MAX"
    assert _reduce_name(dist._make_nccl_premul_sum(2.0)) == "PREMUL_SUM(2)"
    assert _reduce_name(dist._make_nccl_premul_sum(torch.tensor(3.0))) == "PREMUL_SUM"
    before = len(rt.recorder.strings.values)
    for _ in range(5):  # a new ReduceOp object per call, as FSDP builds them
        rt.recorder.red_slow(dist._make_nccl_premul_sum(2.0))
    assert len(rt.recorder.strings.values) == before + 1


def test_unrecorded_calls_run_torch_exactly_once(rt: Runtime) -> None:
    from flightrec.recorder.hooks.codegen import generate
    from flightrec.recorder.hooks.specs import spec_for

    calls: list[object] = []

    def fake(tensor, op=None, group=None, async_op=False):  # type: ignore[no-untyped-def]
        calls.append(tensor)
        raise ValueError("torch says no")

    wrapper = generate(spec_for("all_reduce", rt.hooks.originals["all_reduce"]), fake, rt.recorder)
    before = len(entries(rt))
    with pytest.raises(ValueError, match="torch says no"):  # a rank outside the group
        wrapper(torch.ones(1), group=dist.GroupMember.NON_GROUP_MEMBER)
    with pytest.raises(ValueError, match="torch says no"):  # recording cannot read the tensor
        wrapper("not a tensor")
    assert len(calls) == 2 and len(entries(rt)) == before


def _shapes(rt: Runtime, index: int) -> set[tuple[int, ...]]:
    return {shape for shape, _ in rt.recorder.tensors.values[index]}


# Functions no multi-rank test calls, each with arguments whose shapes say which parameter the
# recorder read: (call, input shapes, output shapes, root). gloo does not implement some of
# them; the call then raises, and the entry must still be there, FAILED, with its arguments.
UNCOMMON = {
    "all_reduce_coalesced": (
        lambda: dist.all_reduce_coalesced([torch.ones(5), torch.ones(6)]), {(5,), (6,)}, {(5,), (6,)}, -1
    ),
    "all_gather_coalesced": (
        lambda: dist.all_gather_coalesced([[torch.ones(7)]], [torch.ones(7)]), {(7,)}, {(7,)}, -1
    ),
    "reduce_scatter": (
        lambda: dist.reduce_scatter(torch.ones(8), [torch.ones(8)]), {(8,)}, {(8,)}, -1
    ),
    "_reduce_scatter_base": (
        lambda: dist._reduce_scatter_base(torch.ones(9), torch.ones(9)), {(9,)}, {(9,)}, -1
    ),
    "all_to_all": (
        lambda: dist.all_to_all([torch.ones(10)], [torch.ones(11)]), {(11,)}, {(10,)}, -1
    ),
    "scatter": (
        lambda: dist.scatter(torch.ones(12), scatter_list=[torch.ones(12)], src=0), {(12,)}, {(12,)}, 0
    ),
    "gather": (
        lambda: dist.gather(torch.ones(13), gather_list=[torch.ones(13)], dst=0), {(13,)}, {(13,)}, 0
    ),
    "monitored_barrier": (lambda: dist.monitored_barrier(), set(), set(), -1),
}  # fmt: skip


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", sorted(UNCOMMON))
def test_every_uncommon_collective_records_its_arguments(rt: Runtime, name: str) -> None:
    call, inputs, outputs, root = UNCOMMON[name]
    try:
        call()
        raised = False
    except Exception:  # gloo's "not supported": recorded all the same
        raised = True
    (row,) = [r for r in entries(rt) if rt.recorder.strings.values[r.op] == name]
    assert row.state == (FAILED if raised else COMPLETED), name
    assert row.seq >= 1 and row.peer == root
    assert _shapes(rt, row.inputs) == inputs and _shapes(rt, row.outputs) == outputs
