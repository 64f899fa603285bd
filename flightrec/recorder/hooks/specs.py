"""What each traced torch.distributed function takes: which argument is the group, the
tensors, the reduce op, the root or peer, and whether the call is asynchronous.

Parameter names are checked against the installed torch's own signatures when tracing starts
(``codegen.py`` builds each wrapper from that signature), so a parameter torch renames or
drops is simply not recorded rather than breaking the call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flightrec.format.builder import COALESCED, IS_P2P, OBJECT_API, SEND


@dataclass(frozen=True, slots=True)
class Param:
    """Where one argument is: its position, its keyword name, and its default."""

    pos: int
    name: str
    default: Any = None


NO_PARAM = Param(1 << 30, "", None)


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How to read one traced function's arguments."""

    name: str
    """Operation name recorded in the ring ("all_reduce", "send", ...)."""
    group: Param = NO_PARAM
    inputs: Param = NO_PARAM
    outputs: Param = NO_PARAM
    reduce_op: Param = NO_PARAM
    root: Param = NO_PARAM
    """Root, source or destination given as a global rank."""
    group_root: Param = NO_PARAM
    """The same given as a rank within the group (``group_src``/``group_dst``)."""
    async_op: Param = NO_PARAM
    always_async: bool = False
    """isend/irecv: the call returns a Work whatever the arguments."""
    flags: int = 0
    """EntryFlag bits every entry of this op carries."""
    input_splits: Param = NO_PARAM
    output_splits: Param = NO_PARAM
    """all_to_all_single: the split sizes (first-dimension rows per peer, in group-rank
    order). Where given, the entry records one tensor per peer, as ``all_to_all`` does, so the
    analysis can check what each rank sends against what its peer receives."""

    @property
    def p2p(self) -> bool:
        """A point-to-point operation (matched by peer and p2p_seq)."""
        return bool(self.flags & IS_P2P)

    @property
    def send(self) -> bool:
        """With ``p2p``: this rank sends."""
        return bool(self.flags & SEND)


# name: (inputs, outputs, reduce op, root (global), root (group), flags)
_TABLE: dict[str, tuple[str, str, str, str, str, int]] = {
    "all_reduce": ("tensor", "tensor", "op", "", "", 0),
    "all_reduce_coalesced": ("tensors", "tensors", "op", "", "", COALESCED),
    "all_gather": ("tensor", "tensor_list", "", "", "", 0),
    "all_gather_coalesced": ("input_tensor_list", "output_tensor_lists", "", "", "", COALESCED),
    "all_gather_into_tensor": ("input_tensor", "output_tensor", "", "", "", 0),
    "all_gather_single": ("input_tensor", "output_tensor", "", "", "", 0),
    "_all_gather_base": ("input_tensor", "output_tensor", "", "", "", 0),
    "all_gather_object": ("", "", "", "", "", OBJECT_API),
    "reduce_scatter": ("input_list", "output", "op", "", "", 0),
    "reduce_scatter_tensor": ("input", "output", "op", "", "", 0),
    "reduce_scatter_single": ("input", "output", "op", "", "", 0),
    "_reduce_scatter_base": ("input", "output", "op", "", "", 0),
    "all_to_all": ("input_tensor_list", "output_tensor_list", "", "", "", 0),
    "all_to_all_single": ("input", "output", "", "", "", 0),
    "broadcast": ("tensor", "tensor", "", "src", "group_src", 0),
    "broadcast_object_list": ("", "", "", "src", "group_src", OBJECT_API),
    "reduce": ("tensor", "tensor", "op", "dst", "group_dst", 0),
    "gather": ("tensor", "gather_list", "", "dst", "group_dst", 0),
    "gather_single": ("tensor", "gather_tensor", "", "dst", "group_dst", 0),
    "gather_into_tensor": ("tensor", "gather_tensor", "", "dst", "group_dst", 0),
    "gather_object": ("", "", "", "dst", "group_dst", OBJECT_API),
    "scatter": ("scatter_list", "tensor", "", "src", "group_src", 0),
    "scatter_object_list": ("", "", "", "src", "group_src", OBJECT_API),
    "barrier": ("", "", "", "", "", 0),
    "monitored_barrier": ("", "", "", "", "", 0),
    "send": ("tensor", "", "", "dst", "group_dst", IS_P2P | SEND),
    "isend": ("tensor", "", "", "dst", "group_dst", IS_P2P | SEND),
    "send_object_list": ("", "", "", "dst", "group_dst", IS_P2P | SEND | OBJECT_API),
    "recv": ("", "tensor", "", "src", "group_src", IS_P2P),
    "irecv": ("", "tensor", "", "src", "group_src", IS_P2P),
    "recv_object_list": ("", "", "", "src", "group_src", IS_P2P | OBJECT_API),
}
_SPLITS: dict[str, tuple[str, str]] = {
    "all_to_all_single": ("input_split_sizes", "output_split_sizes"),
}
BATCH = "batch_isend_irecv"
TRACED: tuple[str, ...] = (*_TABLE, BATCH)
"""Every function name the recorder wraps (those missing from the installed torch are skipped)."""


def _param(params: dict[str, inspect.Parameter], name: str) -> Param:
    if not name or name not in params:
        return NO_PARAM
    p = params[name]
    pos = list(params).index(name)
    if p.kind is inspect.Parameter.KEYWORD_ONLY:
        pos = NO_PARAM.pos
    default = None if p.default is inspect.Parameter.empty else p.default
    return Param(pos, name, default)


def spec_for(name: str, func: Callable[..., Any]) -> OpSpec:
    """The spec of ``func`` (the installed torch's ``distributed_c10d.<name>``)."""
    params = dict(inspect.signature(func).parameters)
    if name == BATCH:
        return OpSpec(BATCH, flags=IS_P2P | COALESCED, always_async=True)
    inputs, outputs, reduce_op, root, group_root, flags = _TABLE[name]
    split_in, split_out = _SPLITS.get(name, ("", ""))
    return OpSpec(
        name=name,
        group=_param(params, "group"),
        inputs=_param(params, inputs),
        outputs=_param(params, outputs),
        reduce_op=_param(params, reduce_op),
        root=_param(params, root),
        group_root=_param(params, group_root),
        async_op=_param(params, "async_op"),
        always_async=name in ("isend", "irecv"),
        flags=flags,
        input_splits=_param(params, split_in),
        output_splits=_param(params, split_out),
    )
