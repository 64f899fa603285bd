"""The traced functions: one wrapper per torch.distributed function, with its own signature.

A generic ``wrapper(*args, **kwargs)`` spends more than the recording itself on argument
lookup, so each wrapper is generated from the installed torch's own signature (like
``collections.namedtuple`` and ``dataclasses`` do): Python binds the arguments in C, and the
wrapper hands the ones recording needs to the Python path's ``enter`` and ``leave``
(``hotpath/python.py``, where recording one call is defined). Defaults are the original's own
objects, so behaviour is unchanged. A call that is not recorded (tracing off, a call inside a
recorded one, arguments torch will reject) is the plain call, so torch raises its own errors.

Where the optional C extension ``_fast`` is built, collectives whose tensor arguments are single
tensors (all_reduce, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor, barrier,
the object collectives, ...) are a C ``Site`` in front of that wrapper: it binds the arguments
itself, records through the C ``enter``/``leave`` on cache hits, and forwards the call to
torch untouched, with no Python frame of its own. On any miss, or a call it cannot bind
plainly, the Site hands the call to the generated wrapper before consuming anything, which
records through the Python path and fills the caches the C code reads. Measured with the
user's harness (benchmarks/bench_recorder.py), the C path costs about 14 µs less per call.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

try:
    from flightrec.recorder.hotpath import _fast
except ImportError:  # not built (no compiler at install, big-endian host): pure Python
    _fast = None  # type: ignore[assignment]
from flightrec.format.builder import OBJECT_API
from flightrec.recorder.hooks.specs import OpSpec, Param
from flightrec.recorder.hotpath.python import split

if TYPE_CHECKING:
    from flightrec.recorder.hotpath.python import PyPath

# Argument names that always hold exactly one tensor: the C Site takes only these (lists,
# nested lists and None on non-root ranks go through the Python path).
SINGLE_TENSOR = frozenset({"tensor", "input_tensor", "output_tensor", "input", "output"})

USE_FAST = _fast is not None
"""Whether new wrappers use the C hot path (tests switch it off to cover the Python path)."""


class Target(Protocol):
    """What generating a wrapper takes from the recorder (``Recorder`` is one)."""

    @property
    def path(self) -> PyPath:
        """The Python path the wrapper records through (its ``state`` holds ``fail``)."""
        ...

    def op_index(self, name: str) -> int:
        """String index of an operation name."""
        ...

    def fast_path(self) -> Any:
        """The one C ``FastPath`` over the same state, shared by every Site."""
        ...

    def object_call_returned(self, group: Any) -> None:
        """An object collective on ``group`` returned (never raises)."""
        ...


_TEMPLATE = """\
def {name}({params}):
    _rid = _enter(_OP, {flags}, {group}, {tensor_in}, {tensor_out}, {red}, {root}, {group_root},
                  {is_async}, {frame})
    if _rid <= 0:
        return _orig({call})
    try:
        _result = _orig({call})
    except BaseException as _exc:
        _fail(_rid, _exc)
        raise
    _leave(_rid, _result, {is_async}, {group})
{after}    return _result
"""
"""Binds the arguments the way the installed torch does, then records through the Python
path (``hotpath.python``), the one definition of what an entry holds."""


def _signature_text(sig: inspect.Signature, env: dict[str, Any]) -> tuple[str, str]:
    """(parameter list, call argument list) reproducing ``sig`` exactly."""
    params: list[str] = []
    call: list[str] = []
    saw_star = False
    plist = list(sig.parameters.values())
    for i, p in enumerate(plist):
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, saw_star = f"*{p.name}", True
            call.append(text)
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}"
            call.append(text)
        elif p.kind is p.KEYWORD_ONLY:
            if not saw_star:
                params.append("*")
                saw_star = True
            call.append(f"{p.name}={p.name}")
        else:
            call.append(p.name)
        if p.default is not p.empty:
            env[f"_d_{p.name}"] = p.default
            text += f"=_d_{p.name}"
        params.append(text)
        last_positional_only = i + 1 == len(plist) or plist[i + 1].kind is not p.POSITIONAL_ONLY
        if p.kind is p.POSITIONAL_ONLY and last_positional_only:
            params.append("/")
    return ", ".join(params), ", ".join(call)


def _site(
    spec: OpSpec,
    sig: inspect.Signature,
    orig: Callable[..., Any],
    python: Callable[..., Any],
    rec: Target,
) -> Callable[..., Any] | None:
    """The C ``Site`` in front of ``python`` (the generated wrapper), or None where only the
    Python path applies.

    The C code handles what repeats in training loops: collectives on single tensors. P2P
    (per-peer counters under a lock), tensor lists and exotic signatures stay in Python.
    """
    if not USE_FAST or _fast is None or spec.p2p or spec.always_async:
        return None
    if spec.flags & OBJECT_API:  # slow calls anyway; the Python wrapper tells the recorder
        return None
    params = list(sig.parameters.values())
    if any(p.name in (spec.input_splits.name, spec.output_splits.name) for p in params):
        return None  # split sizes make per-peer chunks: the Python path records them
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        return None
    names = [p.name for p in params]
    for param in (spec.inputs, spec.outputs):
        if param.name in names and param.name not in SINGLE_TENSOR:
            return None
    required = 0
    while required < len(params) and params[required].default is params[required].empty:
        required += 1
    if any(p.default is p.empty for p in params[required:]):
        return None
    roles = (spec.group, spec.inputs, spec.outputs, spec.reduce_op, spec.root, spec.group_root)
    where = [names.index(r.name) if r.name in names else -1 for r in roles]
    where.append(names.index(spec.async_op.name) if spec.async_op.name in names else -1)
    return _fast.Site(
        fast=rec.fast_path(),
        orig=orig,
        fallback=python,
        names=tuple(names),
        required=required,
        defaults=tuple(p.default for p in params[required:]),
        where=tuple(where),
        op=rec.op_index(spec.name),
        flags=spec.flags,
    )


def generate(spec: OpSpec, orig: Callable[..., Any], rec: Target) -> Callable[..., Any]:
    """The recording wrapper of ``orig`` (a torch.distributed function described by ``spec``)."""
    sig = inspect.signature(orig)
    names = set(sig.parameters)
    path = rec.path
    env: dict[str, Any] = {
        "_orig": orig,
        "_enter": path.enter,
        "_leave": path.leave,
        "_fail": path.state.fail,
        "_getframe": sys._getframe,
        "_OP": rec.op_index(spec.name),
        "_split": split,
        "_returned": rec.object_call_returned,
    }
    params, call = _signature_text(sig, env)

    def arg(param: Param, absent: str = "None") -> str:
        return param.name if param.name in names else absent

    def tensors(param: Param, splits: Param) -> str:
        if param.name in names and splits.name in names:
            return f"_split({param.name}, {splits.name})"
        return arg(param, "0")

    is_async = "True" if spec.always_async else arg(spec.async_op, "False")
    source = _TEMPLATE.format(
        name=spec.name,
        params=params,
        call=call,
        flags=spec.flags,
        group=arg(spec.group),
        tensor_in=tensors(spec.inputs, spec.input_splits),
        tensor_out=tensors(spec.outputs, spec.output_splits),
        red=arg(spec.reduce_op, "0"),
        root=arg(spec.root),
        group_root=arg(spec.group_root),
        is_async=is_async,
        frame="_getframe(1)" if path.depth else "None",
        # torch ran collectives inside an object call that no hook recorded: the recorder
        # looks at torch's numbering right after it, at the same point on every rank.
        after=f"    _returned({arg(spec.group)})\n" if spec.flags & OBJECT_API else "",
    )
    code = compile(source, f"<flightrec wrapper of {spec.name}>", "exec")
    exec(code, env)  # our template over the installed torch's own signature
    python = cast(Callable[..., Any], env[spec.name])
    return _site(spec, sig, orig, python, rec) or python
