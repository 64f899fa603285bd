"""What two ranks must agree on when they issue the same collective: the compared fields.

Shared by the per-rank index (built in loader processes) and the mismatch pass, so that a
signature id computed while loading means exactly what the mismatch pass compares.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import itemgetter
from typing import TypeVar

from flightrec.analysis.model import CollectiveRecord, RankDump, TensorInfo
from flightrec.format import flightrec_pb2 as pb

_OBJECT_API = int(pb.OBJECT_API)
T = TypeVar("T")
# Ops whose tensor sizes legitimately differ between ranks.
_SIZES_MAY_DIFFER = ("all_to_all", "alltoall")


def compared_tensors(r: CollectiveRecord) -> tuple[TensorInfo, ...]:
    # scatter: only the root passes the input list; every rank receives the same-shaped output.
    if "scatter" in r.op and "reduce" not in r.op:
        return r.outputs
    return r.inputs


def _shape(r: CollectiveRecord) -> Hashable:
    if r.flags & pb.OBJECT_API or any(k in r.op for k in _SIZES_MAY_DIFFER):
        return None  # pickled payload sizes and split sizes differ by design
    return tuple(t.shape for t in compared_tensors(r))


def compared_outputs(r: CollectiveRecord) -> tuple[TensorInfo, ...] | None:
    """The output buffers every member must pass alike; None where they may differ.

    All-gather and reduce-scatter go wrong through their outputs (an ``all_gather_into_tensor``
    output sized for the wrong world size, a ``reduce_scatter_tensor`` output of the wrong
    chunk): on every member the output is the same shape. They legitimately differ for a
    gather (only the root passes a list), all-to-all (split sizes), the object API and P2P.
    A scatter's outputs are its compared tensors already.
    """
    op = r.op
    if r.flags & (pb.OBJECT_API | pb.IS_P2P) or any(k in op for k in _SIZES_MAY_DIFFER):
        return None
    if ("gather" in op and "all" not in op) or ("scatter" in op and "reduce" not in op):
        return None
    return r.outputs


def _output_dtype(r: CollectiveRecord) -> Hashable:
    outs = compared_outputs(r)
    return None if outs is None else tuple(t.dtype for t in outs)


def _output_shape(r: CollectiveRecord) -> Hashable:
    outs = compared_outputs(r)
    return None if outs is None else tuple(t.shape for t in outs)


NOT_SEEN = "?"
"""The tensors of a black box's ``UNSEEN`` entry (torch's counters said where it waits, not
with what): agrees with anything."""


def _tensor_field(
    getter: Callable[[CollectiveRecord], Hashable],
) -> Callable[[CollectiveRecord], Hashable]:
    return lambda r: NOT_SEEN if r.flags & pb.UNSEEN else getter(r)


# Checked in this order; the first field that differs is the one reported.
FIELDS: tuple[tuple[str, Callable[[CollectiveRecord], Hashable]], ...] = (
    ("op", lambda r: r.op),
    ("reduce_op", lambda r: r.reduce_op),
    ("root", lambda r: r.peer),
    ("dtype", _tensor_field(lambda r: tuple(t.dtype for t in compared_tensors(r)))),
    # Element count and shape are one field for people ("size mismatch"); numel is evidence.
    ("shape", _tensor_field(_shape)),
    # What each member receives into, where the op fixes it (``compared_outputs``).
    ("output_dtype", _tensor_field(_output_dtype)),
    ("output_shape", _tensor_field(_output_shape)),
)


UNKNOWN: dict[str, Hashable] = {
    "op": "", "reduce_op": "", "root": -1, "dtype": NOT_SEEN, "shape": NOT_SEEN,
    "output_dtype": NOT_SEEN, "output_shape": NOT_SEEN,
}  # fmt: skip
"""Values that mean "not recorded" where the field applies: PyTorch's native recorder keeps
neither the reduce op nor a collective's root (nor do entries merged from it into a flightrec
dump), and a black box's ``UNSEEN`` entry has no tensors (nor, at times, an op). A rank whose
value is unknown agrees with any other on that field; for ops without a reduce op or root
every rank has these values, so they still agree."""
UNKNOWN_AT = tuple((i, UNKNOWN[name]) for i, (name, _) in enumerate(FIELDS) if name in UNKNOWN)


def compatible(signatures: Sequence[tuple[Hashable, ...]]) -> bool:
    """Whether ``signatures`` (``signature`` tuples) agree on every field, reading an unknown
    value (``UNKNOWN``) as agreeing with anything."""
    first = signatures[0]
    for i in range(len(first)):
        unknown = next((u for at, u in UNKNOWN_AT if at == i), None)
        seen = {s[i] for s in signatures} if unknown is None else {
            s[i] for s in signatures if s[i] != unknown
        }  # fmt: skip
        if len(seen) > 1:
            return False
    return True


def signature(r: CollectiveRecord) -> tuple[Hashable, ...]:
    """The values of every compared field of ``r``, in ``FIELDS`` order."""
    return tuple(getter(r) for _, getter in FIELDS)


RawSignature = tuple[int, ...]
"""A dump's interned (op, reduce_op, peer, inputs, outputs, object-API flag) of one entry."""


class Taker:
    """A C-speed gather of fixed positions from any sequence (always returning a sequence)."""

    __slots__ = ("_get", "_only")

    def __init__(self, positions: Sequence[int]) -> None:
        self._only = positions[0] if len(positions) == 1 else None
        self._get = itemgetter(*positions) if len(positions) > 1 else None

    def __call__(self, col: Sequence[T]) -> Sequence[T]:
        if self._get is not None:
            return self._get(col)  # type: ignore[no-any-return]
        return (col[self._only],) if self._only is not None else ()


def taker(positions: Sequence[int]) -> Taker:
    """A C-speed gather of ``positions`` from a column (always returning a sequence)."""
    return Taker(positions)


def _whole(col: Sequence[int]) -> Sequence[int]:
    return col


def raw_signatures(d: RankDump, positions: Sequence[int]) -> list[RawSignature]:
    """The raw signature of each entry at ``positions``: columns sliced at C speed, zipped."""
    if not positions:
        return []
    c = d.columns
    if isinstance(positions, range) and positions == range(len(c["op"])):
        take: Callable[[Sequence[int]], Sequence[int]] = _whole  # every entry: no gather
    else:
        take = taker(positions)
    return list(
        zip(
            *(take(c[name]) for name in ("op", "reduce_op", "peer", "inputs", "outputs")),
            map(_OBJECT_API.__and__, take(c["flags"])),
            strict=True,
        )
    )


def resolve(d: RankDump, raw: RawSignature) -> tuple[Hashable, ...]:
    """The comparable signature of a raw one, through ``d``'s tables.

    Two signatures differ only when a reportable field does (a gather's root-only output list
    is not one).
    """
    rec = CollectiveRecord(
        rank=d.rank,
        group="",
        seq=0,
        p2p_seq=0,
        op=d.string(raw[0]),
        reduce_op=d.string(raw[1]),
        peer=raw[2],
        state=0,
        flags=raw[5],
        enqueue_ns=0,
        complete_ns=0,
        inputs=d.tensors(raw[3]),
        outputs=d.tensors(raw[4]),
        stack=(),
    )
    return signature(rec)
