"""Played timing: when every rank enters and completes each operation, step after step, once
the dependencies between ranks are played out.

The fixed timing of ``job.build_rank_dump`` puts every operation at a set offset in its step
and draws arrival jitter around it: enough for hangs, mismatches and one late rank. Slowness
that travels does not fit it: a slow worker's tensor-parallel peers wait in their all-reduces,
the next stages of its pipeline wait on its sends, and its whole replica arrives late at the
data-parallel collectives. Here a rank enters its next operation once it has computed for
the time that precedes it (``OpTemplate.compute_ns``, scaled by the fault) after completing
the previous one, and an operation completes when its last participant has arrived, plus its
duration; every participant completes it at that moment (a collective, or both ends of a
send/receive pair, as on NCCL and gloo for tensors of real size).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.simulate.faults import Fault, instance, op_keys
from flightrec.simulate.layout import GroupKind, Layout
from flightrec.simulate.schedule import MS, OpTemplate

SLOW_WORKER_FACTOR = 2.0
"""How much longer the slow worker computes."""
SLOW_STAGE_FACTOR = 1.5
"""How much longer every rank of the slow stage computes."""
SPREAD = 0.6
"""Under spread imbalance, each stretch of compute (of one rank, between two of its
operations) is scaled by a factor drawn from 1 +- this: micro-batches of uneven length."""
JITTER = 0.02
"""Every compute chunk is scaled by a factor drawn from 1 +- this (healthy noise)."""
ARRIVAL_NOISE_NS = MS // 2
"""Up to this much is added to every arrival (the launch itself)."""
COMPLETION_NOISE_NS = MS // 20
"""Up to this much is added to each participant's view of a completion."""


@dataclass(frozen=True, slots=True)
class Played:
    """Every rank's operations over all steps, on the true clock (ns).

    Attributes:
        enqueue: per rank, when it entered each of its operations (step by step, in program
            order).
        complete: per rank, when it saw each complete.
    """

    enqueue: Sequence[Sequence[int]]
    complete: Sequence[Sequence[int]]
    end_ns: int
    """The last completion of any rank."""


_Arrival = tuple[int, int, int]
"""(rank, operation index in its program, instance id)."""


def _order(
    layout: Layout, templates: Sequence[Sequence[OpTemplate]]
) -> tuple[list[_Arrival], list[list[tuple[int, int]]], list[int]]:
    """One step's arrivals in an order that respects every dependency, the participants (rank,
    operation index) of each instance, and each instance's duration.

    Ranks advance as in ``faults.play_out``: one whose operation has all its participants
    arrived completes it and goes on; every step has the same shape, so the order is worked
    out once.
    """
    n = layout.world
    keys = [op_keys(t) for t in templates]
    stage = [layout.coords(r)[1] for r in range(n)]
    names = {k: [layout.group_of(r, k).name for r in range(n)] for k in GroupKind}
    ids: dict[tuple[object, ...], int] = {}
    parts: list[list[tuple[int, int]]] = []
    need: list[int] = []
    duration: list[int] = []
    order: list[_Arrival] = []
    ptr = [0] * n
    arrived: dict[int, int] = {}
    queue = deque(range(n))
    while queue:
        r = queue.popleft()
        program = templates[stage[r]]
        i = ptr[r]
        if i >= len(program) or ptr[r] < 0:
            continue
        k = keys[stage[r]][i]
        key, size = instance(layout, r, k, names[k[0]])
        inst = ids.get(key)
        if inst is None:
            inst = ids[key] = len(parts)
            parts.append([])
            need.append(size)
            duration.append(program[i].duration)
        parts[inst].append((r, i))
        order.append((r, i, inst))
        ptr[r] = -1  # inside the operation until it completes
        arrived[inst] = arrived.get(inst, 0) + 1
        if arrived[inst] == need[inst]:
            for p, j in parts[inst]:
                ptr[p] = j + 1
                queue.append(p)
    if len(order) != sum(len(templates[stage[r]]) for r in range(n)):
        raise ValueError("the step's operations cannot all complete (a deadlock in the schedule)")
    return order, parts, duration


@dataclass(frozen=True, slots=True)
class Factors:
    """How much longer than planned each rank computes: ``rank[r]`` always, times a factor
    drawn for every stretch of compute from 1 +- ``spread``."""

    rank: Sequence[float]
    spread: float = 0.0


def factors(fault: Fault, layout: Layout, fault_rank: int) -> Factors:
    """The compute factors of ``fault``."""
    n = layout.world
    if fault is Fault.SLOW_WORKER:
        return Factors([SLOW_WORKER_FACTOR if r == fault_rank else 1.0 for r in range(n)])
    if fault is Fault.SLOW_STAGE:
        slow = layout.coords(fault_rank)[1]
        return Factors(
            [SLOW_STAGE_FACTOR if layout.coords(r)[1] == slow else 1.0 for r in range(n)]
        )
    if fault is Fault.SPREAD_IMBALANCE:
        return Factors([1.0] * n, SPREAD)
    return Factors([1.0] * n)


def play(
    layout: Layout,
    templates: Sequence[Sequence[OpTemplate]],
    steps: int,
    factor: Factors,
    seed: int,
    t0: int,
) -> Played:
    """Play ``steps`` steps of every rank's program out from ``t0`` (true ns).

    Args:
        layout: the job.
        templates: each stage's step program.
        steps: how many steps.
        factor: scales each rank's compute.
        seed: for the jitter.
        t0: when the first step starts.

    Returns:
        Every rank's entry and completion times.

    Raises:
        ValueError: the schedule deadlocks (it never does for ``step_template``'s programs).
    """
    n = layout.world
    order, parts, duration = _order(layout, templates)
    stage = [layout.coords(r)[1] for r in range(n)]
    work = [[op.compute_ns for op in templates[stage[r]]] for r in range(n)]
    size = [len(templates[s]) for s in stage]
    rng = random.Random(f"{seed}/played")
    uniform, rand = rng.uniform, rng.random
    enq: list[list[int]] = [[0] * (size[r] * steps) for r in range(n)]
    comp: list[list[int]] = [[0] * (size[r] * steps) for r in range(n)]
    t = [t0] * n
    need = [len(p) for p in parts]
    scale = factor.rank
    lo, hi = 1.0 - max(JITTER, factor.spread), 1.0 + max(JITTER, factor.spread)
    for s in range(steps):
        latest = [0] * len(parts)
        seen = [0] * len(parts)
        for r, i, inst in order:
            w = work[r][i]
            a = t[r] + int(w * scale[r] * uniform(lo, hi)) if w else t[r]
            a += int(rand() * ARRIVAL_NOISE_NS)
            enq[r][s * size[r] + i] = a
            if a > latest[inst]:
                latest[inst] = a
            seen[inst] += 1
            if seen[inst] == need[inst]:
                done = latest[inst] + duration[inst]
                for p, j in parts[inst]:
                    c = done + int(rand() * COMPLETION_NOISE_NS)
                    comp[p][s * size[p] + j] = c
                    t[p] = c
    return Played(enq, comp, max(t))
