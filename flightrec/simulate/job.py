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


def plan(config: SimConfig) -> _Plan:
    """Build the step programs, inject the fault, and play the fault step out.

    Raises:
        ValueError: the fault cannot be injected in this layout (P2P deadlock without stages).
    """
    layout, fault = config.layout, config.fault
    if not 0 <= config.fault_rank < layout.world:
        raise ValueError(f"fault rank {config.fault_rank} is outside world size {layout.world}")
    templates = [step_template(layout, s, config.microbatches) for s in range(layout.pp)]
    culprit = config.fault_rank
    program = list(templates[layout.coords(culprit)[1]])
    history = config.entries // min(len(t) for t in templates) + 2
    stop_at: dict[int, int] = {}
    broken_key: tuple[object, ...] | None = None
    expected: dict[str, Any]
    group_kind = GroupKind.WORLD
    at = _first_collective_from(program, len(program) // 2)

    if fault is Fault.P2P_DEADLOCK:
        if layout.pp < 2:
            raise ValueError("a P2P deadlock needs pipeline stages: use a layout with pp >= 2")
        if layout.coords(culprit)[1] == layout.pp - 1:
            culprit -= layout.tp  # the last stage sends nothing forward: use its predecessor
            config = replace(config, fault_rank=culprit)
            program = list(templates[layout.coords(culprit)[1]])
        send_fwd = next(i for i, op in enumerate(program) if op.send and op.peer_stage_delta == 1)
        recv_bwd = next(
            i for i, op in enumerate(program) if not op.send and op.peer_stage_delta == 1
        )
        program.insert(send_fwd, program.pop(recv_bwd))
        partner = culprit + layout.tp
        expected = {"kind": expected_kind(fault), "ranks": sorted([culprit, partner])}
    elif fault in (Fault.OP_MISMATCH, Fault.SIZE_MISMATCH, Fault.DTYPE_MISMATCH):
        kinds = [op.kind for op in program]
        at = kinds.index(GroupKind.DP) if layout.dp >= 3 else len(program) - 1
        group_kind = program[at].kind
        program[at] = mismatched(program[at], fault)
        ordinal = op_keys(program)[at][1]
        broken_key = (layout.group_of(culprit, group_kind).name, ordinal)
        field_name = {
            Fault.OP_MISMATCH: "op",
            Fault.SIZE_MISMATCH: "shape",
            Fault.DTYPE_MISMATCH: "dtype",
        }[fault]
        expected = {"kind": expected_kind(fault), "ranks": [culprit], "field": field_name}
    elif fault in (Fault.STALL, Fault.CRASH):
        stop_at[culprit] = at
        group_kind = program[at].kind
        expected = {"kind": expected_kind(fault), "ranks": [culprit]}
    elif fault in (Fault.STRAGGLER, Fault.SLOW_WORKER):
        expected = {"kind": expected_kind(fault), "ranks": [culprit]}
    elif fault is Fault.SLOW_STAGE:
        if layout.pp < 2:
            raise ValueError("a slow stage needs pipeline stages: use a layout with pp >= 2")
        stage = layout.coords(culprit)[1]
        ranks = [r for r in range(layout.world) if layout.coords(r)[1] == stage]
        expected = {"kind": expected_kind(fault), "ranks": ranks}
    elif fault is Fault.SPREAD_IMBALANCE:
        expected = {"kind": expected_kind(fault), "ranks": []}
    else:
        expected = {}

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
            stop_at,
            lambda key: key == broken_key,
        )
    if expected and fault not in (Fault.P2P_DEADLOCK, Fault.STRAGGLER) and not fault.slows:
        g = layout.group_of(culprit, group_kind)
        expected.update(
            process_group=g.name,
            seq=history * sum(1 for op in program if op.kind is group_kind and not op.is_p2p)
            + 1
            + sum(1 for op in program[:at] if op.kind is group_kind and not op.is_p2p),
            op=templates[layout.coords(culprit)[1]][at].op,
        )
    return _Plan(
        config,
        templates,
        culprit_program,
        outcomes,
        stalled={culprit} if fault is Fault.STALL else set(),
        dead={culprit} if fault is Fault.CRASH else set(),
        history=history,
        expected=expected,
        played=played,
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


def build_rank_dump(p: _Plan, rank: int) -> pb.Dump:
    """The dump that ``rank`` writes at the hang (or on request, for healthy jobs)."""
    cfg, layout = p.config, p.config.layout
    rng = random.Random(f"{cfg.seed}/rank/{rank}")
    program = p.program(rank)
    step_ops = len(program)
    outcome = p.outcomes[rank]
    entered = outcome.completed + (1 if outcome.blocked else 0)
    total = p.history * step_ops + entered
    start = max(0, total - cfg.entries)
    period = step_length(layout, cfg.microbatches)
    boot, skew = _host_clock(cfg.seed, layout.host(rank))
    t0 = T0_NS
    straggler = cfg.fault_rank if cfg.fault is Fault.STRAGGLER else -1

    groups = layout.groups_of(rank)
    gindex = {g.kind: i for i, g in enumerate(groups)}
    keys = op_keys(program)
    b, k_interned = _prototype(p, program, groups)
    per_step: dict[tuple[GroupKind, int, bool], int] = {}
    for kind, _, delta, send in keys:
        per_step[(kind, delta, send)] = per_step.get((kind, delta, send), 0) + 1

    # Per template operation: everything that does not change from step to step.
    k_group = [gindex[kind] for kind, *_ in keys]
    k_per_step = [per_step[(kind, delta, send)] for kind, _, delta, send in keys]
    k_peer = [rank + delta * layout.tp if delta else -1 for _, _, delta, _ in keys]
    k_p2p = [bool(delta) for _, _, delta, _ in keys]
    # Whether the straggler takes part in op k (its group holds it, or it is the P2P peer).
    k_waits_for_straggler = [
        straggler >= 0
        and rank != straggler
        and (peer == straggler if p2p else straggler in groups[g].ranks)
        for g, peer, p2p in zip(k_group, k_peer, k_p2p, strict=True)
    ]
    # The ring holds entries start..total-1 of a program that repeats every step: per-op
    # columns are the step's values tiled, and the rest is arithmetic over the step number,
    # done by map() over whole columns (a 131,072-rank job builds 262 million entries).
    n = total - start
    first_step, k0 = divmod(start, step_ops)
    reps = -(-total // step_ops) - first_step  # steps the ring touches

    def tile(per_op: Sequence[int]) -> list[int]:
        return (list(per_op) * reps)[k0 : k0 + n]

    steps = list(
        chain.from_iterable(repeat(s, step_ops) for s in range(first_step, first_step + reps))
    )[k0 : k0 + n]
    counts = list(map(add, tile([o + 1 for _, o, _, _ in keys]), map(mul, tile(k_per_step), steps)))
    complete = list(
        map(
            add,
            tile([t0 + op.complete_off - boot for op in program]),
            map(mul, steps, repeat(period)),
        )
    )
    # Jitter: how long before the last participant each rank arrived, one random byte per
    # entry (drawing a number per entry cost more than everything else together).
    low, span = (0, MS // 20) if rank == straggler else (MS // 20, MS - MS // 20)
    noise = rng.randbytes(n)
    waits = list(map(add, repeat(low), map(rshift, map(mul, noise, repeat(span)), repeat(8))))
    if straggler >= 0 and rank != straggler:
        lo, hi = cfg.straggler_delay_ms
        for i in range(n):
            k = (k0 + i) % step_ops
            if k_waits_for_straggler[k]:
                waits[i] += _straggler_delay(cfg.seed, steps[i], k, lo, hi)
    done: list[int] = [int(pb.COMPLETED)] * n
    if outcome.blocked and n:
        done[-1] = int(pb.STARTED)
    enqueue = list(map(sub, map(sub, complete, tile([op.duration for op in program])), waits))
    if p.played is not None:
        enqueue = [t - boot for t in p.played.enqueue[rank][start:total]]
        complete = [t - boot for t in p.played.complete[rank][start:total]]
    group_col = tile(k_group)
    cols: dict[str, list[int]] = {
        "record_id": list(range(start, total)),
        "group": group_col,
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
    if outcome.blocked and n:
        complete[-1] = 0
    in_ring = [group_col.count(i) for i in range(len(groups))]

    entered_keys = keys[:entered]
    for i, grp in enumerate(groups):
        if grp.kind is GroupKind.PP:
            stage = layout.coords(rank)[1]
            peers = []
            for dl in (-1, 1):
                if not 0 <= stage + dl < layout.pp:
                    continue
                sends, recvs = (
                    p.history * per_step.get((grp.kind, dl, sd), 0)
                    + sum(
                        1
                        for kd, _, d2, s2 in entered_keys
                        if kd is grp.kind and d2 == dl and s2 == sd
                    )
                    for sd in (True, False)
                )
                peers.append((rank + dl * layout.tp, sends, recvs))
            issued = sum(s + r for _, s, r in peers)
            b.group(
                grp.name,
                grp.ranks,
                desc=grp.kind.value,
                backend="nccl",
                dropped=issued - in_ring[i],
                p2p=peers,
            )
        else:
            issued = p.history * per_step[(grp.kind, 0, False)] + sum(
                1 for kd, *_ in entered_keys if kd is grp.kind
            )
            b.group(
                grp.name,
                grp.ranks,
                desc=grp.kind.value,
                backend="nccl",
                last_seq=issued,
                dropped=issued - in_ring[i],
            )
    b.entry_columns(cols)

    dump_true = t0 + (p.history + 1) * period + int(TIMEOUT_S * 1e9)
    if p.played is not None:  # (a dump on request, once every rank has finished the step)
        dump_true = p.played.end_ns + 1_000 * MS
    h = b.header
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
    if cfg.fault in (Fault.NONE, Fault.STRAGGLER) or cfg.fault.slows:
        h.reason, h.reason_detail = pb.CLI_TRIGGER, "flightrec trigger"
        main: list[tuple[str, str, int]] = [
            ("model/transformer.py", "mlp_forward", 188),
            ("train.py", "forward_step", 97),
            *program[0].stack[-2:],
        ]
    elif rank in p.stalled:
        h.reason, h.requested_by = pb.PEER_REQUEST, _first_waiter(p)
        main = [
            ("data/loader.py", "__next__", 88),
            ("train.py", "next_batch", 64),
            *program[0].stack[-2:],
        ]
    else:
        first = _first_waiter(p)
        h.reason = pb.WATCHDOG_TIMEOUT if rank == first else pb.PEER_REQUEST
        h.requested_by = -1 if rank == first else first
        current = program[min(outcome.completed, step_ops - 1)]
        main = [("torch/distributed/distributed_c10d.py", current.op, 2950), *current.stack]
    b.thread(1, "MainThread", main, is_main=True, holds_recorder=outcome.blocked)
    b.thread(2, "flightrec-watchdog", [("flightrec/recorder/watchdog.py", "_loop", 71)])
    return b.build()


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
