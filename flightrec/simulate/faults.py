"""Inject one fault into the last step of a simulated job and play out who blocks where.

Every rank runs its step program in order; an operation completes once all of its
participants have entered it (every member for a collective, both ends for a send/receive
pair, as on gloo and NCCL for any tensor of real size). A fault changes one rank's program
(stops it, reorders it, or changes one operation so that the collective never completes), and
the play-out below finds, for every rank, how far it got: the operations it completed and the
one it is blocked in, if any. That is exactly the state its flight recorder holds at the hang.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from flightrec.simulate.layout import GroupKind, Layout
from flightrec.simulate.schedule import OpTemplate


class Fault(Enum):
    """The kinds of fault ``flightrec simulate`` can inject."""

    NONE = "none"
    """A healthy job; dumps are taken on request."""
    STALL = "stall"
    """The rank stops issuing operations (a data loader or host hang) mid-step."""
    CRASH = "crash"
    """The rank dies mid-step and writes no dump."""
    OP_MISMATCH = "op_mismatch"
    """The rank issues a different collective than its group."""
    SIZE_MISMATCH = "size_mismatch"
    """The rank's tensor has a different shape than the group's."""
    DTYPE_MISMATCH = "dtype_mismatch"
    """The rank's tensor has a different dtype than the group's."""
    P2P_DEADLOCK = "p2p_deadlock"
    """The rank waits for its next stage's gradient before sending its activations."""
    STRAGGLER = "straggler"
    """The rank arrives last at every collective, by tens of milliseconds; nothing hangs."""
    SLOW_WORKER = "slow_worker"
    """The rank computes about twice as slowly as its peers (a throttled GPU), and everyone
    who waits on it, through its collectives or down its pipeline, runs late too."""
    SLOW_STAGE = "slow_stage"
    """Every rank of the fault rank's pipeline stage computes half again as long as the other
    stages (stage imbalance): all its workers, no single rank."""
    SPREAD_IMBALANCE = "spread_imbalance"
    """Every rank's compute varies from step to step (uneven batches): someone is always
    last, never the same rank; no culprit."""

    @property
    def slows(self) -> bool:
        """A fault of timing alone, played out by ``simulate.timing``: nothing hangs."""
        return self in (Fault.SLOW_WORKER, Fault.SLOW_STAGE, Fault.SPREAD_IMBALANCE)


Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where one rank stands at the end of the fault step."""

    completed: int
    """Operations of the step it completed."""
    blocked: bool
    """Whether it is inside operation ``completed`` (else it is outside any operation)."""


def op_keys(program: Sequence[OpTemplate]) -> list[tuple[GroupKind, int, int, bool]]:
    """Per operation: (group kind, ordinal among the step's ops of that kind/peer/direction,
    peer stage delta, send) — the rank-independent part of the matching key."""
    counters: dict[tuple[GroupKind, int, bool], int] = {}
    keys = []
    for op in program:
        counter = (op.kind, op.peer_stage_delta, op.send)
        n = counters.get(counter, 0)
        counters[counter] = n + 1
        keys.append((op.kind, n, op.peer_stage_delta, op.send))
    return keys


def instance(
    layout: Layout, rank: int, key: tuple[GroupKind, int, int, bool], group_name: Sequence[str]
) -> tuple[Key, int]:
    """Which instance ``rank``'s operation is (``op_keys`` of it; ``group_name``: each rank's
    group of that kind), and how many participants it has: a collective is one per group and
    ordinal, a transfer one per pair and ordinal."""
    kind, ordinal, delta, send = key
    if delta:
        peer = rank + delta * layout.tp
        return ((rank, peer, ordinal) if send else (peer, rank, ordinal)), 2
    return (group_name[rank], ordinal), len(layout.group_of(rank, kind).ranks)


def play_out(
    layout: Layout,
    program_of: Callable[[int], Sequence[OpTemplate]],
    keys_of: Callable[[int], Sequence[tuple[GroupKind, int, int, bool]]],
    stop_at: dict[int, int],
    broken: Callable[[Key], bool],
) -> list[Outcome]:
    """Run every rank's step program until nothing can move.

    Args:
        program_of: rank -> its ordered operations for the step.
        keys_of: rank -> ``op_keys`` of that program.
        stop_at: rank -> index of the operation it never enters (stalled or dead ranks).
        broken: key -> True for a collective that never completes even when all have entered.

    Returns:
        One ``Outcome`` per rank.
    """
    n = layout.world
    ptr = [0] * n
    waiting: dict[Key, set[int]] = {}
    inside = [False] * n
    queue = deque(range(n))
    group_name = {k: [layout.group_of(r, k).name for r in range(n)] for k in GroupKind}
    while queue:
        r = queue.popleft()
        program = program_of(r)
        i = ptr[r]
        if i >= len(program) or i >= stop_at.get(r, len(program)) or inside[r]:
            continue
        k = keys_of(r)[i]
        key, need = instance(layout, r, k, group_name[k[0]])
        members = waiting.setdefault(key, set())
        members.add(r)
        inside[r] = True
        if len(members) == need and not broken(key):
            del waiting[key]
            for m in members:
                inside[m] = False
                ptr[m] += 1
                queue.append(m)
    return [Outcome(ptr[r], inside[r]) for r in range(n)]


def mismatched(op: OpTemplate, fault: Fault) -> OpTemplate:
    """``op`` as the faulty rank issues it."""
    if fault is Fault.OP_MISMATCH:
        other = "all_gather_into_tensor" if op.op == "reduce_scatter_tensor" else "broadcast"
        return replace(op, op=other, reduce_op="")
    if fault is Fault.SIZE_MISMATCH:
        return replace(op, shape=(*op.shape[:-1], op.shape[-1] * 2))
    if fault is Fault.DTYPE_MISMATCH:
        return replace(op, dtype="float32" if op.dtype != "float32" else "bfloat16")
    return op
