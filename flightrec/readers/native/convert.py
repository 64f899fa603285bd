"""Convert validated native dumps into flightrec ``Dump`` messages through ``DumpBuilder``.

Mapping (native -> flightrec):

* ``collective_seq_id`` -> ``seq`` (collectives only; P2P entries get seq 0);
* P2P ``"send 0->1"`` / ``"recv 1<-0"`` name group-local ranks; they become the global peer,
  and ``p2p_seq`` is recomputed as the ordinal of the send to (or receive from) that peer,
  which is what flightrec matches on (the native counter is per group, not per peer);
* ``state`` scheduled/started/completed -> ENQUEUED/STARTED/COMPLETED;
* times: native times are wall-clock ns, so the header's wall and monotonic times are set
  equal (to the file's modification time, the best available dump time) and the entry times
  are copied as they are;
* ``frames`` (innermost first) -> stacks; ``thread_name`` -> thread; dtypes -> torch names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import compress, repeat
from operator import eq

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import COALESCED, IS_P2P, SEND, DumpBuilder
from flightrec.readers.native.groups import JobGroup, JobGroups
from flightrec.readers.native.model import NativeDump

SOURCES = {"pickle": "torch-native-pickle", "json": "torch-native-json"}

_STATES = {
    "scheduled": pb.ENQUEUED,
    "started": pb.STARTED,
    "completed": pb.COMPLETED,
}


def _gaps(d: NativeDump, backend: str) -> list[str]:
    """What this dump cannot say, in words, so the report can show it."""
    es = d.entries
    out: list[str] = []
    if len(es) and not (any(es.started_ns) or any(es.completed_ns)):
        out.append("no start or completion times (operations may have finished)")
    if backend == "gloo" and not any(es.is_p2p):
        out.append("gloo records no point-to-point operations")
    if len(es) and not any(es.stack):
        out.append("no stacks")
    out.append("the native format records no host name, pid or local rank")
    return out


def _dump_time_ns(d: NativeDump, timeout_s: float) -> tuple[int, str]:
    """When the dump was written, as far as it can tell, and a note when that is a bound.

    A native dump holds no time of its own; the file's modification time stands in for it,
    but a copied or checked-out file has the time of the copy (days after the job). A live
    rank cannot wait longer than its timeout (gloo raises, the NCCL watchdog aborts), so a
    file time beyond the newest entry plus the timeout is not the dump's: the dump time is
    taken as that bound instead, and waits are measured to it, never to the time of analysis.
    """
    es = d.entries
    newest = max(
        max(es.created_ns, default=0),
        max(es.started_ns, default=0),
        max(es.completed_ns, default=0),
    )
    if not newest or not d.mtime_ns:
        return d.mtime_ns, ""
    bound = newest + int(max(timeout_s, 0.0) * 1e9)
    if d.mtime_ns <= bound:
        return max(d.mtime_ns, newest), ""
    late = (d.mtime_ns - newest) / 1e9
    limit = f"newest entry + the {timeout_s:g} s timeout" if timeout_s > 0 else "newest entry"
    return bound, (
        f"file written {late:.0f} s after its newest entry (a copy?): dump time taken as its "
        f"{limit}"
    )


class _P2P:
    """Peers, per-peer ordinals and batch flags of the point-to-point entries of one ring."""

    def __init__(self, d: NativeDump, job: JobGroups) -> None:
        es = d.entries
        n = len(es)
        self.peer = [-1] * n
        self.p2p_seq = [0] * n
        self.flags: dict[int, int] = {}
        self.counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        ordinal: dict[tuple[str, int, bool], int] = defaultdict(int)
        names, batch = es.pg_name, es.p2p_seq
        for i in compress(range(n), es.is_p2p):
            name = names[i]
            g = job.groups.get(name)
            sends = es.op[i] == "send"
            flags = IS_P2P | (SEND if sends else 0)
            local_peer = es.local_dst[i] if sends else es.local_src[i]
            peer = g.ranks[local_peer] if g is not None and 0 <= local_peer < len(g.ranks) else -1
            if peer >= 0:
                ordinal[(name, peer, sends)] += 1
                self.peer[i] = peer
                self.p2p_seq[i] = ordinal[(name, peer, sends)]
                self.counts[(name, peer)][0 if sends else 1] += 1
            # Entries of one batch_isend_irecv share their p2p_seq_id.
            if batch[i] and any(
                0 <= j < n and es.is_p2p[j] and names[j] == name and batch[j] == batch[i]
                for j in (i - 1, i + 1)
            ):
                flags |= COALESCED
            self.flags[i] = flags


def to_pb(d: NativeDump, job: JobGroups) -> pb.Dump:
    """Convert one native dump to a flightrec dump.

    Args:
        d: the validated native dump.
        job: group membership rebuilt from every rank's dump (``rebuild_groups``).

    Returns:
        A ``pb.Dump`` with ``header.source`` naming the native form and reason CONVERTED.
    """
    b, columns = convert_columns(d, job)
    b.entry_columns({name: list(column) for name, column in columns.items()})
    return b.build()


def convert_columns(d: NativeDump, job: JobGroups) -> tuple[DumpBuilder, dict[str, Sequence[int]]]:
    """Convert one native dump into a builder (header, groups, tables) and entry columns.

    Works a column at a time: what repeats (names, states, stacks, tensor signatures) is
    mapped once per distinct value and the entry columns are built by lookups. ``to_pb``
    puts the columns into the builder; the analyzer takes them as they are (``view``).

    Args:
        d: the validated native dump.
        job: group membership rebuilt from every rank's dump (``rebuild_groups``).

    Returns:
        The builder, its entries not yet added, and the ``Entries`` columns by name.
    """
    b = DumpBuilder()
    es = d.entries
    n = len(es)
    names = es.pg_name
    mine = _own_groups(d, job)
    index = {g.name: i for i, g in enumerate(mine)}
    any_p2p = any(es.is_p2p)
    p2p = _P2P(d, job) if any_p2p else None
    # P2P entries carry no collective sequence number in flightrec.
    seqs = [0 if p else s for s, p in zip(es.seq, es.is_p2p, strict=True)] if any_p2p else es.seq
    wrapped = bool(n) and es.record_id[0] > 0
    for g in mine:
        _add_group(b, g, names, seqs, wrapped, p2p)

    string = b.string
    ops = es.op
    op_codes = {op: string(op) for op in dict.fromkeys(ops)}
    device_column = _devices(b, d, job)
    group_of = {name: index.get(name, 0) for name in dict.fromkeys(names)}
    stacks = [b.stack(s) for s in es.stacks]
    sigs = [b.tensors(t) for t in es.tensor_sigs]
    columns: dict[str, Sequence[int]] = {
        "record_id": es.record_id,
        "group": _codes(names, group_of),
        "seq": seqs,
        "p2p_seq": p2p.p2p_seq if p2p else [0] * n,
        "op": _codes(ops, op_codes),
        "reduce_op": [0] * n,
        "peer": p2p.peer if p2p else [-1] * n,
        "state": _states(d),
        "enqueue_ns": es.created_ns,
        "start_ns": es.started_ns,
        "complete_ns": es.completed_ns,
        "thread": _codes(es.thread, {t: string(t) for t in dict.fromkeys(es.thread)}),
        "stack": list(map(stacks.__getitem__, es.stack)),
        "inputs": list(map(sigs.__getitem__, es.inputs)),
        "outputs": list(map(sigs.__getitem__, es.outputs)),
        "flags": _flags(d, op_codes, p2p),
        "device": device_column,
    }
    _fill_header(b.header, d, job, mine, wrapped)
    return b, columns


def _codes(column: Sequence[str], value: dict[str, int]) -> list[int]:
    return list(map(value.__getitem__, column))


def _own_groups(d: NativeDump, job: JobGroups) -> list[JobGroup]:
    """The groups the dump's entries name or its rank is a member of."""
    own = set(d.entries.pg_name)
    own.discard("")
    mine: list[JobGroup] = [g for g in job.groups.values() if g.name in own or d.rank in g.ranks]
    if len(d.entries) and not mine:
        # Entries without a group name at all: give them one placeholder group so every
        # entry still points at a valid group.
        mine.append(JobGroup("", "", (), "", False))
    return mine


def _add_group(
    b: DumpBuilder,
    g: JobGroup,
    names: Sequence[str],
    seqs: Sequence[int],
    wrapped: bool,
    p2p: _P2P | None,
) -> None:
    """Add group ``g`` with the sequence numbers and transfers the ring holds of it."""
    # This group's sequence numbers, zeros (P2P, unknown) left out: C-speed selections.
    mine_seqs = list(filter(None, compress(seqs, map(eq, names, repeat(g.name)))))
    b.group(
        g.name,
        g.ranks,
        desc=g.desc,
        backend=g.backend,
        last_seq=max(mine_seqs, default=0),
        dropped=(min(mine_seqs) - 1) if (wrapped and mine_seqs) else 0,
        p2p=[
            (peer, s, r)
            for (name, peer), (s, r) in sorted(p2p.counts.items() if p2p else ())
            if name == g.name
        ],
        members_known=g.members_known,
    )


def _flags(d: NativeDump, op_codes: dict[str, int], p2p: _P2P | None) -> list[int]:
    """Per entry: coalesced (by its op's name, or as part of a batch) and point-to-point."""
    op_flags = {
        op: COALESCED if op.endswith("_coalesced") or op == "coalesced" else 0 for op in op_codes
    }
    flags = _codes(d.entries.op, op_flags)
    if p2p is not None:
        for i, f in p2p.flags.items():
            flags[i] |= f
    return flags


def _states(d: NativeDump) -> list[int]:
    """Per entry, its state; a completion time says it completed, whatever the state
    string says."""
    es = d.entries
    states = {s: _STATES.get(s.lower(), pb.STATE_UNKNOWN) for s in dict.fromkeys(es.state)}
    state: list[int] = list(map(states.__getitem__, es.state))
    if any(states[s] != pb.COMPLETED for s in set(compress(es.state, es.completed_ns))):
        state = [
            pb.COMPLETED if done else code
            for code, done in zip(state, es.completed_ns, strict=True)
        ]
    return state


def _devices(b: DumpBuilder, d: NativeDump, job: JobGroups) -> list[int]:
    """Per entry, its device string: "cpu" for gloo groups (the group's backend as rebuilt,
    else the entry's own), "" otherwise."""
    es = d.entries
    names = es.pg_name

    def device(name: str, backend: str) -> int:
        group = job.groups.get(name)
        return b.string("cpu" if (group.backend if group else backend) == "gloo" else "")

    backends = set(es.backend)
    if len(backends) == 1:
        (only,) = backends
        on_group = {name: device(name, only) for name in dict.fromkeys(names)}
        return list(map(on_group.__getitem__, names))
    pairs = list(zip(names, es.backend, strict=True))
    on_pair = {pair: device(*pair) for pair in dict.fromkeys(pairs)}
    return list(map(on_pair.__getitem__, pairs))


def _fill_header(
    h: pb.Header, d: NativeDump, job: JobGroups, mine: list[JobGroup], wrapped: bool
) -> None:
    """Who wrote the dump, when, and what the conversion could not say."""
    es = d.entries
    n = len(es)
    default = next((g for g in mine if g.desc == "default_pg"), mine[0] if mine else None)
    backend = (default.backend if default else "") or next((be for be in es.backend if be), "")
    h.rank = d.rank
    h.world_size = job.world_size
    h.job_id = d.job_id
    h.hostname = d.host
    h.local_rank = -1
    h.requested_by = -1
    h.backend = backend
    h.device = "cpu" if backend == "gloo" else ""
    h.reason = pb.CONVERTED
    h.source = SOURCES[d.form]
    h.entries_recorded = (es.record_id[-1] + 1) if n else 0
    h.buffer_capacity = n if wrapped else 0
    h.stack_depth = max(map(len, es.stacks))
    default_name = default.name if default else ""
    timeouts = compress(es.timeout_ms, map(eq, es.pg_name, repeat(default_name)))
    h.timeout_s = max(timeouts, default=0) / 1000.0
    detail = [f"converted from PyTorch Flight Recorder dump format {d.version or '?'} ({d.form})"]
    dumped_ns, clamped = _dump_time_ns(d, h.timeout_s)
    h.wall_time_ns = dumped_ns
    h.mono_time_ns = dumped_ns  # entry times are wall clock; equal clocks keep them so
    if clamped:
        detail.append(clamped)
    if d.comm_lib_version:
        detail.append(f"comm library {d.comm_lib_version}")
    detail.extend(_gaps(d, backend))
    detail.extend(note for note in job.notes if _concerns(note, d, mine))
    h.reason_detail = "; ".join(detail)


def _concerns(note: str, d: NativeDump, groups: list[JobGroup]) -> bool:
    # Notes are job-wide; attach to a dump only those about its groups or its rank.
    return any(f"group {g.name!r}" in note for g in groups) or note.startswith(f"rank {d.rank} ")
