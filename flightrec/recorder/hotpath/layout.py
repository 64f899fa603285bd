"""Where this torch keeps a tensor's shape, dtype and dispatch keys, found by asking it.

torch's ``Tensor.shape`` and ``Tensor.dtype`` getters build a ``torch.Size`` and run
torch-function checks and an error handler at every call: about three quarters of the C hot
path's own instructions per recorded call (``bench_recorder.py --instructions``). The C path
(``_fast.c``, ``Layout``) can read the same fields from torch's objects instead, once it knows
their offsets. They are not a published ABI, so they are never assumed: at start-up this module
creates probe tensors of many shapes, dtypes and kinds, reads their memory, and keeps an offset
only where exactly one candidate agrees with torch's own answer for every probe. Then the C
path's own reading of every probe is compared with the getters once more. Any doubt (no
candidate, two candidates, a probe that disagrees, an exception) leaves the C path on the
getters, as before; it costs nothing but speed.

At run time the C path reads memory only for tensors whose type is exactly ``torch.Tensor``
(with torch's getters), whose dispatch keys hold only ``ALLOWED`` bits and whose key set was
read both ways and agreed at its first tensor; see ``_fast.c``.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import warnings
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("flightrec")

USE_LAYOUT = True
"""Whether the C hot path may read tensors' fields from memory (tests switch it off to cover
torch's getters)."""

SPAN = 192
"""Bytes of a TensorImpl searched and read (``_fast.c``: RAW_SPAN). torch 2.x's TensorImpl is
176 bytes or more, and an allocator rounds a block up to at least 16, so reading this far never
leaves the block's memory."""
MAX_DIMS = 5
"""Sizes a TensorImpl keeps inline (c10 SizesAndStrides); a tensor with more takes the getters."""
ALLOWED = (
    "CPU", "CUDA", "XPU", "HIP", "AutogradCPU", "AutogradCUDA", "AutogradXPU", "AutogradHIP",
    "ADInplaceOrView", "AutocastCPU", "AutocastCUDA", "AutocastXPU", "Conjugate", "Negative",
)  # fmt: skip
"""Dispatch keys a tensor read from memory may carry: dense tensors on CPU or a GPU with
autograd, autocast and lazy conjugate or negative views. Sparse, nested, Python-dispatched,
functionalized, batched, lazy (XLA) and meta tensors carry other keys and take the getters."""
SHAPES = ((), (7,), (1237, 3), (5, 89, 2), (3, 1, 4, 1, 5), (2, 3, 2, 3, 2, 3), (0, 4))
COMMON = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


@dataclass(frozen=True)
class Layout:
    """Offsets: Python object -> at::Tensor's TensorImpl pointer; TensorImpl -> dimension count
    (the sizes follow it), TypeMeta index (uint16), DispatchKeySet (uint64)."""

    impl: int
    ndim: int
    dtype: int
    keys: int
    allowed: int
    dtypes: dict[int, Any]


def install(fast: Any) -> bool:
    """Calibrate and hand the layout to the C path ``fast``; False where it stays on torch's
    getters (never raises: the recorder must not fail because of this). Called at the first
    recorded call, when torch is fully imported (the recorder's hooks are installed while
    ``torch.distributed`` is still importing)."""
    why = install_why_not(fast)
    if why is not None:
        log.debug("flightrec: tensor layout not used (%s)", why)
    return why is None


def install_why_not(fast: Any) -> str | None:
    """``install``, saying why not: None where ``fast`` now reads tensors from memory, else
    the reason it stays on torch's getters, in a few words (``flightrec doctor`` shows it)."""
    if not USE_LAYOUT:
        return "switched off (layout.USE_LAYOUT)"
    if not hasattr(_torch()._C.DispatchKeySet, "raw_repr"):
        return "this torch's DispatchKeySet has no raw_repr (its dispatch keys cannot be read)"
    try:
        probes = _probes()
        found = _calibrate(probes)
        if isinstance(found, str):
            return found
        fast.set_layout(
            _torch().Tensor, found.impl, found.ndim, found.dtype, found.keys, found.allowed,
            found.dtypes,
        )  # fmt: skip
        agree = all(fast.raw_spec(t) in (None, (tuple(t.shape), t.dtype)) for t in probes)
        if not (agree and fast.raw_on):
            fast.clear_layout()
            return "the C path's reading of the probe tensors disagreed with torch's getters"
        return None
    except Exception as exc:  # anything here only means "use the getters"
        return f"{type(exc).__name__}: {exc}"


def calibrate(probes: list[Any] | None = None) -> Layout | None:
    """The offsets where every probe (``_probes()`` unless given) agrees with torch at exactly
    one place, else None."""
    found = _calibrate(_probes() if probes is None else probes)
    return None if isinstance(found, str) else found


def _calibrate(probes: list[Any]) -> Layout | str:
    """``calibrate``, or why there is no layout."""
    torch = _torch()
    typed = _typed_probes()
    if any(type(t) is not torch.Tensor for t in (*probes, *typed)):
        # A mode (FakeTensorMode, a TorchFunctionMode) made the probes: no answer.
        return "the probe tensors are not plain torch.Tensor (a tensor mode is active)"
    basic = torch.Tensor.__basicsize__
    heads = [ctypes.string_at(id(t), basic) for t in probes]
    impls = [ctypes.string_at(t._cdata, SPAN) for t in probes]
    impl = _only(
        o for o in range(16, basic - 7, 8)
        if all(_u64(h, o) == t._cdata for h, t in zip(heads, probes, strict=True))
    )  # fmt: skip
    ndim = _only(
        o for o in range(0, SPAN - 8 * (MAX_DIMS + 1) + 1, 8)
        if all(_dims_at(m, o, tuple(t.shape)) for m, t in zip(impls, probes, strict=True))
    )  # fmt: skip
    keys_of = [torch._C._dispatch_keys(t).raw_repr() for t in probes]
    keys = _only(
        o for o in range(0, SPAN - 7, 8)
        if all(_u64(m, o) == k for m, k in zip(impls, keys_of, strict=True))
    )  # fmt: skip
    typed_impls = [ctypes.string_at(t._cdata, SPAN) for t in typed]
    dtype = _only(
        o for o in range(0, SPAN - 1, 2) if _one_to_one(typed_impls, typed, probes, impls, o)
    )
    unknown = [
        name
        for name, offset in (("tensor", impl), ("sizes", ndim), ("dispatch keys", keys),
                             ("dtype", dtype))
        if offset is None
    ]  # fmt: skip
    if impl is None or ndim is None or keys is None or dtype is None:
        return "no single offset agrees with torch for: " + ", ".join(unknown)
    dtypes = {
        struct.unpack_from("<H", m, dtype)[0]: t.dtype
        for m, t in zip(typed_impls, typed, strict=True)
    }
    return Layout(impl, ndim, dtype, keys, _allowed(torch), dtypes)


def _torch() -> Any:
    import torch

    return torch


def _probes() -> list[Any]:
    """CPU tensors of several shapes (0 to 6 dimensions, empty ones), dtypes and kinds: views,
    non-contiguous, expanded, needing grad, conjugate and negative views, a meta tensor."""
    torch = _torch()
    out = []
    for name in COMMON:
        dt = getattr(torch, name)
        out += [torch.empty(s, dtype=dt) for s in SHAPES]
    base = torch.zeros(6, 10)
    out += [
        base.t(), base[1:4, ::3], base[0].expand(3, 10), base.view(2, 3, 10),
        torch.zeros(4, 5, requires_grad=True), torch.zeros(3, dtype=torch.complex64).conj(),
        torch.zeros(3, dtype=torch.complex64).conj().imag, torch.empty(9, 2, device="meta"),
        torch.zeros(3, dtype=torch.complex64)._neg_view(),
    ]  # fmt: skip
    return out


def _typed_probes() -> list[Any]:
    """One meta tensor per dtype torch has (meta: nothing allocated, no warnings)."""
    torch = _torch()
    seen, out = set(), []
    for name in sorted(dir(torch)):
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype) and dt not in seen:
            seen.add(dt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    out.append(torch.empty(2, dtype=dt, device="meta"))
                except Exception:  # a dtype torch cannot allocate is just skipped
                    continue
    return out


def _allowed(torch: Any) -> int:
    mask = 0
    for name in ALLOWED:
        key = getattr(torch._C.DispatchKey, name, None)
        if key is not None:
            mask |= torch._C.DispatchKeySet(key).raw_repr()
    return mask


def _only(candidates: Any) -> int | None:
    found = list(candidates)
    return found[0] if len(found) == 1 else None


def _u64(memory: bytes, offset: int) -> int:
    return int(struct.unpack_from("<Q", memory, offset)[0])


def _dims_at(memory: bytes, offset: int, shape: tuple[int, ...]) -> bool:
    """The dimension count at ``offset`` and, for inline shapes, the sizes after it."""
    if struct.unpack_from("<q", memory, offset)[0] != len(shape):
        return False
    n = len(shape)
    return n > MAX_DIMS or struct.unpack_from(f"<{n}q", memory, offset + 8) == shape


def _one_to_one(typed_impls: list[bytes], typed: list[Any], probes: list[Any],
                impls: list[bytes], offset: int) -> bool:  # fmt: skip
    """The uint16 at ``offset`` names the dtype: one value per dtype, the same across shapes,
    devices and kinds."""
    by_value: dict[int, Any] = {}
    by_dtype: dict[Any, int] = {}
    for m, t in [*zip(typed_impls, typed, strict=True), *zip(impls, probes, strict=True)]:
        v = struct.unpack_from("<H", m, offset)[0]
        if by_value.setdefault(v, t.dtype) != t.dtype or by_dtype.setdefault(t.dtype, v) != v:
            return False
    return True
