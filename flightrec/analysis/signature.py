"""What two ranks must agree on when they issue the same collective: the compared fields.

Shared by the per-rank index (built in loader processes) and the mismatch pass, so that a
signature id computed while loading means exactly what the mismatch pass compares.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import itemgetter

from flightrec.analysis.model import CollectiveRecord, RankDump, TensorInfo
from flightrec.proto import flightrec_pb2 as pb

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


# Checked in this order; the first field that differs is the one reported.
FIELDS: tuple[tuple[str, Callable[[CollectiveRecord], Hashable]], ...] = (
    ("op", lambda r: r.op),
    ("reduce_op", lambda r: r.reduce_op),
    ("root", lambda r: r.peer),
    ("dtype", lambda r: tuple(t.dtype for t in compared_tensors(r))),
    # Element count and shape are one field for people ("size mismatch"); numel is evidence.
    ("shape", _shape),
)


def signature(r: CollectiveRecord) -> tuple[Hashable, ...]:
    """The values of every compared field of ``r``, in ``FIELDS`` order."""
    return tuple(getter(r) for _, getter in FIELDS)


RawSignature = tuple[int, ...]
"""A dump's interned (op, reduce_op, peer, inputs, outputs, object-API flag) of one entry."""


def taker(positions: Sequence[int]) -> Callable[[Sequence[int]], Sequence[int]]:
    """A C-speed gather of ``positions`` from a column (always returning a sequence)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda col: (col[only],)
    get = itemgetter(*positions)
    return lambda col: get(col)  # type: ignore[no-any-return]


def raw_signatures(d: RankDump, positions: Sequence[int]) -> list[RawSignature]:
    """The raw signature of each entry at ``positions``: columns sliced at C speed, zipped."""
    if not positions:
        return []
    take = taker(positions)
    c = d.columns
    return list(
        zip(
            *(take(c[name]) for name in ("op", "reduce_op", "peer", "inputs", "outputs")),
            [f & pb.OBJECT_API for f in take(c["flags"])],
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
