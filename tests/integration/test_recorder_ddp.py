"""DDP models built while tracing: their gradient all-reduces are recorded, user hooks win."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from flightrec.format.slot import COMPLETED, decode  # noqa: E402
from flightrec.recorder.hooks.ddp import DDP_BUCKET  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.gloo import one_rank_gloo, traced_runtime  # noqa: E402


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    with one_rank_gloo(), traced_runtime(tmp_path, buffer=64, background=True) as runtime:
        yield runtime


def step(model: Any) -> int:
    """One training step; returns the line of its backward() call."""
    loss = model(torch.ones(2, 4)).sum()
    line = sys._getframe().f_lineno + 1
    loss.backward()
    return line


def test_gradient_buckets_are_recorded_with_the_backward_line(rt: Runtime) -> None:
    torch.manual_seed(0)
    plain = nn.Linear(4, 3)
    model = DDP(nn.Linear(4, 3))
    plain.load_state_dict(model.module.state_dict())
    line = step(model)
    step(model)
    rows = decode(rt.recorder.ring.snapshot())
    strings = rt.recorder.strings.values
    assert [strings[r.op] for r in rows] == ["all_reduce", "all_reduce"]
    # Numbered as torch numbers them (DDP's constructor and forward run collectives of their
    # own from C++, which flightrec never sees): the numbers its peers' dumps carry.
    assert rows[0].seq > 1 and rows[0].seq < rows[1].seq
    assert rows[1].seq == dist.group.WORLD._get_sequence_number_for_group()
    assert all(r.state == COMPLETED for r in rows)
    assert rt.recorder.tensors.values[rows[0].inputs] == (((4 * 3 + 3,), "float32"),)
    frames = rt.recorder.stacks.symbolize(rows[0].stack)
    assert (__file__, "step", line) in frames
    # Labeled as DDP gradient buckets; the recorded stack starts on torch's side of the hook
    # (flightrec's own frame is not where the program was; in a Python traceback the hook's
    # name says what it is).
    assert all(r.flags & DDP_BUCKET for r in rows)
    assert "ddp_allreduce_passthrough_recorded_by_flightrec" not in [f[1] for f in frames]
    assert "/torch/" in frames[0][0]
    dist.all_reduce(torch.ones(1))
    assert not decode(rt.recorder.ring.snapshot())[-1].flags & DDP_BUCKET
    # The hook keeps DDP's semantics: the gradient is the mean over ranks (here, of one).
    step(plain)
    step(plain)
    assert torch.equal(plain.weight.grad, model.module.weight.grad)


def test_a_users_own_hook_is_kept(rt: Runtime) -> None:
    calls: list[int] = []

    def mine(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls.append(1)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    mine.__annotations__ = {}  # DDP rejects string annotations (from __future__ import)
    model = DDP(nn.Linear(4, 3))
    model.register_comm_hook(None, mine)  # would raise if flightrec had registered one already
    step(model)
    assert calls == [1]
    assert decode(rt.recorder.ring.snapshot()) == []


def test_with_the_hook_off_ddp_keeps_its_own_and_the_dump_labels_buckets(
    tmp_path: Path,
) -> None:
    """FLIGHTREC_DDP_HOOK=0: DDP keeps its C++ hook; PyTorch's recorder sees the reducer's
    all-reduces, and the merged dump says which entries are buckets."""
    from flightrec.format import flightrec_pb2 as pb
    from flightrec.format.read import read_dump

    with (
        one_rank_gloo(),
        traced_runtime(tmp_path, buffer=64, background=True, native=True, ddp_hook=False) as rt,
    ):
        since = time.monotonic_ns()  # torch's ring is the process's: earlier tests' show too
        model = DDP(nn.Linear(4, 3))
        line = step(model)
        step(model)
        assert decode(rt.recorder.ring.snapshot()) == []  # nothing went through a hook of ours
        mine = model.process_group.group_name if model.process_group else ""
        dist.all_reduce(torch.ones(1))  # issued from Python: no bucket
        path = rt.dump(pb.API_CALL)
    assert path is not None
    dump = read_dump(path)
    e = dump.entries
    ours = [
        i
        for i, g in enumerate(e.group)
        if e.enqueue_ns[i] > since and (not mine or dump.groups[g].name == mine)
    ]
    # DDP's own broadcasts (module states, buffers) are no buckets; nor is a Python call.
    reduces = [i for i in ours if dump.strings[e.op[i]] == "all_reduce"]
    assert [bool(e.flags[i] & pb.DDP_BUCKET) for i in reduces] == [True, True, False]
    assert not any(e.flags[i] & pb.DDP_BUCKET for i in ours if i not in reduces)
    frames = [dump.frames[f] for f in dump.stacks[e.stack[reduces[0]]].frames]
    where = [(dump.strings[f.file], dump.strings[f.name], f.line) for f in frames]
    assert (__file__, "step", line) in where, where
