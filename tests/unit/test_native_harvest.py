"""Merging PyTorch's native ring into flightrec's at dump time (recorder/native/harvest.py).

Scenarios are built from small factories: flightrec ``Slot``s as the ring decodes them and
``NativeOp``s as the harvest reads them; times are monotonic microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import EntryValues
from flightrec.format.slot import Slot
from flightrec.recorder.native import harvest as native_harvest
from flightrec.recorder.native.harvest import Harvest, NativeOp
from flightrec.recorder.native.merge import merge
from flightrec.recorder.native.watch import NativeWatch

US = 1_000
STRINGS = ["", "MainThread", "worker", "all_reduce", "all_gather_object", "SUM", "cpu", "send"]
GROUPS = ["0", "1"]  # flightrec group index -> torch group name
STACK = [("train.py", "step", 7)]


def slot(rid: int, t_us: int, done_us: int = 0, **kw: Any) -> Slot:
    values = dict(
        record_id=rid, enqueue_ns=t_us * US, complete_ns=done_us * US,
        state=pb.COMPLETED if done_us else pb.ENQUEUED, seq=rid, p2p_seq=0, group=0,
        op=3, reduce_op=5, peer=-1, thread=1, stack=1, inputs=0, outputs=0, device=6, flags=0,
    )  # fmt: skip
    values.update(kw)
    return Slot(**values)  # type: ignore[arg-type]


def native(rid: int, t_us: int, seq: int, **kw: Any) -> NativeOp:
    values = dict(
        record_id=rid, pg_id=0, group="0", desc="default_pg", seq=seq, is_p2p=False,
        op="all_reduce", backend="gloo", local_src=-1, local_dst=-1, created_ns=t_us * US,
        complete_ns=0, state=pb.COMPLETED, thread="MainThread", python_thread=True, inputs=((((2,), "float32"),)),
        outputs=(), stack=(("funcol.py", "all_reduce", 1), ("model.py", "forward", 3)),
    )  # fmt: skip
    values.update(kw)
    return NativeOp(**values)  # type: ignore[arg-type]


def merged(slots: Sequence[Slot], ops: Sequence[NativeOp], wrapped: bool = False) -> Any:
    def group_index(op: NativeOp) -> int:
        return GROUPS.index(op.group) if op.group in GROUPS else 7

    return merge(slots, Harvest(list(ops), wrapped), GROUPS, STRINGS, group_index, lambda i: STACK)


def describe(rows: Sequence[Slot | EntryValues]) -> list[tuple[str, int, int]]:
    """(kind, group, seq) per row: "fr" for flightrec's own entries, "native" for the others."""
    return [("fr" if isinstance(r, Slot) else "native", r.group, r.seq) for r in rows]


def test_python_calls_take_the_process_groups_numbers_and_native_only_calls_are_added() -> None:
    # all_reduce (Python) -> funcol all_reduce (DTensor: native only) -> all_reduce (Python)
    slots = [slot(1, 100, 110, seq=1), slot(2, 300, 310, seq=2)]
    ops = [native(0, 105, 1), native(1, 200, 2), native(2, 305, 3)]
    m = merged(slots, ops)
    assert describe(m.rows) == [("fr", 0, 1), ("native", 0, 2), ("fr", 0, 3)]
    added = m.rows[1]
    assert isinstance(added, EntryValues)
    assert added.record_id == 0 and added.stack == ops[1].stack and added.device == "cpu"
    assert m.last_seq == {0: 3} and m.dropped == {0: 0}


def test_an_object_collective_becomes_the_collectives_torch_ran_with_its_stack() -> None:
    obj = slot(1, 100, 200, op=4, flags=pb.OBJECT_API, seq=1)
    ops = [native(0, 110, 1, op="all_gather"), native(1, 150, 2, op="all_gather")]
    m = merged([obj, slot(2, 300, 310, seq=2)], [*ops, native(2, 305, 3)])
    assert describe(m.rows) == [("native", 0, 1), ("native", 0, 2), ("fr", 0, 3)]
    first, second = m.rows[0], m.rows[1]
    assert isinstance(first, EntryValues) and isinstance(second, EntryValues)
    assert first.op == second.op == "all_gather" and first.stack == tuple(STACK)
    assert first.record_id == second.record_id == 1 and first.flags == pb.OBJECT_API
    assert (first.state, second.state, second.complete_ns) == (pb.COMPLETED, pb.COMPLETED, 200 * US)


def test_entries_older_than_the_native_window_are_left_out_and_counted() -> None:
    slots = [slot(1, 100, 110, seq=1), slot(2, 300, 310, seq=2)]
    m = merged(slots, [native(41, 305, 42)], wrapped=True)
    assert describe(m.rows) == [("fr", 0, 42)]
    assert m.last_seq == {0: 42} and m.dropped == {0: 41}


def test_a_call_that_raised_before_reaching_the_process_group_keeps_its_place() -> None:
    # Three all_reduces, then an all_gather whose output gloo refused on the way in: torch
    # never recorded it, and it stands where the group's fourth collective goes (its peers').
    slots = [slot(i, 100 * i, 100 * i + 10, seq=i) for i in (1, 2, 3)]
    failed = slot(4, 400, 405, seq=4, op=4, state=pb.FAILED)
    m = merged([*slots, failed], [native(i - 1, 100 * i + 5, i) for i in (1, 2, 3)])
    assert describe(m.rows) == [("fr", 0, 1), ("fr", 0, 2), ("fr", 0, 3), ("fr", 0, 4)]
    assert m.rows[-1].state == pb.FAILED and m.dropped == {0: 0}


def test_a_group_the_native_recorder_never_saw_keeps_flightrecs_numbering() -> None:
    slots = [slot(1, 100, 110, seq=1, group=1), slot(2, 300, 310, seq=2)]
    m = merged(slots, [native(0, 305, 9)])
    assert describe(m.rows) == [("fr", 1, 1), ("fr", 0, 9)]
    assert m.last_seq == {0: 9}


def test_threads_are_matched_separately() -> None:
    # MainThread and "worker" issue on the same group, interleaved in time.
    slots = [slot(1, 100, 400, seq=1), slot(2, 150, 300, seq=2, thread=2)]
    ops = [native(0, 160, 1, thread="worker"), native(1, 170, 2)]
    m = merged(slots, ops)
    rows = {r.record_id: r.seq for r in m.rows}
    assert rows == {1: 2, 2: 1}


def test_threads_that_ended_before_the_dump_are_matched_by_group_and_time() -> None:
    slots = [slot(1, 100, 110, seq=1, thread=2), slot(2, 200, 210, seq=2, thread=2)]
    ops = [native(0, 105, 7, thread="python", python_thread=False),
           native(1, 150, 8, thread="python", python_thread=False),  # a C++ thread's
           native(2, 205, 9, thread="python", python_thread=False)]  # fmt: skip
    m = merged(slots, ops)
    assert describe(m.rows) == [("fr", 0, 7), ("native", 0, 8), ("fr", 0, 9)]


def test_an_async_call_is_matched_before_the_threads_next_call() -> None:
    # async all_reduce completes late; a funcol call follows it on the same thread.
    slots = [slot(1, 100, 900, seq=1, flags=pb.ASYNC_OP), slot(2, 500, 510, seq=2)]
    ops = [native(0, 105, 1), native(1, 300, 2), native(2, 505, 3)]
    assert describe(merged(slots, ops).rows) == [("fr", 0, 1), ("native", 0, 2), ("fr", 0, 3)]


def test_p2p_keeps_flightrecs_per_peer_numbering_and_is_not_counted_twice() -> None:
    send = slot(1, 100, 110, seq=0, p2p_seq=1, peer=1, op=7, flags=pb.IS_P2P | pb.SEND)
    ops = [native(0, 105, 0, is_p2p=True, op="send", local_src=0, local_dst=1)]
    m = merged([send], ops)
    assert m.rows == [send]


def test_native_stacks_keep_torchs_lead_and_depth_program_frames() -> None:
    torch_dir = native_harvest.torch_dir()
    frames = [
        {"filename": torch_dir + "_ops.py", "name": "__call__", "line": 1},
        {"filename": torch_dir + "distributed/tensor/_api.py", "name": "redistribute", "line": 2},
        {"filename": "/job/model.py", "name": "forward", "line": 3},
        {"filename": torch_dir + "nn/modules/module.py", "name": "_call_impl", "line": 4},
        {"filename": "/job/train.py", "name": "main", "line": 5},
    ]
    assert [f[2] for f in native_harvest._stack(frames, 2)] == [1, 2, 3, 4]
    assert native_harvest._stack(frames, 0) == ()


def test_a_gloo_entry_is_finished_once_retired() -> None:
    entry = {"profiling_name": "gloo:_allgather_base", "process_group": ("3", "tp"),
             "collective_seq_id": 4, "state": "scheduled", "retired": True,
             "time_created_ns": 1_000, "thread_id": "12", "thread_name": "python",
             "input_sizes": [[2]], "input_dtypes": ["Float"],
             "output_sizes": [[4]], "output_dtypes": ["Float"]}  # fmt: skip
    op = native_harvest._op(entry, 5, {12: "MainThread"}, 16)
    assert (op.op, op.group, op.seq, op.state) == ("all_gather_into_tensor", "3", 4, pb.COMPLETED)
    assert (op.thread, op.created_ns, op.inputs) == ("MainThread", 1_005, (((2,), "float32"),))
    pending = native_harvest._op(dict(entry, retired=False), 0, {}, 16)
    assert pending.state == pb.ENQUEUED and pending.thread == "python"


class _Status:
    def __init__(self) -> None:
        self.value: dict[str, dict[str, int]] = {}

    def __call__(self) -> dict[str, dict[str, int]]:
        return self.value


def test_native_watch_reports_a_counter_stuck_for_the_timeout_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status = _Status()
    watch = NativeWatch(timeout_s=3)
    monkeypatch.setattr(watch, "_status", status)
    entries = [
        {"pg_id": 2, "collective_seq_id": 4, "retired": True, "profiling_name": "gloo:allreduce"},
        {"pg_id": 2, "collective_seq_id": 5, "retired": False, "process_group": ("7", "tp"),
         "profiling_name": "gloo:allreduce"},
    ]  # fmt: skip
    monkeypatch.setattr(watch, "_json", lambda include_entries: {"entries": entries})
    s = 1_000_000_000
    status.value = {"2": {"last_enqueued_collective": 5, "last_completed_collective": 4}}
    assert watch.poll(0) is None
    assert watch.poll(2 * s) is None
    found = watch.poll(3 * s)
    assert found is not None and found.startswith("all_reduce on group 7 seq 5 ")
    assert watch.poll(5 * s) is None  # reported once
    status.value = {"2": {"last_enqueued_collective": 7, "last_completed_collective": 6}}
    assert watch.poll(6 * s) is None  # progress: a new pending collective starts its clock
    assert watch.poll(7 * s) is None


def test_native_watch_trusts_the_entries_over_counters_set_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gloo's "last completed" can be stored out of order; every entry says it finished.
    status = _Status()
    status.value = {"0": {"last_enqueued_collective": 3, "last_completed_collective": 2}}
    watch = NativeWatch(timeout_s=1)
    monkeypatch.setattr(watch, "_status", status)
    done = [{"pg_id": 0, "collective_seq_id": n, "retired": True} for n in (1, 2, 3)]
    monkeypatch.setattr(watch, "_json", lambda include_entries: {"entries": done})
    assert [watch.poll(t * 1_000_000_000) for t in range(4)] == [None] * 4


def test_native_watch_polls_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    watch = NativeWatch(timeout_s=3)
    monkeypatch.setattr(watch, "_status", lambda: calls.append(1) or {})
    for t in range(0, 2_000_000_000, 100_000_000):
        watch.poll(t)
    assert len(calls) == 2


def test_symbolizing_native_stacks_never_imports_inductor() -> None:
    import sys

    import torch

    if "torch._inductor" in sys.modules:
        pytest.skip("inductor already imported in this test process")
    with native_harvest._no_inductor_import():
        assert not hasattr(torch._inductor, "codecache")  # what torch's symbolizer asks
    assert "torch._inductor" not in sys.modules and "_inductor" not in vars(torch)


def test_ddp_buckets_are_the_reducers_all_reduces_on_a_ddp_group() -> None:
    import os

    # torch's own autograd, where torch is installed (a folder named torch elsewhere is not).
    autograd = os.path.join(native_harvest.torch_dir(), "autograd", "graph.py")
    backward = (
        (autograd, "_engine_run_backward", 9),
        ("train.py", "train", 40),
    )
    ops = [
        native(1, 10, 1, stack=backward),  # CPU: the engine ran on the calling thread
        native(2, 20, 2, thread="", python_thread=False, stack=()),  # an engine device thread
        native(3, 30, 3),  # functional all_reduce from the model's forward
        native(4, 40, 4, op="broadcast", stack=backward),
        native(5, 50, 1, group="other", desc="", stack=backward),  # not a DDP model's group
    ]
    h = Harvest(ops, False)
    rows = merge([], h, GROUPS, STRINGS, lambda op: 0, lambda i: STACK, frozenset({"0"})).rows
    assert [bool(r.flags & pb.DDP_BUCKET) for r in rows] == [True, True, False, False, False]
    plain = merge([], h, GROUPS, STRINGS, lambda op: 0, lambda i: STACK).rows
    assert not any(r.flags & pb.DDP_BUCKET for r in plain)
