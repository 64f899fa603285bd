"""The C hot path reads a tensor's shape and dtype from torch's memory (hotpath/layout.py):
only where it agrees with torch's getters, and never for tensors whose sizes live elsewhere."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from flightrec.format.slot import decode  # noqa: E402
from flightrec.recorder.hooks import codegen  # noqa: E402
from flightrec.recorder.hotpath import layout  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.gloo import traced_runtime  # noqa: E402

pytestmark = pytest.mark.skipif(
    codegen._fast is None, reason="C hot path not built (python setup.py build_ext --inplace)"
)


@pytest.fixture
def rt(pg: None, tmp_path: Path) -> Iterator[Runtime]:
    with traced_runtime(tmp_path, buffer=64) as runtime:
        dist.all_reduce(torch.ones(1))  # the first recorded call installs the layout
        yield runtime


def fast(rt: Runtime) -> Any:
    return rt.recorder._fast_path


def recorded(rt: Runtime, t: Any) -> Any:
    """What the C path records for ``t`` (all_reduce: inputs are its signature), also where
    gloo then refuses the dtype (the entry is written before torch's call, and failed)."""
    got = []
    for _ in range(2):  # a miss fills the caches (torch's getters), then a hit
        try:
            dist.all_reduce(t)
        except RuntimeError as exc:
            assert "scalar type" in str(exc)
        got.append(rt.recorder.tensors.values[decode(rt.recorder.ring.snapshot())[-1].inputs])
    assert got[0] == got[1]
    return got[1]


def kinds() -> list[tuple[str, Any, bool]]:
    """(name, tensor, read from memory): every kind a collective may be handed."""
    base = torch.arange(60.0).reshape(6, 10)
    grad = torch.zeros(4, 5, requires_grad=True)
    out: list[tuple[str, Any, bool]] = [
        ("0-d", torch.tensor(3.0), True),
        ("empty", torch.empty(0, 3), True),
        ("5-d", torch.zeros(1, 2, 3, 4, 5), True),
        ("6-d", torch.zeros(1, 2, 1, 2, 1, 2), False),
        ("transposed", base.t(), True),
        ("strided slice", base[1:5, ::3], True),
        ("expanded", base[0].expand(4, 10), True),
        ("view", base.view(2, 3, 10), True),
        ("needs grad", grad, True),
        ("grad's view", grad[1:], True),
        ("conjugate view", torch.zeros(3, dtype=torch.complex64).conj(), True),
        ("large sizes", torch.empty(0, 2**40, 2**20), True),
        ("parameter (a subclass)", torch.nn.Parameter(torch.zeros(3)), False),
        ("sparse", torch.zeros(4, 4).to_sparse(), False),
        ("meta", torch.empty(3, 4, device="meta"), False),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    out.append(("nested", nested, False))
    for name in ("float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64",
                 "bool", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn"):  # fmt: skip
        dt = getattr(torch, name, None)
        if dt is not None:
            out.append((name, torch.zeros(2, 3, dtype=dt), True))
    return out


def test_this_torch_has_a_layout_and_the_recorder_uses_it(rt: Runtime) -> None:
    found = layout.calibrate()
    assert found is not None
    assert fast(rt).raw_on and fast(rt).raw_key_sets >= 1
    assert fast(rt).raw_spec(torch.ones(2, 3)) == ((2, 3), torch.float32)


@pytest.mark.parametrize(("name", "t", "read"), kinds(), ids=[k[0] for k in kinds()])
def test_memory_agrees_with_torch_on_every_kind_of_tensor(
    rt: Runtime, name: str, t: Any, read: bool
) -> None:
    got = fast(rt).raw_spec(t)
    assert got == ((tuple(t.shape), t.dtype) if read else None), name
    if not (t.is_sparse or t.is_nested or t.is_meta or t.is_conj()):  # what gloo takes
        assert recorded(rt, t.detach().clone() if t.requires_grad else t) == (
            (tuple(t.shape), str(t.dtype).removeprefix("torch.")),
        )
    assert fast(rt).raw_on, "every kind agreed: the path stays on"


def test_changes_in_place_are_read_at_every_call(rt: Runtime) -> None:
    t = torch.ones(2)
    seen = [recorded(rt, t)]
    t.data = torch.ones(2, dtype=torch.float64)  # no version bump, same object
    seen.append(recorded(rt, t))
    t.data = torch.ones(3, dtype=torch.float64)
    seen.append(recorded(rt, t))
    t.resize_(2, 3)
    seen.append(recorded(rt, t))
    t.resize_(3, 2)
    seen.append(recorded(rt, t))
    t.unsqueeze_(0)
    seen.append(recorded(rt, t))
    t.resize_(1, 1, 1, 1, 1, 7)  # more than the inline sizes: torch's getters
    seen.append(recorded(rt, t))
    assert seen == [
        (((2,), "float32"),), (((2,), "float64"),), (((3,), "float64"),),
        (((2, 3), "float64"),), (((3, 2), "float64"),), (((1, 3, 2), "float64"),),
        (((1, 1, 1, 1, 1, 7), "float64"),),
    ]  # fmt: skip
    assert fast(rt).raw_on


def test_an_attribute_set_on_torch_tensor_keeps_the_path(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Libraries set attributes on torch.Tensor (its version tag moves): the getters are still
    # torch's, so reading goes on.
    monkeypatch.setattr(torch.Tensor, "_flightrec_test_attr", 1, raising=False)
    assert fast(rt).raw_spec(torch.ones(4)) == ((4,), torch.float32)


def test_a_replaced_shape_getter_is_honoured(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.ones(4)
    monkeypatch.setattr(torch.Tensor, "shape", property(lambda self: torch.Size([9])))
    assert fast(rt).raw_spec(t) is None
    assert recorded(rt, t) == (((9,), "float32"),)  # what the Python path records too
    monkeypatch.undo()
    assert fast(rt).raw_spec(t) == ((4,), torch.float32)  # torch's getter is back
    assert recorded(rt, t) == (((4,), "float32"),)


def test_a_layout_that_disagrees_turns_the_path_off(rt: Runtime) -> None:
    # Offsets that are wrong for this torch (the strides where the sizes are) are caught at
    # the first tensor of a key set, read both ways; the recording stays right.
    found = layout.calibrate()
    assert found is not None
    f = fast(rt)
    wrong = found.ndim + 8 * 6  # inside the strides (a 1-d tensor: count 1 would match)
    f.set_layout(torch.Tensor, found.impl, wrong, found.dtype, found.keys, found.allowed,
                 found.dtypes)  # fmt: skip
    assert f.raw_on
    t = torch.ones(2, 3)
    assert f.raw_spec(t) is None
    assert not f.raw_on
    assert recorded(rt, t) == (((2, 3), "float32"),)


class _Wrapped(torch.Tensor):
    pass


class _WrapEverything(torch.overrides.TorchFunctionMode):
    """A mode whose tensors are not plain ones, as under FakeTensorMode or a tracer."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        return out.as_subclass(_Wrapped) if type(out) is torch.Tensor else out


def test_no_layout_is_found_under_a_mode_that_changes_tensors() -> None:
    # The first recorded call may come while such a mode is active: probes made there are no
    # evidence of where a plain tensor keeps its fields.
    with _WrapEverything():
        assert layout.calibrate() is None
    assert layout.calibrate() is not None


def test_set_layout_refuses_offsets_out_of_range(rt: Runtime) -> None:
    f = fast(rt)
    for args in ((8, 56, 160, 168), (16, 190, 160, 168), (16, 56, 161, 168), (16, 56, 160, 4096)):
        with pytest.raises(ValueError, match="offset out of range"):
            f.set_layout(torch.Tensor, *args, 0, {})
        assert not f.raw_on
    with pytest.raises(ValueError, match="dtype index"):
        f.set_layout(torch.Tensor, 16, 56, 160, 168, 0, {300: torch.float32})


def test_switched_off_it_stays_on_torchs_getters(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "USE_LAYOUT", False)
    fast(rt).clear_layout()
    assert not layout.install(fast(rt)) and not fast(rt).raw_on
    assert fast(rt).raw_spec(torch.ones(2)) is None
    assert recorded(rt, torch.ones(2)) == (((2,), "float32"),)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_read_from_memory_after_one_check(rt: Runtime) -> None:
    f = fast(rt)
    before = f.raw_key_sets
    for t in (
        torch.zeros(3, 5, device="cuda"),
        torch.zeros(2, dtype=torch.bfloat16, device="cuda"),
    ):
        assert f.raw_spec(t) == (tuple(t.shape), t.dtype)
    assert f.raw_key_sets == before + 1 and f.raw_on
