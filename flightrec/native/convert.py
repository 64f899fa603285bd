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

from flightrec.builder import COALESCED, IS_P2P, SEND, DumpBuilder, EntryValues
from flightrec.native.groups import GroupInfo, JobGroups
from flightrec.native.model import NativeDump
from flightrec.proto import flightrec_pb2 as pb

SOURCES = {"pickle": "torch-native-pickle", "json": "torch-native-json"}

_STATES = {
    "scheduled": pb.ENQUEUED,
    "started": pb.STARTED,
    "completed": pb.COMPLETED,
}


def _gaps(d: NativeDump, backend: str) -> list[str]:
    """What this dump cannot say, in words, so the report can show it."""
    out: list[str] = []
    if d.entries and not any(e.started_ns or e.completed_ns for e in d.entries):
        out.append("no start or completion times (operations may have finished)")
    if backend == "gloo" and not any(e.is_p2p for e in d.entries):
        out.append("gloo records no point-to-point operations")
    if not any(e.frames for e in d.entries) and d.entries:
        out.append("no stacks")
    return out


def to_pb(d: NativeDump, job: JobGroups) -> pb.Dump:
    """Convert one native dump to a flightrec dump.

    Args:
        d: the validated native dump.
        job: group membership rebuilt from every rank's dump (``rebuild_groups``).

    Returns:
        A ``pb.Dump`` with ``header.source`` naming the native form and reason CONVERTED.
    """
    b = DumpBuilder()
    own = {e.pg_name for e in d.entries if e.pg_name}
    mine: list[GroupInfo] = [g for g in job.groups.values() if d.rank in g.ranks or g.name in own]
    index = {g.name: i for i, g in enumerate(mine)}
    by_group: dict[str, list[int]] = defaultdict(list)
    for e in d.entries:
        if not e.is_p2p and e.seq:
            by_group[e.pg_name].append(e.seq)
    wrapped = bool(d.entries) and d.entries[0].record_id > 0
    peer_counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    p2p_ordinal: dict[tuple[str, int, bool], int] = defaultdict(int)

    def global_rank(g: GroupInfo, local: int) -> int:
        return g.ranks[local] if 0 <= local < len(g.ranks) else -1

    entries: list[EntryValues] = []
    for i, e in enumerate(d.entries):
        g = job.groups.get(e.pg_name)
        flags = 0
        peer = -1
        p2p_seq = 0
        if e.op in ("coalesced",) or e.op.endswith("_coalesced"):
            flags |= COALESCED
        if e.is_p2p:
            flags |= IS_P2P
            sends = e.op == "send"
            if sends:
                flags |= SEND
            local_peer = e.local_dst if sends else e.local_src
            peer = global_rank(g, local_peer) if g is not None else -1
            if peer >= 0:
                p2p_ordinal[(e.pg_name, peer, sends)] += 1
                p2p_seq = p2p_ordinal[(e.pg_name, peer, sends)]
                peer_counts[(e.pg_name, peer)][0 if sends else 1] += 1
            # Entries of one batch_isend_irecv share their p2p_seq_id.
            for j in (i - 1, i + 1):
                if 0 <= j < len(d.entries):
                    o = d.entries[j]
                    if o.is_p2p and o.pg_name == e.pg_name and o.p2p_seq == e.p2p_seq and e.p2p_seq:
                        flags |= COALESCED
        state = _STATES.get(e.state.lower(), pb.STATE_UNKNOWN)
        if e.completed_ns and state != pb.COMPLETED:
            state = pb.COMPLETED
        entries.append(
            EntryValues(
                record_id=e.record_id,
                group=index.get(e.pg_name, 0),
                op=e.op,
                seq=0 if e.is_p2p else e.seq,
                p2p_seq=p2p_seq,
                peer=peer,
                state=state,
                enqueue_ns=e.created_ns,
                start_ns=e.started_ns,
                complete_ns=e.completed_ns,
                thread=e.thread,
                stack=e.frames,
                inputs=e.inputs,
                outputs=e.outputs,
                flags=flags,
                device="cpu" if (g.backend if g else e.backend) == "gloo" else "",
            )
        )
    if any(e.pg_name not in index for e in d.entries) and not mine:
        # Entries without a group name at all: give them one placeholder group so every
        # entry still points at a valid group.
        mine.append(GroupInfo("", "", (), "", False))
        index[""] = 0
    for g in mine:
        seqs = by_group.get(g.name, [])
        b.group(
            g.name,
            g.ranks,
            desc=g.desc,
            backend=g.backend,
            last_seq=max(seqs, default=0),
            dropped=(min(seqs) - 1) if (wrapped and seqs) else 0,
            p2p=[
                (peer, s, r)
                for (name, peer), (s, r) in sorted(peer_counts.items())
                if name == g.name
            ],
            members_known=g.members_known,
        )
    for ev in entries:
        b.entry(ev)

    default = next((g for g in mine if g.desc == "default_pg"), mine[0] if mine else None)
    backend = (default.backend if default else "") or next(
        (e.backend for e in d.entries if e.backend), ""
    )
    h = b.header
    h.rank = d.rank
    h.world_size = job.world_size
    h.hostname = d.host
    h.local_rank = -1
    h.requested_by = -1
    h.backend = backend
    h.device = "cpu" if backend == "gloo" else ""
    h.reason = pb.CONVERTED
    h.source = SOURCES[d.form]
    h.wall_time_ns = d.mtime_ns
    h.mono_time_ns = d.mtime_ns  # entry times are wall clock; equal clocks keep them so
    h.entries_recorded = (d.entries[-1].record_id + 1) if d.entries else 0
    h.buffer_capacity = len(d.entries) if wrapped else 0
    h.stack_depth = max((len(e.frames) for e in d.entries), default=0)
    timeouts = [e.timeout_ms for e in d.entries if e.pg_name == (default.name if default else "")]
    h.timeout_s = max(timeouts, default=0) / 1000.0
    detail = [f"converted from PyTorch Flight Recorder dump format {d.version or '?'} ({d.form})"]
    if d.comm_lib_version:
        detail.append(f"comm library {d.comm_lib_version}")
    detail.extend(_gaps(d, backend))
    detail.extend(n for n in job.notes if _concerns(n, d, mine))
    h.reason_detail = "; ".join(detail)
    return b.build()


def _concerns(note: str, d: NativeDump, groups: list[GroupInfo]) -> bool:
    # Notes are job-wide; attach to a dump only those about its groups or its rank.
    return any(f"group {g.name!r}" in note for g in groups) or note.startswith(f"rank {d.rank} ")
