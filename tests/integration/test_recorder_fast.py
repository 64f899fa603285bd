"""The C hot path records exactly what the Python path records, and steps aside on any miss."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flightrec.format.slot import COMPLETED, FAILED, Slot, decode  # noqa: E402
from flightrec.recorder.hooks import codegen  # noqa: E402
from flightrec.recorder.hooks.specs import spec_for  # noqa: E402
from flightrec.recorder.hotpath.groups import GroupInfo  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.gloo import traced_runtime  # noqa: E402

pytestmark = pytest.mark.skipif(
    codegen._fast is None, reason="C hot path not built (python setup.py build_ext --inplace)"
)
c10d = dist.distributed_c10d


@pytest.fixture
def rt(pg: None, tmp_path: Path) -> Iterator[Runtime]:
    with traced_runtime(tmp_path, buffer=64) as runtime:
        yield runtime


def wrappers(rt: Runtime, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The C-path and Python-path wrappers of torch's ``name``, on the same recorder."""
    orig = rt.hooks.originals[name]
    spec = spec_for(name, orig)
    out = {}
    for path in ("c", "python"):
        monkeypatch.setattr(codegen, "USE_FAST", path == "c")
        out[path] = codegen.generate(spec, orig, rt.recorder)
    assert isinstance(out["c"], codegen._fast.Site) and not isinstance(
        out["python"], codegen._fast.Site
    )
    return out


def rows(rt: Runtime) -> list[Slot]:
    return decode(rt.recorder.ring.snapshot())


def same_entry(a: Slot, b: Slot) -> None:
    """Everything but record id, times and sequence number agrees."""
    skip = {"record_id", "enqueue_ns", "complete_ns", "seq"}
    assert {k: v for k, v in a._asdict().items() if k not in skip} == {
        k: v for k, v in b._asdict().items() if k not in skip
    }


def call_site(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # One line for both wrappers: the same caller frame and line give the same stack.
    return fn(*args, **kwargs)


CASES: list[tuple[str, Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]] = [
    ("all_reduce", lambda: ((torch.ones(3, dtype=torch.float64),), {})),
    ("all_reduce", lambda: ((torch.ones(2),), {"op": dist.ReduceOp.MAX})),
    ("all_reduce", lambda: ((torch.ones(2),), {"async_op": True})),
    ("broadcast", lambda: ((torch.ones(4), 0), {})),
    ("broadcast", lambda: ((torch.ones(4),), {"group_src": 0})),
    ("reduce", lambda: ((torch.ones(4), 0), {"op": dist.ReduceOp.MIN})),
    ("all_gather_into_tensor", lambda: ((torch.zeros(4), torch.ones(4)), {})),
    ("reduce_scatter_tensor", lambda: ((torch.zeros(4), torch.ones(4)), {})),
    ("_all_gather_base", lambda: ((torch.zeros(2), torch.ones(2)), {})),
    ("all_gather_single", lambda: ((torch.zeros(2), torch.ones(2)), {})),
    ("reduce_scatter_single", lambda: ((torch.zeros(2), torch.ones(2)), {})),
    ("barrier", lambda: ((), {})),
]


@pytest.mark.parametrize(
    ("name", "make"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)]
)
def test_c_path_writes_the_python_paths_entry(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, name: str, make: Any
) -> None:
    w = wrappers(rt, name, monkeypatch)
    results = []
    for path in ("python", "c", "c"):  # the first C call may fill caches; the second hits
        args, kwargs = make()
        work = call_site(w[path], *args, **kwargs)
        if work is not None:
            work.wait()
        results.append(rows(rt)[-1])
    rt.recorder.tracker.poll()
    py, c1, c2 = results
    same_entry(py, c1)
    same_entry(py, c2)
    assert [r.seq for r in results] == [py.seq, py.seq + 1, py.seq + 2]
    for r in rows(rt)[-3:]:
        assert r.state == COMPLETED and r.complete_ns >= r.enqueue_ns


def test_all_to_all_single_is_recorded_per_peer_where_split_sizes_are_given(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its split sizes say what each peer sends and receives (an MoE router's counts): the
    # entry holds one chunk per peer, so the analysis checks them pair by pair. The Python
    # path records it, even where the C path is built.
    orig = rt.hooks.originals["all_to_all_single"]
    spec = spec_for("all_to_all_single", orig)
    monkeypatch.setattr(codegen, "USE_FAST", True)
    wrapper = codegen.generate(spec, orig, rt.recorder)
    assert not isinstance(wrapper, codegen._fast.Site)
    tensors = rt.recorder.tensors.values
    # One rank has one peer (itself): splits of 3 rows out of 4 show the chunk was recorded,
    # not the tensor. torch then rejects the call, and the entry says it failed.
    with pytest.raises(Exception, match=r"[Ss]plit"):
        wrapper(torch.zeros(4, 2), torch.ones(4, 2), output_split_sizes=[3], input_split_sizes=[3])
    entry = rows(rt)[-1]
    assert tensors[entry.inputs] == tensors[entry.outputs] == (((3, 2), "float32"),)
    assert entry.state == FAILED
    wrapper(torch.zeros(4, 2), torch.ones(4, 2))  # even splits: the tensors as passed
    entry = rows(rt)[-1]
    assert tensors[entry.inputs] == (((4, 2), "float32"),)
    assert entry.state == COMPLETED


def test_enter_hits_only_when_every_cache_does(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "all_reduce", monkeypatch)
    enter, leave = w["c"].fast.enter, w["c"].fast.leave
    op = rt.recorder.op_index("all_reduce")
    args = (op, 0, None)
    fresh = torch.ones(7, 5)  # a shape this recorder has never seen
    ids_before = len(rows(rt))
    seq_before = rt.recorder.groups.by_pg[None].seq if None in rt.recorder.groups.by_pg else 0
    assert enter(*args, fresh, fresh, dist.ReduceOp.SUM, None, None, False, None) == -1
    assert len(rows(rt)) == ids_before  # nothing consumed: the Python path takes over
    info = rt.recorder.groups.by_pg.get(None)
    assert info is None or info.seq == seq_before
    w["python"](fresh)  # fills the caches
    rid = enter(*args, fresh, fresh, dist.ReduceOp.SUM, None, None, False, None)
    assert rid > 0 and rt.recorder.active  # reentrancy guard set
    # A call made inside a recorded one is not recorded by the C path either.
    assert enter(*args, fresh, fresh, dist.ReduceOp.SUM, None, None, False, None) == 0
    leave(rid, None, False, None)
    assert not rt.recorder.active
    assert rows(rt)[-1].record_id == rid and rows(rt)[-1].state == COMPLETED
    # Not a tensor: the C path steps aside, and the Python path lets torch raise its error.
    assert enter(*args, "x", "x", dist.ReduceOp.SUM, None, None, False, None) == -1
    rt.recorder.enabled = False
    assert enter(*args, fresh, fresh, dist.ReduceOp.SUM, None, None, False, None) == -1


def test_both_enters_keep_one_contract(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ``enter(...)`` arguments, given to the Python path and to the C path (once
    the Python path filled the caches), write the same entry; what the C path does not
    handle (point-to-point, tensor lists) it hands back with -1, having consumed nothing."""
    from flightrec.format.builder import IS_P2P, SEND

    # enter and leave without torch's call: torch's numbers never move, so the group keeps
    # flightrec's own (the module's earlier tests ran on this group too).
    monkeypatch.setattr(GroupInfo, "follow_native", lambda self: None)
    w = wrappers(rt, "all_reduce", monkeypatch)
    py, c = rt.recorder.path, w["c"].fast
    op = rt.recorder.op_index("all_reduce")
    t = torch.ones(3)
    calls = [
        (op, 0, None, t, t, dist.ReduceOp.SUM, None, None, False),
        (op, 0, None, t, t, dist.ReduceOp.MAX, None, 0, True),
        (op, 0, None, t, torch.zeros(3), 0, 0, None, False),
    ]
    for args in calls:
        for enter, leave in ((py.enter, py.leave), (c.enter, c.leave)):
            rid = call_site(enter, *args, None)
            assert rid > 0, (enter, args)
            leave(rid, None, False, None)
        a, b = rows(rt)[-2:]
        same_entry(a, b)
        assert b.seq == a.seq + 1
    before = len(rows(rt))
    p2p = (op, IS_P2P | SEND, None, t, 0, 0, 0, None, True, None)
    lists = (op, 0, None, [t, t], t, 0, None, None, False, None)
    assert c.enter(*p2p) == -1 and c.enter(*lists) == -1
    assert len(rows(rt)) == before
    for args in (p2p, lists):
        rid = py.enter(*args)
        assert rid > 0
        py.leave(rid, None, False, None)
    p2p_row, list_row = rows(rt)[-2:]
    assert (p2p_row.seq, p2p_row.p2p_seq, p2p_row.peer) == (0, 1, 0)
    assert list_row.inputs != list_row.outputs and list_row.seq > 0


def test_c_path_wraps_the_ring_and_keeps_slots_whole(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "all_reduce", monkeypatch)
    t = torch.ones(1)
    for _ in range(150):  # buffer=64: wraps twice
        w["c"](t)
    got = rows(rt)
    assert len(got) == 64
    ids = [r.record_id for r in got]
    assert ids == list(range(ids[0], ids[0] + 64))
    assert [r.seq for r in got] == list(range(got[0].seq, got[0].seq + 64))
    assert all(r.state == COMPLETED for r in got)


def test_a_raising_call_is_failed_through_the_c_path(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "broadcast", monkeypatch)
    w["python"](torch.ones(1), 0)
    w["c"](torch.ones(1), 0)  # caches warm
    with pytest.raises(Exception) as theirs:
        rt.hooks.originals["broadcast"](torch.ones(1), src=5)
    with pytest.raises(type(theirs.value)):
        w["c"](torch.ones(1), src=5)
    last = rows(rt)[-1]
    assert last.state == 4 and last.peer == 5  # FAILED
    assert not rt.recorder.active


def test_site_binds_positional_and_keyword_calls_like_the_function(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "reduce", monkeypatch)
    site = w["c"]
    calls = [
        ((torch.ones(2), 0, dist.ReduceOp.MAX), {}),
        ((torch.ones(2),), {"dst": 0, "op": dist.ReduceOp.MAX}),
        ((), {"tensor": torch.ones(2), "op": dist.ReduceOp.MAX, "group_dst": 0}),
    ]
    got = []
    for args, kwargs in calls:
        for path in ("python", "c"):  # one line: the same stack
            call_site(w[path], *args, **kwargs)
        got.extend(rows(rt)[-2:])
    for py, c in zip(got[::2], got[1::2], strict=True):
        same_entry(py, c)
        assert rt.recorder.strings.values[c.reduce_op] == "MAX" and c.peer == 0
    # What the Site cannot bind plainly goes to the Python path, which lets Python raise.
    before = len(rows(rt))
    for args, kwargs in [((torch.ones(1),), {"bogus": 1}), ((), {}), ((torch.ones(1),) * 9, {})]:
        with pytest.raises(TypeError) as ours:
            site(*args, **kwargs)
        with pytest.raises(TypeError) as theirs:
            rt.hooks.originals["reduce"](*args, **kwargs)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="multiple values"):
        site(torch.ones(1), 0, dst=0)
    assert len(rows(rt)) == before


def test_site_stands_in_for_the_function(rt: Runtime) -> None:
    import inspect
    import pickle

    site = rt.hooks.wrappers["all_reduce"]
    orig = rt.hooks.originals["all_reduce"]
    assert isinstance(site, codegen._fast.Site)
    assert site.__name__ == "all_reduce" and site.__doc__ == orig.__doc__
    assert inspect.signature(site) == inspect.signature(orig)
    assert pickle.loads(pickle.dumps(site)) is site  # by reference, like a function
    assert "all_reduce" in repr(site)


def test_site_records_the_callers_stack(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    w = wrappers(rt, "all_reduce", monkeypatch)

    def user_code_line() -> None:
        w["c"](torch.ones(1))

    user_code_line()
    user_code_line()  # the cached-top path
    for row in rows(rt)[-2:]:
        frames = rt.recorder.stacks.symbolize(row.stack)
        assert frames[0][1].endswith("user_code_line"), frames[:2]
        assert frames[1][1].endswith("test_site_records_the_callers_stack")


def _reduce(fn: Callable[..., Any], t: Any) -> None:
    fn(t)  # the caller: a helper, whose caller is a new activation at every step


def _step(fn: Callable[..., Any], t: Any) -> None:
    _reduce(fn, t)


def test_a_helper_below_a_new_activation_per_call_gets_its_stack_from_the_frames(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # train -> step -> helper -> all_reduce: the caller's caller (step) is new at every call,
    # so the first cache (keyed by that activation) misses each time; the second, keyed by the
    # whole walk of (code, offset) pairs, must find the stack the Python walk interned.
    w = wrappers(rt, "all_reduce", monkeypatch)
    fast = w["c"].fast
    t = torch.ones(1)
    stacks = rt.recorder.stacks

    def train(path: str) -> list[int]:
        got = []
        for _ in range(5):
            _step(w[path], t)  # one line for both paths: the same stack
            got.append(rows(rt)[-1].stack)
        return got

    w["c"](t)  # the group, tensor and thread caches filled elsewhere
    got, hits = {}, {}
    for path in ("c", "python"):
        before = fast.walk_hits
        got[path] = train(path)  # one line for both paths
        hits[path] = fast.walk_hits - before
    c_stacks = got["c"]
    assert hits == {"c": 4, "python": 0}  # all C calls but the first, which walked in Python
    # The same frames as the Python path's (its offsets may differ within the calling line:
    # an interpreter's CALL into Python code skips its inline caches first, into C not).
    assert len(set(c_stacks)) == 1 and len(set(got["python"])) == 1
    assert stacks.symbolize(c_stacks[0]) == stacks.symbolize(got["python"][0])
    names = [name for _, name, _ in stacks.symbolize(c_stacks[0])[:4]]
    assert [n.rsplit(".", 1)[-1] for n in names] == ["_reduce", "_step", "train", names[3]]
    assert names[3].endswith(
        "test_a_helper_below_a_new_activation_per_call_gets_its_stack_from_the_frames"
    )

    # The same helpers under another line: another stack, never the cached one.
    def other_train() -> int:
        _step(w["c"], t)
        _step(w["c"], t)
        return rows(rt)[-1].stack

    other = other_train()
    assert other != c_stacks[0]
    assert [n for _, n, _ in stacks.symbolize(other)[:3]][2].endswith("other_train")


def test_site_alternating_groups_keep_their_own_counters(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "all_reduce", monkeypatch)
    other = dist.new_group([0])
    t = torch.ones(1)
    for group in (None, other) * 3:
        w["python"](t, group=group)  # first sight of each group goes through Python
    for group in (None, other) * 3:
        w["c"](t, group=group)
    got = rows(rt)[-6:]
    infos = rt.recorder.groups
    names = [infos.groups[r.group].name for r in got]
    assert names[0::2] == [infos.by_pg[None].name] * 3
    assert names[1::2] == [infos.by_pg[other].name] * 3 and names[0] != names[1]
    # The default group's numbers are torch's: this module's earlier tests ran on it too.
    first = got[0].seq
    assert [r.seq for r in got[0::2]] == [first, first + 1, first + 2]
    assert [r.seq for r in got[1::2]] == [4, 5, 6]
    dist.destroy_process_group(other)


def test_c_slot_layout_is_the_rings() -> None:
    from flightrec.format.slot import SLOT_SIZE

    assert codegen._fast is not None and codegen._fast.SLOT_SIZE == SLOT_SIZE


def test_a_tensor_changed_in_place_gets_its_new_signature(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Neither ``_version`` nor identity says a tensor changed: ``t.data = ...`` swaps shape and
    # dtype under the same object without a version bump. The C path reads both at every call.
    w = wrappers(rt, "all_reduce", monkeypatch)
    tensors = rt.recorder.tensors.values
    t = torch.ones(2)
    seen = []
    for change in (
        lambda: None,
        lambda: setattr(t, "data", torch.ones(3, dtype=torch.float64)),
        lambda: t.resize_(5),
        lambda: t.unsqueeze_(0),
    ):
        change()
        for path in ("python", "c", "c"):  # the Python path fills the caches, then C hits
            call_site(w[path], t)
            seen.append(tensors[rows(rt)[-1].inputs])
    assert seen == [
        *[(((2,), "float32"),)] * 3,
        *[(((3,), "float64"),)] * 3,
        *[(((5,), "float64"),)] * 3,
        *[(((1, 5), "float64"),)] * 3,
    ]


class _Doubled(torch.Tensor):
    """A tensor type whose ``shape`` is Python code (getattr, not torch's getter)."""

    @property
    def shape(self) -> Any:  # type: ignore[override]
        return torch.Size([2 * n for n in super().shape])


class _Plain(torch.Tensor):
    """A tensor type with torch's own getters, until a test replaces one."""


def test_tensor_types_keep_their_own_shape_and_dtype_getters(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = wrappers(rt, "all_reduce", monkeypatch)
    tensors = rt.recorder.tensors.values
    plain, odd = torch.ones(3), torch.ones(3).as_subclass(_Doubled)
    got = []
    for t in (plain, odd, plain, odd):
        for path in ("python", "c"):
            call_site(w[path], t)
            got.append(tensors[rows(rt)[-1].inputs][0][0])
    assert got == [(3,), (3,), (6,), (6,)] * 2
    # A type changed after its getters were cached (its version tag moves): the new one counts.
    sub = torch.ones(3).as_subclass(_Plain)
    for path in ("python", "c", "c"):
        call_site(w[path], sub)
        assert tensors[rows(rt)[-1].inputs] == (((3,), "float32"),)
    monkeypatch.setattr(_Plain, "shape", property(lambda self: torch.Size([7])), raising=False)
    for path in ("python", "c", "c"):
        call_site(w[path], sub)
        assert tensors[rows(rt)[-1].inputs] == (((7,), "float32"),), path


class _Nested(torch.Tensor):
    """A tensor whose ``shape`` makes a collective on another group (set ``nested``): the C
    path's getter call runs Python code, which moves the group cache under it."""

    nested: Callable[[], None] | None = None

    @property
    def shape(self) -> Any:  # type: ignore[override]
        if _Nested.nested is not None:
            _Nested.nested()
        return super().shape


def test_a_group_cache_moved_by_python_code_mid_call_is_not_used(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The C path borrows the cached group's fields; a getter that runs a collective on another
    # group replaces them before the outer call takes its sequence number. The outer call
    # must still be recorded on its own group, with its own counter (the Python path takes it).
    w = wrappers(rt, "all_reduce", monkeypatch)
    other = dist.new_group([0])
    plain = torch.ones(2)
    for group in (None, other):
        w["python"](plain, group=group)  # both groups known, caches filled
        w["c"](plain, group=group)
    monkeypatch.setattr(_Nested, "nested", lambda: w["c"](plain, group=other))
    t = torch.ones(2).as_subclass(_Nested)
    before = len(rows(rt))
    w["c"](t)
    got = rows(rt)[before:]
    infos = rt.recorder.groups
    default, nested = infos.by_pg[None], infos.by_pg[other]
    outer = [r for r in got if r.group == default.index]
    inner = [r for r in got if r.group == nested.index]
    assert len(outer) == 1 and inner, [(r.group, r.seq) for r in got]
    # The default group's third call: torch's number for it where the group follows torch's
    # (the module's earlier tests ran on it too).
    assert outer[0].seq == (default.seq if default.counter.source is not None else 3)
    assert [r.seq for r in inner] == list(range(3, 3 + len(inner)))
    monkeypatch.setattr(_Nested, "nested", None)
    dist.destroy_process_group(other)


def test_a_replaced_group_entry_is_seen_by_the_c_path(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The C path keeps the group it found last while ``by_pg`` is unchanged; a new default
    # group (init after destroy) replaces ``by_pg[None]``, and the next call must see it.
    w = wrappers(rt, "all_reduce", monkeypatch)
    t = torch.ones(1)
    other = dist.new_group([0])
    by_pg = rt.recorder.groups.by_pg
    w["python"](t, group=other)  # registers the other group
    for _ in range(2):
        w["c"](t)
    default, replacement = by_pg[None], by_pg[other]
    assert rows(rt)[-1].group == default.index
    by_pg[None] = replacement
    try:
        w["c"](t)
        assert rows(rt)[-1].group == replacement.index
    finally:
        by_pg[None] = default
    w["c"](t)
    assert rows(rt)[-1].group == default.index
    dist.destroy_process_group(other)


def _parent(fn: Callable[[], None]) -> None:
    sys._getframe()  # its frame object exists before the call, as under a debugger
    fn()  # one instruction, a new activation of this frame at every call


def test_site_stacks_tell_activations_and_callers_apart(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The C cache matches the caller's caller by its frame object, never by where the
    # interpreter keeps the frame: a new activation of ``_parent`` (likely at the same
    # address, at the same instruction, calling the same function) called from another line
    # gets its own stack, and so does another function called from the same instruction.
    w = wrappers(rt, "all_reduce", monkeypatch)
    t = torch.ones(1)

    def first() -> None:
        w["c"](t)

    def second() -> None:
        w["c"](t)

    def top() -> tuple[str, str, str, int]:
        frames = rt.recorder.stacks.symbolize(rows(rt)[-1].stack)
        (_, a, _), (_, b, _), (_, c, line) = frames[0][:3], frames[1][:3], frames[2][:3]
        return a.rsplit(".", 1)[-1], b.rsplit(".", 1)[-1], c.rsplit(".", 1)[-1], line

    here = "test_site_stacks_tell_activations_and_callers_apart"
    got: list[tuple[Any, ...]] = []
    for _ in range(2):
        _parent(first)
        got.append(top())
        _parent(first)  # the same again, from the next line
        got.append(top())
        _parent(second)
        got.append(top())
        for fn in (first, second):  # one activation of this frame, at one instruction
            fn()
            got.append(top()[:2])
    assert [g[:3] for g in got[:3]] == [("first", "_parent", here)] * 2 + [
        ("second", "_parent", here)
    ]
    assert got[1][3] == got[0][3] + 2 and got[2][3] == got[0][3] + 4
    assert got[3:5] == [("first", here), ("second", here)]
    assert got[5:] == got[:5]


def test_both_paths_number_a_group_as_torch_does_once_torch_ran_calls_unseen(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collectives issued past flightrec's hooks (DDP's reducer, here the untraced original)
    count in torch's numbering: once the watchdog's tick sees the counters part, each path
    takes the ProcessGroup's next number, so a black box agrees with its peers' dumps."""
    w = wrappers(rt, "all_reduce", monkeypatch)
    orig = rt.hooks.originals["all_reduce"]
    t = torch.ones(1)
    for path in ("python", "c", "c"):
        w[path](t)
    info = rt.recorder.groups.by_pg[None]
    for _ in range(3):
        orig(t)  # torch numbers these; flightrec never sees them
    rt.recorder.groups.follow_native()
    assert info.counter.source is not None
    base = info.native_seq()
    for path in ("python", "c", "c", "python"):
        w[path](t)
    assert [r.seq for r in rows(rt)[-4:]] == [base + 1, base + 2, base + 3, base + 4]
    assert info.native_seq() == base + 4 == info.seq
