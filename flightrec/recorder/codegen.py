"""The hot path, generated: one wrapper per traced function, with that function's signature.

Recording a call must stay within a few microseconds (issue target: 3 µs with 16-frame
stacks on a ~26 µs gloo call), which is roughly thirty Python operations. A generic
``wrapper(*args, **kwargs)`` spends most of that on argument lookup and helper calls, so each
wrapper is generated from the installed torch's own signature (like ``collections.namedtuple``
and ``dataclasses`` do): Python binds the arguments in C, what does not apply to an operation
(reduce op, root, P2P counters) is left out at generation time, and only cache misses call
into the recorder. Defaults are the original's own objects, so behaviour is unchanged.

Any error while recording (a caller passing something torch itself would reject, say) falls
back to the plain call, so torch raises its own error, never one of ours.

Where the optional C extension ``_fast`` is built, collectives whose tensor arguments are single
tensors (all_reduce, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor, barrier,
the object collectives, ...) are a C ``Site`` instead: it binds the arguments it needs from the
call itself, records on cache hits, and forwards the call to torch untouched, with no Python
frame of its own. Measured around a real gloo call, the generated Python costs about three
times its tight-loop cost (see benchmarks/bench_recorder.py), so what counts is how few
instructions run, not how cheap each is. On any miss, or a call it cannot bind plainly, the
Site hands the call to the generated Python wrapper before consuming anything; that wrapper
records exactly as without the extension, and fills the caches the C code reads.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from flightrec.format.builder import SEND

try:
    from flightrec.recorder import _fast
except ImportError:  # not built (no compiler at install, big-endian host): pure Python
    _fast = None  # type: ignore[assignment]
from flightrec.format.slot import COMPLETED, DONE, ENQUEUED, OFF_COMPLETE, RID, SLOT, SLOT_SIZE
from flightrec.recorder.specs import OpSpec, Param

if TYPE_CHECKING:
    from flightrec.recorder.recorder import Recorder

# Argument names that always hold exactly one tensor; every other tensor argument goes
# through the generic signature path (lists, nested lists, None on non-root ranks).
SINGLE_TENSOR = frozenset({"tensor", "input_tensor", "output_tensor", "input", "output"})

USE_FAST = _fast is not None
"""Whether new wrappers use the C hot path (tests switch it off to cover the Python path)."""

_TEMPLATE = """\
def {name}({params}):
    _tid = _ident()
    if not _rec.enabled or _tid in _active:
        return _orig({call})
    try:
        _info = _by_pg.get({group}) or _rec.group_slow({group})
        if _info is None:
            raise _NotRecorded
        _t0 = _now()
{tensors}
{order}
        _thread = _threads.get(_tid)
        if _thread is None:
            _thread = _rec.thread_index(_tid)
{stack_lines}
        _rid = _next_id()
        _off = ((_rid - 1) % _capacity) * _SIZE
        _pack(_buf, _off, _rid, _t0, 0, ENQUEUED, _seq, _p2p, _info.index, _OP, {red_index}, {peer},
              _thread, _stk, _in, _out, _dev, {flags}, _rid)
        _active[_tid] = _rid
    except Exception:
        # Not recorded (no default group yet, a rank outside the group, or arguments torch
        # will reject): torch runs, once, and raises its own error if there is one.
        _info = None
        _active.pop(_tid, None)
    if _info is None:
        return _orig({call})
    try:
        _result = _orig({call})
    except BaseException as _exc:
        _rec.fail(_rid, _exc)
        raise
    del _active[_tid]
    if {is_async} or _info.gpu:
        _rec.settle(_rid, _result, {is_async}, _info)
    elif _rid_at(_buf, _off)[0] == _rid:  # not yet overwritten by other threads' entries
        _done(_buf, _off + OFF_COMPLETE, _now(), COMPLETED)
    return _result
"""


class _NotRecorded(Exception):
    """Raised inside a generated wrapper to take the plain-call path."""


_STACK = """\
        _f = _getframe(1)
        _tc = _tcaches.get(_tid)
        if _tc is not None and _tc.top is _f and _tc.top_lasti == _f.f_lasti:
            _stk = _tc.top_index  # same caller at the same line as last time: same stack
        else:
            _stk = _capture(_f, _tid)
        del _f"""


def _tensor_lines(spec: OpSpec, names: set[str]) -> str:
    """Code that sets ``_in``, ``_out`` (signature indices) and ``_dev`` (device index)."""
    ind = " " * 8
    inp = spec.inputs.name if spec.inputs.name in names else ""
    out = spec.outputs.name if spec.outputs.name in names else ""
    lines: list[str] = []

    def single(var: str, arg: str) -> None:
        lines.append(f"{ind}{var} = _info.specs.get(({arg}.shape, {arg}.dtype))")
        lines.append(f"{ind}if {var} is None:")
        lines.append(f"{ind}    {var} = _rec.spec_slow(_info, {arg})")

    if inp and inp == out and inp in SINGLE_TENSOR:
        single("_s", inp)
        lines.append(f"{ind}_in = _out = _s[0]")
        lines.append(f"{ind}_dev = _s[1]")
        return "\n".join(lines)
    dev_args: list[str] = []
    for var, arg in (("_in", inp), ("_out", out)):
        if not arg:
            lines.append(f"{ind}{var} = 0")
        elif arg in SINGLE_TENSOR:
            single(f"{var}_s", arg)
            lines.append(f"{ind}{var} = {var}_s[0]")
            dev_args.append(f"{var}_s[1]")
        else:
            lines.append(f"{ind}{var} = _rec.sig({arg})")
            dev_args.append(f"_rec.device({arg})")
    lines.append(f"{ind}_dev = {dev_args[0] if dev_args else '0'}")
    if len(dev_args) == 2 and not dev_args[0].endswith("[1]"):
        # the input may be an empty or absent list (gather on a non-root): try the output
        lines[-1] = f"{ind}_dev = {dev_args[0]} or {dev_args[1]}"
    return "\n".join(lines)


def _order_lines(spec: OpSpec, names: set[str]) -> tuple[str, str]:
    """Code setting ``_seq``/``_p2p`` (and ``_peer`` where there is one); returns (code, peer)."""
    ind = " " * 8
    lines: list[str] = []
    root = spec.root.name if spec.root.name in names else ""
    group_root = spec.group_root.name if spec.group_root.name in names else ""
    peer = "-1"
    if root or group_root:
        peer = "_peer"
        lines.append(f"{ind}_peer = {root or 'None'}")
        lines.append(f"{ind}if _peer is None:")
        g = group_root or "None"
        lines.append(
            f"{ind}    _peer = _info.ranks[{g}] if {g} is not None and 0 <= {g} < len(_info.ranks) else -1"
        )
    if spec.p2p:
        lines.append(f"{ind}_seq = 0")
        lines.append(f"{ind}_p2p = _info.next_p2p({peer}, {bool(spec.flags & SEND)})")
    else:
        # The counter is atomic; the high-water mark is only raised, so a thread preempted
        # between the two cannot set it back below a number another thread already issued.
        lines.append(f"{ind}_seq = _next(_info.counter)")
        lines.append(f"{ind}if _seq > _info.seq:")
        lines.append(f"{ind}    _info.seq = _seq")
        lines.append(f"{ind}_p2p = 0")
    return "\n".join(lines), peer


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
    rec: Recorder,
) -> Callable[..., Any] | None:
    """The C ``Site`` in front of ``python`` (the generated wrapper), or None where only the
    Python path applies.

    The C code handles what repeats in training loops: collectives on single tensors. P2P
    (per-peer counters under a lock), tensor lists and exotic signatures stay in Python.
    """
    if not USE_FAST or _fast is None or spec.p2p or spec.always_async:
        return None
    params = list(sig.parameters.values())
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
    fast = _fast_path(rec)
    return _fast.Site(
        fast=fast,
        orig=orig,
        fallback=python,
        names=tuple(names),
        required=required,
        defaults=tuple(p.default for p in params[required:]),
        where=tuple(where),
        op=rec.op_index(spec.name),
        flags=spec.flags,
    )


def _fast_path(rec: Recorder) -> Any:
    """The recorder's one C ``FastPath`` (shared by its Sites, so that their stack caches are
    one, purged with the StackTable's at every watchdog tick)."""
    fast = getattr(rec, "_fast_path", None)
    if fast is None:
        assert _fast is not None
        fast = _fast.FastPath(
            recorder=rec,
            by_pg=rec.groups.by_pg,
            active=rec.active,
            threads=rec.thread_cache,
            tcaches=rec.stacks.threads,
            reds=rec.strings.index,
            ids=rec.ring.ids,
            capture=rec.stacks.capture,
            buffer=rec.ring.buffer,
            capacity=rec.ring.capacity,
            depth=rec.depth,
        )
        fast.enabled = int(rec.enabled)
        rec._fast_path = fast
        rec.stacks.purgers.append(fast.purge)
    return fast


def generate(spec: OpSpec, orig: Callable[..., Any], rec: Recorder) -> Callable[..., Any]:
    """The recording wrapper of ``orig`` (a torch.distributed function described by ``spec``)."""
    sig = inspect.signature(orig)
    names = set(sig.parameters)
    env: dict[str, Any] = {
        "_orig": orig,
        "_rec": rec,
        "_ident": threading.get_ident,
        "_now": time.monotonic_ns,
        "_getframe": sys._getframe,
        "_active": rec.active,
        "_by_pg": rec.groups.by_pg,
        "_threads": rec.thread_cache,
        "_next": next,
        "_next_id": rec.ring.ids.__next__,
        "_capacity": rec.ring.capacity,
        "_SIZE": SLOT_SIZE,
        "_buf": rec.ring.buffer,
        "_pack": SLOT.pack_into,
        "_rid_at": RID.unpack_from,
        "_done": DONE.pack_into,
        "OFF_COMPLETE": OFF_COMPLETE,
        "_NotRecorded": _NotRecorded,
        "_capture": rec.stacks.capture,
        "_tcaches": rec.stacks.threads,
        "_reds": rec.strings.index,
        "_OP": rec.op_index(spec.name),
        "ENQUEUED": ENQUEUED,
        "COMPLETED": COMPLETED,
    }
    params, call = _signature_text(sig, env)

    def arg(param: Param) -> str:
        return param.name if param.name in names else "None"

    is_async = "True" if spec.always_async else arg(spec.async_op)
    order, peer = _order_lines(spec, names)
    red = arg(spec.reduce_op)
    red_index = "0" if red == "None" else f"(_reds.get({red}) or _rec.red_slow({red}))"
    flags = str(spec.flags | (1 if spec.always_async else 0))
    if not spec.always_async and is_async != "None":
        flags = f"{spec.flags} | (1 if {is_async} else 0)"
    source = _TEMPLATE.format(
        name=spec.name,
        params=params,
        call=call,
        group=arg(spec.group),
        tensors=_tensor_lines(spec, names),
        order=order,
        red_index=red_index,
        peer=peer,
        stack_lines=_STACK if rec.depth else "        _stk = 0",
        flags=flags,
        is_async=is_async,
    )
    code = compile(source, f"<flightrec wrapper of {spec.name}>", "exec")
    exec(code, env)  # our template over the installed torch's own signature
    python = cast(Callable[..., Any], env[spec.name])
    return _site(spec, sig, orig, python, rec) or python
