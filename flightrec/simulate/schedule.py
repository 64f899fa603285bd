"""One training step of a simulated 3D-parallel job, as the ordered operations of one rank.

The step is a GPipe-style schedule with ``microbatches`` micro-batches: forward (receive
activations from the previous stage, two tensor-parallel all-reduces, send to the next stage),
backward (the mirror image), then a data-parallel gradient reduce-scatter and parameter
all-gather, then a world all-reduce of the loss.

Times are offsets within the step, chosen so that the operations every rank sees as one
collective (or one send/receive pair) complete at the same offset on every participant: a
pipeline slot of micro-batch ``m`` on stage ``p`` is ``m + p`` forward, ``m + (pp - 1 - p)``
backward. Each operation also says how long its rank computes before entering it
(``compute_ns``: ``FORWARD_NS`` a micro-batch forward, ``BACKWARD_NS`` backward, shared out
around its tensor-parallel all-reduces), which ``simulate.timing`` plays out when the
timing itself is the fault.
"""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.simulate.layout import GroupKind, Layout

MS = 1_000_000
SLOT_NS = 50 * MS
"""Length of one pipeline slot."""
FORWARD_NS = 120 * MS
"""Compute of one micro-batch's forward on one stage (played timing)."""
BACKWARD_NS = 240 * MS
"""Compute of one micro-batch's backward on one stage (played timing)."""
# Compute before each operation of the step's tail: gradient reduce-scatter, optimizer, loss.
_TAIL_COMPUTE_NS = {"reduce_scatter_tensor": 2 * MS, "all_gather_into_tensor": 5 * MS}
_LOSS_COMPUTE_NS = 1 * MS

FrameTuple = tuple[str, str, int]

_MODEL = "model/transformer.py"
_TRAIN = "train.py"
_OUTER: tuple[FrameTuple, ...] = ((_TRAIN, "train_step", 141), (_TRAIN, "main", 212))


@dataclass(frozen=True, slots=True)
class OpTemplate:
    """One operation of a step, the same on every rank of a stage."""

    kind: GroupKind
    op: str
    reduce_op: str
    shape: tuple[int, ...]
    dtype: str
    peer_stage_delta: int  # P2P: +1 next stage, -1 previous stage; 0 for collectives
    send: bool
    complete_off: int  # ns from the step start
    duration: int  # ns the operation runs once every participant has arrived
    stack: tuple[FrameTuple, ...]
    compute_ns: int = 0
    """How long the rank computes between completing its previous operation and entering
    this one (played timing)."""

    @property
    def is_p2p(self) -> bool:
        return self.peer_stage_delta != 0


def _stack(*inner: FrameTuple) -> tuple[FrameTuple, ...]:
    return (*inner, *_OUTER)


def step_template(
    layout: Layout, stage: int, microbatches: int, hidden: int = 4096
) -> list[OpTemplate]:
    """The ordered operations of one step on a rank of pipeline ``stage``."""
    pp, tp, dp = layout.pp, layout.tp, layout.dp
    act = (1, 2048, hidden)
    ops: list[OpTemplate] = []
    carry = [0]  # compute not yet placed before an operation (a stage that sends nothing on)

    def placed(ns: int) -> int:
        ns, carry[0] = ns + carry[0], 0
        return ns

    def tp_pair(base: int, phase: str, line: int, work: int) -> None:
        if tp == 1:
            return
        for i, (fn, ln) in enumerate((("attention", line), ("mlp", line + 40))):
            ops.append(
                OpTemplate(
                    GroupKind.TP,
                    "all_reduce",
                    "SUM",
                    act,
                    "bfloat16",
                    0,
                    False,
                    base + (3 + 3 * i) * SLOT_NS // 10,
                    2 * MS,
                    _stack(
                        ("megatron/tensor_parallel.py", "reduce_from_tp_region", 33),
                        (_MODEL, f"{fn}_{phase}", ln),
                        (_TRAIN, f"{phase}_step", 97),
                    ),
                    placed(3 * work // 10),
                )
            )

    def p2p(delta: int, send: bool, at: int, what: str, work: int = 0) -> None:
        verb = "send" if send else "recv"
        ops.append(
            OpTemplate(
                GroupKind.PP,
                verb,
                "",
                act,
                "bfloat16",
                delta,
                send,
                at,
                1 * MS,
                _stack(
                    ("pipeline/p2p.py", f"{verb}_{what}", 58 if send else 71),
                    (_TRAIN, "pipeline_schedule", 120),
                ),
                placed(work),
            )
        )

    def rest(work: int) -> int:
        """What is left of ``work`` after the tensor-parallel all-reduces took their share."""
        return work - (2 * (3 * work // 10) if tp > 1 else 0)

    for m in range(microbatches):  # forward
        slot = (m + stage) * SLOT_NS
        if stage > 0:
            p2p(-1, False, slot, "activations")
        tp_pair(slot, "forward", 210, FORWARD_NS)
        if stage < pp - 1:
            p2p(+1, True, slot + SLOT_NS, "activations", rest(FORWARD_NS))
        else:
            carry[0] += rest(FORWARD_NS)  # (the last stage goes on to its next micro-batch)
    if stage == pp - 1:
        carry[0] += _LOSS_COMPUTE_NS
    back = (microbatches + pp - 1) * SLOT_NS
    for m in range(microbatches):  # backward
        slot = back + (m + pp - 1 - stage) * SLOT_NS
        if stage < pp - 1:
            p2p(+1, False, slot, "gradients")
        tp_pair(slot, "backward", 230, BACKWARD_NS)
        if stage > 0:
            p2p(-1, True, slot + SLOT_NS, "gradients", rest(BACKWARD_NS))
        else:
            carry[0] += rest(BACKWARD_NS)
    tail = back + (microbatches + pp - 1) * SLOT_NS
    # After the pipeline: the data-parallel gradient reduce-scatter and parameter all-gather
    # (FSDP-style), then the loss all-reduce over the world. Each row: group, op, reduce op,
    # shape, dtype, completion in tenths of a slot after the pipeline, duration, user frames.
    rows: list[tuple[GroupKind, str, str, tuple[int, ...], str, int, int, tuple[FrameTuple, ...]]]
    rows = []
    if dp > 1:
        shard = (hidden * hidden // max(tp, 1),)
        rows += [
            (GroupKind.DP, "reduce_scatter_tensor", "AVG", shard, "float32", 3, 8 * MS,
             (("fsdp/reduce.py", "reduce_gradients", 44), (_TRAIN, "optimizer_step", 131))),
            (GroupKind.DP, "all_gather_into_tensor", "", shard, "bfloat16", 6, 6 * MS,
             (("fsdp/gather.py", "gather_params", 29), (_TRAIN, "optimizer_step", 133))),
        ]  # fmt: skip
    rows.append(
        (GroupKind.WORLD, "all_reduce", "AVG", (1,), "float32", 9, 1 * MS,
         ((_TRAIN, "reduce_loss", 76), (_TRAIN, "log_metrics", 150)))
    )  # fmt: skip
    for kind, op, reduce_op, shape, dtype, tenths, duration, frames in rows:
        at = tail + tenths * SLOT_NS // 10
        work = placed(_TAIL_COMPUTE_NS.get(op, _LOSS_COMPUTE_NS))
        ops.append(
            OpTemplate(
                kind, op, reduce_op, shape, dtype, 0, False, at, duration, _stack(*frames), work
            )
        )
    return ops


def step_length(layout: Layout, microbatches: int) -> int:
    """Nanoseconds from one step's start to the next's."""
    return (2 * (microbatches + layout.pp - 1) + 1) * SLOT_NS
