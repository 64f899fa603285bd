"""DDP models built while tracing: their gradient all-reduces are recorded, user hooks win."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from flightrec.recorder.config import Config  # noqa: E402
from flightrec.recorder.ring import COMPLETED, decode  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.jobs import free_port  # noqa: E402


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}",
        timeout=timedelta(seconds=20),
    )  # fmt: skip
    runtime = Runtime(Config(enabled=True, directory=str(tmp_path), timeout_s=3600, buffer=64))
    runtime.enable()
    runtime.start_background()
    yield runtime
    runtime.disable()
    dist.destroy_process_group()


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
    assert [r.seq for r in rows] == [1, 2] and all(r.state == COMPLETED for r in rows)
    assert rt.recorder.tensors.values[rows[0].inputs] == (((4 * 3 + 3,), "float32"),)
    frames = rt.recorder.stacks.symbolize(rows[0].stack)
    assert (__file__, "step", line) in frames
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
