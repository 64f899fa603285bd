"""Write the flightrec dumps of a simulated 3D-parallel job with one injected fault.

The job ran ``history`` healthy steps (enough that every ring has wrapped), then one step in
which the fault happened; every rank's ring holds its last ``entries`` operations. Hosts have
their own monotonic clock origin and a few milliseconds of wall-clock skew, as real ones do.
The expected verdict is derived from the fault, not from any analysis.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, repeat
from operator import add, mul, rshift, sub
from pathlib import Path
from typing import Any

from flightrec.analysis.kinds import kind_of_fault
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import IS_P2P, SEND, DumpBuilder
from flightrec.format.schema import dump_filename
from flightrec.format.write import serialize
from flightrec.simulate.faults import Fault, Outcome, mismatched, op_keys, play_out
from flightrec.simulate.layout import GroupKind, Layout, SimGroup
from flightrec.simulate.native import write_native
from flightrec.simulate.schedule import MS, OpTemplate, step_length, step_template
from flightrec.simulate.timing import Played, factors, play

EPOCH_NS = 1_790_000_000 * 10**9  # wall clock of the job's start (late 2026)
T0_NS = 10**12
"""True time of the first step (ns)."""
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SimConfig:
    """What to simulate."""

    layout: Layout
    entries: int = 2000
    fault: Fault = Fault.STALL
    fault_rank: int = 0
    microbatches: int = 4
    seed: int = 0
    straggler_delay_ms: tuple[float, float] = (30.0, 50.0)
    played: bool = False
    """Play the timing out (``simulate.timing``): each rank computes between operations and
    waits for whoever arrives last, so slowness travels down pipelines. The slow faults
    always are; a healthy job (``Fault.NONE``) is when this is set."""
    completion: bool = True
    """Record completion times. Off: every entry keeps only when it was entered, as PyTorch's
    recorder does without timing enabled (entries still say whether they completed)."""


_Interned = tuple[int, int, int, int, int, int]
"""Per template op: op string, reduce-op string, stack, inputs, flags, outputs."""


@dataclass
class _Plan:
    """Everything the dump writers share: programs, play-out, expected verdict."""

    config: SimConfig
    templates: list[list[OpTemplate]]
    culprit_program: list[OpTemplate] | None
    outcomes: list[Outcome]
    stalled: set[int]
    dead: set[int]
    history: int
    expected: dict[str, Any] = field(default_factory=dict)
    played: Played | None = None
    """Every rank's times, where the timing is played out (``SimConfig.played``)."""
    prototypes: dict[int, tuple[DumpBuilder, list[_Interned]]] = field(default_factory=dict)
    """Per step program (by identity): its interned builder, to fork per rank."""

    def program(self, rank: int) -> list[OpTemplate]:
        if self.culprit_program is not None and rank == self.config.fault_rank:
            return self.culprit_program
        return self.templates[self.config.layout.coords(rank)[1]]


def _first_collective_from(program: Sequence[OpTemplate], start: int) -> int:
    for i in range(start, len(program)):
        if not program[i].is_p2p:
            return i
    return len(program) - 1


def expected_kind(fault: Fault) -> str:
    """The kind of the verdict ``fault`` ends in, from the kinds table (``simulated_by``).

    Raises:
        ValueError: no row names the fault (``test_kinds_table`` fails first).
    """
    kind = kind_of_fault(fault.value)
    if kind is None:
        raise ValueError(f"no finding kind's row names the fault {fault.value!r}")
    return kind.value


@dataclass
class _Injected:
    """A fault put into the culprit's step program, and the verdict it should end in."""

    config: SimConfig
    """The config, with the fault rank the fault could be injected at."""
    program: list[OpTemplate]
    """The culprit's step program."""
    at: int
    """Where in it the fault happens (for the faults that happen at one operation)."""
    group_kind: GroupKind = GroupKind.WORLD
    """The kind of group the fault's collective runs on."""
    stop_at: dict[int, int] = field(default_factory=dict)
    """Per rank that stops, the operation it never enters."""
    broken_key: tuple[object, ...] | None = None
    """The matching key of the collective the ranks disagree on."""
    expected: dict[str, Any] = field(default_factory=dict)

    @property
    def culprit(self) -> int:
        return self.config.fault_rank


def plan(config: SimConfig) -> _Plan:
    """Build the step programs, inject the fault, and play the fault step out.

    Raises:
        ValueError: the fault cannot be injected in this layout (P2P deadlock without stages).
    """
    layout, fault = config.layout, config.fault
    if not 0 <= config.fault_rank < layout.world:
        raise ValueError(f"fault rank {config.fault_rank} is outside world size {layout.world}")
    templates = [step_template(layout, s, config.microbatches) for s in range(layout.pp)]
    history = config.entries // min(len(t) for t in templates) + 2
    inj = _inject(config, templates)
    config, culprit, program = inj.config, inj.culprit, inj.program

    played: Played | None = None
    if fault.slows or (config.played and fault is Fault.NONE):
        played = play(
            layout,
            templates,
            history + 1,
            factors(fault, layout, culprit),
            config.seed,
            T0_NS,
        )
    if fault in (Fault.NONE, Fault.STRAGGLER) or fault.slows:
        outcomes = [
            Outcome(len(templates[layout.coords(r)[1]]), False) for r in range(layout.world)
        ]
        culprit_program = None
    else:
        culprit_program = program
        keys = [op_keys(t) for t in templates]
        culprit_keys = op_keys(program)
        outcomes = play_out(
            layout,
            lambda r: program if r == culprit else templates[layout.coords(r)[1]],
            lambda r: culprit_keys if r == culprit else keys[layout.coords(r)[1]],
            inj.stop_at,
            lambda key: key == inj.broken_key,
        )
    if inj.expected and fault not in (Fault.P2P_DEADLOCK, Fault.STRAGGLER) and not fault.slows:
        _expect_collective(inj, templates, history)
    return _Plan(
        config,
        templates,
        culprit_program,
        outcomes,
        stalled={culprit} if fault is Fault.STALL else set(),
        dead={culprit} if fault is Fault.CRASH else set(),
        history=history,
        expected=inj.expected,
        played=played,
    )


def _inject(config: SimConfig, templates: list[list[OpTemplate]]) -> _Injected:
    """The culprit's program with ``config.fault`` in it.

    Raises:
        ValueError: the fault needs pipeline stages and the layout has none.
    """
    layout, fault = config.layout, config.fault
    program = list(templates[layout.coords(config.fault_rank)[1]])
    inj = _Injected(config, program, _first_collective_from(program, len(program) // 2))
    if fault is Fault.P2P_DEADLOCK:
        _swap_p2p(inj, templates)
    elif fault in (Fault.OP_MISMATCH, Fault.SIZE_MISMATCH, Fault.DTYPE_MISMATCH):
        _mismatch(inj)
    elif fault in (Fault.STALL, Fault.CRASH):
        inj.stop_at[inj.culprit] = inj.at
        inj.group_kind = program[inj.at].kind
        inj.expected = {"kind": expected_kind(fault), "ranks": [inj.culprit]}
    elif fault in (Fault.STRAGGLER, Fault.SLOW_WORKER):
        inj.expected = {"kind": expected_kind(fault), "ranks": [inj.culprit]}
    elif fault is Fault.SLOW_STAGE:
        if layout.pp < 2:
            raise ValueError("a slow stage needs pipeline stages: use a layout with pp >= 2")
        stage = layout.coords(inj.culprit)[1]
        ranks = [r for r in range(layout.world) if layout.coords(r)[1] == stage]
        inj.expected = {"kind": expected_kind(fault), "ranks": ranks}
    elif fault is Fault.SPREAD_IMBALANCE:
        inj.expected = {"kind": expected_kind(fault), "ranks": []}
    return inj


def _swap_p2p(inj: _Injected, templates: list[list[OpTemplate]]) -> None:
    """The culprit receives from the next stage before sending to it, as the next stage
    does: each waits for the other."""
    layout = inj.config.layout
    if layout.pp < 2:
        raise ValueError("a P2P deadlock needs pipeline stages: use a layout with pp >= 2")
    if layout.coords(inj.culprit)[1] == layout.pp - 1:
        # the last stage sends nothing forward: use its predecessor
        inj.config = replace(inj.config, fault_rank=inj.culprit - layout.tp)
        inj.program = list(templates[layout.coords(inj.culprit)[1]])
    program = inj.program
    send_fwd = next(i for i, op in enumerate(program) if op.send and op.peer_stage_delta == 1)
    recv_bwd = next(i for i, op in enumerate(program) if not op.send and op.peer_stage_delta == 1)
    program.insert(send_fwd, program.pop(recv_bwd))
    partner = inj.culprit + layout.tp
    inj.expected = {
        "kind": expected_kind(inj.config.fault),
        "ranks": sorted([inj.culprit, partner]),
    }


def _mismatch(inj: _Injected) -> None:
    """The culprit calls one collective with another op, shape or dtype than its peers."""
    layout, fault, program = inj.config.layout, inj.config.fault, inj.program
    kinds = [op.kind for op in program]
    inj.at = kinds.index(GroupKind.DP) if layout.dp >= 3 else len(program) - 1
    inj.group_kind = program[inj.at].kind
    program[inj.at] = mismatched(program[inj.at], fault)
    ordinal = op_keys(program)[inj.at][1]
    inj.broken_key = (layout.group_of(inj.culprit, inj.group_kind).name, ordinal)
    field_name = {
        Fault.OP_MISMATCH: "op",
        Fault.SIZE_MISMATCH: "shape",
        Fault.DTYPE_MISMATCH: "dtype",
    }[fault]
    inj.expected = {"kind": expected_kind(fault), "ranks": [inj.culprit], "field": field_name}


def _expect_collective(inj: _Injected, templates: list[list[OpTemplate]], history: int) -> None:
    """Add the group, sequence number and op of the collective the fault happens in."""
    layout, program, kind, at = inj.config.layout, inj.program, inj.group_kind, inj.at
    g = layout.group_of(inj.culprit, kind)
    inj.expected.update(
        process_group=g.name,
        seq=history * sum(1 for op in program if op.kind is kind and not op.is_p2p)
        + 1
        + sum(1 for op in program[:at] if op.kind is kind and not op.is_p2p),
        op=templates[layout.coords(inj.culprit)[1]][at].op,
    )


def _prototype(
    p: _Plan, program: list[OpTemplate], groups: list[SimGroup]
) -> tuple[DumpBuilder, list[_Interned]]:
    """A fresh builder holding ``program``'s interned tables, and per op its indices.

    Interned once per program (one per pipeline stage, plus the culprit's) and forked for
    every rank: interning the same stacks and signatures again cost a fifth of a rank's dump.
    Group sizes, which output shapes depend on, are the same for every rank of a layout.
    """
    known = p.prototypes.get(id(program))
    if known is None:
        b = DumpBuilder()
        size = {g.kind: len(g.ranks) for g in groups}
        interned = [
            (
                b.string(op.op),
                b.string(op.reduce_op),
                b.stack(op.stack),
                b.tensors([(op.shape, op.dtype)]),
                (IS_P2P | (SEND if op.send else 0)) if op.is_p2p else 0,
                b.tensors([(_output_shape(op.op, op.shape, size[op.kind]), op.dtype)]),
            )
            for op in program
        ]
        known = p.prototypes[id(program)] = (b, interned)
    return known[0].fork(), known[1]


def _host_clock(seed: int, host: int) -> tuple[int, int]:
    """(monotonic origin, wall-clock skew) of a host, both in ns."""
    rng = random.Random(f"{seed}/host/{host}")
    return rng.randrange(10**12, 10**15), rng.randrange(-5 * MS, 5 * MS)


@dataclass(frozen=True)
class _Window:
    """Which of a rank's operations its ring holds: entries ``start`` to ``total`` - 1 of a
    program of ``step_ops`` operations that repeats every step."""

    start: int
    total: int
    step_ops: int

    @property
    def n(self) -> int:
        return self.total - self.start

    @property
    def first_step(self) -> int:
        return self.start // self.step_ops

    @property
    def k0(self) -> int:
        """The position in the step program of the ring's oldest entry."""
        return self.start % self.step_ops

    @property
    def reps(self) -> int:
        """Steps the ring touches."""
        return -(-self.total // self.step_ops) - self.first_step

    def tile(self, per_op: Sequence[int]) -> list[int]:
        """A column whose value depends on the operation's place in the step only."""
        return (list(per_op) * self.reps)[self.k0 : self.k0 + self.n]

    def steps(self) -> list[int]:
        """Per entry, the step it belongs to."""
        first, step_ops = self.first_step, self.step_ops
        per_step = (repeat(s, step_ops) for s in range(first, first + self.reps))
        return list(chain.from_iterable(per_step))[self.k0 : self.k0 + self.n]


def build_rank_dump(p: _Plan, rank: int) -> pb.Dump:
    """The dump that ``rank`` writes at the hang (or on request, for healthy jobs)."""
    cfg, layout = p.config, p.config.layout
    program = p.program(rank)
    outcome = p.outcomes[rank]
    entered = outcome.completed + (1 if outcome.blocked else 0)
    total = p.history * len(program) + entered
    window = _Window(max(0, total - cfg.entries), total, len(program))
    boot, skew = _host_clock(cfg.seed, layout.host(rank))

    groups = layout.groups_of(rank)
    keys = op_keys(program)
    b, k_interned = _prototype(p, program, groups)
    per_step: dict[tuple[GroupKind, int, bool], int] = {}
    for kind, _, delta, send in keys:
        per_step[(kind, delta, send)] = per_step.get((kind, delta, send), 0) + 1
    cols = _entry_columns(p, rank, window, b, k_interned, keys, groups, per_step, boot)
    in_ring = [cols["group"].count(i) for i in range(len(groups))]
    for i, grp in enumerate(groups):
        _add_group(b, p, rank, grp, keys[:entered], per_step, in_ring[i])
    b.entry_columns(cols)
    _fill_header(b.header, p, rank, total, boot, skew)
    main = _main_stack(b.header, p, rank, program)
    b.thread(1, "MainThread", main, is_main=True, holds_recorder=outcome.blocked)
    b.thread(2, "flightrec-watchdog", [("flightrec/recorder/watchdog.py", "_loop", 71)])
    return b.build()


def _entry_columns(
    p: _Plan,
    rank: int,
    w: _Window,
    b: DumpBuilder,
    k_interned: list[_Interned],
    keys: list[tuple[GroupKind, int, int, bool]],
    groups: list[SimGroup],
    per_step: dict[tuple[GroupKind, int, bool], int],
    boot: int,
) -> dict[str, list[int]]:
    """The ring's entry columns: the step's values tiled, and the rest arithmetic over the
    step number, done by map() over whole columns (a 131,072-rank job builds 262 million
    entries)."""
    cfg, layout = p.config, p.config.layout
    program = p.program(rank)
    outcome = p.outcomes[rank]
    gindex = {g.kind: i for i, g in enumerate(groups)}
    n, tile = w.n, w.tile
    # Per template operation: everything that does not change from step to step.
    k_group = [gindex[kind] for kind, *_ in keys]
    k_per_step = [per_step[(kind, delta, send)] for kind, _, delta, send in keys]
    k_peer = [rank + delta * layout.tp if delta else -1 for _, _, delta, _ in keys]
    k_p2p = [bool(delta) for _, _, delta, _ in keys]
    steps = w.steps()
    counts = list(map(add, tile([o + 1 for _, o, _, _ in keys]), map(mul, tile(k_per_step), steps)))
    complete = list(
        map(
            add,
            tile([T0_NS + op.complete_off - boot for op in program]),
            map(mul, steps, repeat(step_length(layout, cfg.microbatches))),
        )
    )
    waits = _waits(p, rank, w, steps, groups, k_group, k_peer, k_p2p)
    done: list[int] = [int(pb.COMPLETED)] * n
    if outcome.blocked and n:
        done[-1] = int(pb.STARTED)
    enqueue = list(map(sub, map(sub, complete, tile([op.duration for op in program])), waits))
    if p.played is not None:
        enqueue = [t - boot for t in p.played.enqueue[rank][w.start : w.total]]
        complete = [t - boot for t in p.played.complete[rank][w.start : w.total]]
    if outcome.blocked and n:
        complete[-1] = 0
    return {
        "record_id": list(range(w.start, w.total)),
        "group": tile(k_group),
        "seq": list(map(mul, counts, tile([0 if p2p else 1 for p2p in k_p2p]))),
        "p2p_seq": list(map(mul, counts, tile([1 if p2p else 0 for p2p in k_p2p]))),
        "op": tile([ki[0] for ki in k_interned]),
        "reduce_op": tile([ki[1] for ki in k_interned]),
        "peer": tile(k_peer),
        "state": done,
        "enqueue_ns": enqueue,
        "start_ns": [0] * n,
        "complete_ns": complete if cfg.completion else [0] * n,
        "thread": [b.string("MainThread")] * n,
        "stack": tile([ki[2] for ki in k_interned]),
        "inputs": tile([ki[3] for ki in k_interned]),
        "outputs": tile([ki[5] for ki in k_interned]),
        "flags": tile([ki[4] for ki in k_interned]),
        "device": [b.string(f"cuda:{rank % 8}")] * n,
    }


def _waits(
    p: _Plan,
    rank: int,
    w: _Window,
    steps: list[int],
    groups: list[SimGroup],
    k_group: list[int],
    k_peer: list[int],
    k_p2p: list[bool],
) -> list[int]:
    """Per entry, how long before the last participant ``rank`` arrived (ns)."""
    cfg = p.config
    straggler = cfg.fault_rank if cfg.fault is Fault.STRAGGLER else -1
    # Jitter, one random byte per entry (drawing a number per entry cost more than
    # everything else together).
    low, span = (0, MS // 20) if rank == straggler else (MS // 20, MS - MS // 20)
    noise = random.Random(f"{cfg.seed}/rank/{rank}").randbytes(w.n)
    waits = list(map(add, repeat(low), map(rshift, map(mul, noise, repeat(span)), repeat(8))))
    if straggler < 0 or rank == straggler:
        return waits
    # Whether the straggler takes part in op k (its group holds it, or it is the P2P peer).
    k_waits_for_straggler = [
        peer == straggler if p2p else straggler in groups[g].ranks
        for g, peer, p2p in zip(k_group, k_peer, k_p2p, strict=True)
    ]
    lo, hi = cfg.straggler_delay_ms
    for i in range(w.n):
        k = (w.k0 + i) % w.step_ops
        if k_waits_for_straggler[k]:
            waits[i] += _straggler_delay(cfg.seed, steps[i], k, lo, hi)
    return waits


def _add_group(
    b: DumpBuilder,
    p: _Plan,
    rank: int,
    grp: SimGroup,
    entered_keys: Sequence[tuple[GroupKind, int, int, bool]],
    per_step: dict[tuple[GroupKind, int, bool], int],
    in_ring: int,
) -> None:
    """Add one of the rank's groups, with what it issued on it (``in_ring`` of it kept)."""
    layout = p.config.layout
    if grp.kind is not GroupKind.PP:
        issued = p.history * per_step[(grp.kind, 0, False)] + sum(
            1 for kd, *_ in entered_keys if kd is grp.kind
        )
        b.group(
            grp.name,
            grp.ranks,
            desc=grp.kind.value,
            backend="nccl",
            last_seq=issued,
            dropped=issued - in_ring,
        )
        return
    stage = layout.coords(rank)[1]
    peers = []
    for dl in (-1, 1):
        if not 0 <= stage + dl < layout.pp:
            continue
        sends, recvs = (
            p.history * per_step.get((grp.kind, dl, sd), 0)
            + sum(1 for kd, _, d2, s2 in entered_keys if kd is grp.kind and d2 == dl and s2 == sd)
            for sd in (True, False)
        )
        peers.append((rank + dl * layout.tp, sends, recvs))
    issued = sum(s + r for _, s, r in peers)
    b.group(
        grp.name,
        grp.ranks,
        desc=grp.kind.value,
        backend="nccl",
        dropped=issued - in_ring,
        p2p=peers,
    )


def _fill_header(h: pb.Header, p: _Plan, rank: int, total: int, boot: int, skew: int) -> None:
    """Who the rank is and when it dumped."""
    cfg, layout = p.config, p.config.layout
    dump_true = T0_NS + (p.history + 1) * step_length(layout, cfg.microbatches)
    dump_true += int(TIMEOUT_S * 1e9)
    if p.played is not None:  # (a dump on request, once every rank has finished the step)
        dump_true = p.played.end_ns + 1_000 * MS
    h.rank, h.world_size = rank, layout.world
    h.hostname = f"node{layout.host(rank):05d}"
    h.pid = 10000 + rank
    h.local_rank = rank % layout.ranks_per_host
    h.device = f"cuda:{h.local_rank}"
    h.device_name = "NVIDIA H100 80GB HBM3"
    h.device_uuid = "GPU-" + hashlib.sha1(f"{cfg.seed}/{rank}".encode()).hexdigest()[:32]
    h.job_id = f"sim-{cfg.seed}"
    h.backend = "nccl"
    h.torch_version = "2.13.0"
    h.flightrec_version = "simulated"
    h.wall_time_ns = EPOCH_NS + dump_true + skew
    h.mono_time_ns = dump_true - boot
    h.buffer_capacity = cfg.entries
    h.entries_recorded = total
    h.stack_depth = 16
    h.timeout_s = TIMEOUT_S
    h.source = "flightrec-simulate"


def _main_stack(
    h: pb.Header, p: _Plan, rank: int, program: list[OpTemplate]
) -> list[tuple[str, str, int]]:
    """Set why the rank dumped; return its main thread's stack at the dump."""
    fault = p.config.fault
    if fault in (Fault.NONE, Fault.STRAGGLER) or fault.slows:
        h.reason, h.reason_detail = pb.CLI_TRIGGER, "flightrec trigger"
        return [
            ("model/transformer.py", "mlp_forward", 188),
            ("train.py", "forward_step", 97),
            *program[0].stack[-2:],
        ]
    if rank in p.stalled:
        h.reason, h.requested_by = pb.PEER_REQUEST, _first_waiter(p)
        return [
            ("data/loader.py", "__next__", 88),
            ("train.py", "next_batch", 64),
            *program[0].stack[-2:],
        ]
    first = _first_waiter(p)
    h.reason = pb.WATCHDOG_TIMEOUT if rank == first else pb.PEER_REQUEST
    h.requested_by = -1 if rank == first else first
    current = program[min(p.outcomes[rank].completed, len(program) - 1)]
    return [("torch/distributed/distributed_c10d.py", current.op, 2950), *current.stack]


@functools.lru_cache(maxsize=1 << 16)
def _straggler_delay(seed: int, step: int, k: int, lo: float, hi: float) -> int:
    """How long everyone waited for the straggler in operation ``k`` of ``step`` (same on every rank)."""
    return int(random.Random(f"{seed}/delay/{step}/{k}").uniform(lo, hi) * MS)


def _output_shape(op: str, shape: tuple[int, ...], group_size: int) -> tuple[int, ...]:
    """The output tensor's shape: a reduce-scatter returns one shard, an all-gather all of them."""
    if not shape:
        return shape
    if op == "reduce_scatter_tensor":
        return (max(1, shape[0] // group_size), *shape[1:])
    if op == "all_gather_into_tensor":
        return (shape[0] * group_size, *shape[1:])
    return shape


def _first_waiter(p: _Plan) -> int:
    for r, o in enumerate(p.outcomes):
        if o.blocked and r not in p.dead:
            return r
    return 0


_PLAN: _Plan | None = None


def _write_range(args: tuple[str, int, int, str]) -> tuple[int, int]:
    """Write the dumps of ranks ``lo`` to ``hi`` - 1; returns ``(lo, hi)``."""
    out, lo, hi, form = args
    assert _PLAN is not None
    for rank in range(lo, hi):
        if rank in _PLAN.dead:
            continue
        dump = build_rank_dump(_PLAN, rank)
        if form == "native":
            write_native(dump, out)
            continue
        reason = pb.DumpReason.Name(dump.header.reason)
        # Straight to the final name: these are test files in a fresh folder, and the atomic
        # write's temporary file, fsync and rename were a fifth of a rank's time.
        name = dump_filename(rank, 0, reason, dump.header.pid)
        (Path(out) / name).write_bytes(serialize(dump))
    return lo, hi


def _init(p: _Plan) -> None:
    global _PLAN
    _PLAN = p


def simulate(
    config: SimConfig,
    out: str | Path,
    processes: int = 1,
    form: str = "flightrec",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Write one dump per live rank into ``out``; return the expected first finding (empty for healthy).

    Args:
        config: the job and its fault.
        out: the folder to write into.
        processes: writer processes.
        form: ``flightrec`` (protobuf dumps) or ``native`` (PyTorch's pickle form, same rings).
        progress: called as ``progress(ranks_done, world_size)`` as dumps are written.

    Raises:
        ValueError: the fault cannot be injected in this layout.
        OSError: ``out`` cannot be written.
    """
    p = plan(config)
    Path(out).mkdir(parents=True, exist_ok=True)
    world = config.layout.world
    chunk = max(1, world // (processes * 8))
    if form not in ("flightrec", "native"):
        raise ValueError(f"unknown dump format {form!r} (flightrec or native)")
    ranges = [(str(out), lo, min(world, lo + chunk), form) for lo in range(0, world, chunk)]
    done = 0
    if processes > 1 and world > 64:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(processes, initializer=_init, initargs=(p,)) as pool:
            for lo, hi in pool.imap_unordered(_write_range, ranges):
                done += hi - lo
                if progress is not None:
                    progress(done, world)
    else:
        _init(p)
        for r in ranges:
            lo, hi = _write_range(r)
            done += hi - lo
            if progress is not None:
                progress(done, world)
    return p.expected
