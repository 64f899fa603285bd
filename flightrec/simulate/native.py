"""The simulated job's dumps in PyTorch's native Flight Recorder pickle form.

Same job, same fault, same rings as the flightrec dumps: each rank's flightrec dump is turned
into the dictionary ``_dump_fr_trace`` pickles (version "2.10": ``pg_config``, ``pg_status``,
``entries`` with ``profiling_name`` such as ``nccl:all_reduce`` or ``nccl:send 0->1``), and
written as ``nccl_trace_rank_<N>``, the name PyTorch's recorder and ``fr_trace`` use. Both
analyzers can then be run on identical input.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of

NATIVE_VERSION = "2.10"
PREFIX = "nccl_trace_rank_"

# torch dtype names (flightrec) to the c10 ScalarType names the native recorder writes.
_SCALAR_TYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}

_STATES = {pb.COMPLETED: "completed", pb.STARTED: "started"}

# torch.distributed API names to the names ProcessGroupNCCL records as ``profiling_name``.
_NCCL_NAMES = {
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_gather_into_tensor": "_all_gather_base",
}


def native_trace(d: pb.Dump) -> dict[str, Any]:
    """The native recorder's dictionary for one flightrec dump.

    Args:
        d: a rank's flightrec dump.

    Returns:
        The dictionary ``torch.distributed`` pickles for that rank.
    """
    s = d.strings
    h = d.header
    wall = h.wall_time_ns - h.mono_time_ns  # monotonic -> wall clock on this host
    backend = h.backend or "nccl"
    frames = [{"name": s[f.name], "filename": s[f.file], "line": f.line} for f in d.frames]
    stacks = [[frames[i] for i in st.frames] for st in d.stacks]
    specs: list[tuple[list[list[int]], list[str]]] = []
    for spec in d.tensor_specs:
        sizes, pos = [], 0
        for nd in spec.ndim:
            sizes.append(list(spec.dims[pos : pos + nd]))
            pos += nd
        specs.append((sizes, [_SCALAR_TYPES.get(s[t], s[t]) for t in spec.dtype]))
    groups = list(d.groups)
    # Native dumps name P2P peers by group-local rank: the index in the sorted member list
    # (torch sorts it). A range is its own sorted list, and its index() is O(1).
    members = [members_of(g) for g in groups]
    local = [m if isinstance(m, range) else sorted(m) for m in members]
    e = d.entries
    entries: list[dict[str, Any]] = []
    for i in range(len(e.record_id)):
        gi = e.group[i]
        g = groups[gi]
        op = s[e.op[i]]
        op = _NCCL_NAMES.get(op, op)
        is_p2p = bool(e.flags[i] & pb.IS_P2P)
        if is_p2p:
            me, peer = local[gi].index(h.rank), local[gi].index(e.peer[i])
            op = f"send {me}->{peer}" if e.flags[i] & pb.SEND else f"recv {me}<-{peer}"
        state = _STATES.get(e.state[i], "scheduled")
        ins, outs = specs[e.inputs[i]], specs[e.outputs[i]]
        entries.append(
            {
                "record_id": e.record_id[i],
                "pg_id": gi,
                "process_group": (g.name, g.desc),
                "collective_seq_id": e.seq[i],
                "p2p_seq_id": e.p2p_seq[i],
                "op_id": e.record_id[i],
                "profiling_name": f"{backend}:{op}",
                "time_created_ns": e.enqueue_ns[i] + wall,
                "input_sizes": ins[0],
                "input_dtypes": ins[1],
                "output_sizes": outs[0],
                "output_dtypes": outs[1],
                "state": state,
                "time_discovered_started_ns": e.enqueue_ns[i] + wall
                if state != "scheduled"
                else None,
                "time_discovered_completed_ns": (
                    e.complete_ns[i] + wall if state == "completed" and e.complete_ns[i] else None
                ),
                "retired": state == "completed",
                "timeout_ms": int(h.timeout_s * 1000),
                "is_p2p": is_p2p,
                "thread_id": "1",
                "thread_name": s[e.thread[i]],
                "frames": stacks[e.stack[i]],
            }
        )
    pg_config = {
        g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(m))}
        for g, m in zip(groups, members, strict=True)
    }
    pg_status: dict[str, dict[str, int]] = {}
    for gi, g in enumerate(groups):
        mine = [i for i in range(len(e.record_id)) if e.group[i] == gi and e.seq[i]]
        done = [e.seq[i] for i in mine if e.state[i] == pb.COMPLETED]
        started = [e.seq[i] for i in mine if e.state[i] in (pb.STARTED, pb.COMPLETED)]
        pg_status[str(gi)] = {
            "last_enqueued_collective": int(g.last_seq),
            "last_started_collective": max(started, default=-1),
            "last_completed_collective": max(done, default=-1),
        }
    return {
        "version": NATIVE_VERSION,
        "pg_config": pg_config,
        "pg_status": pg_status,
        "comm_lib_version": "2.21.5",
        "entries": entries,
    }


def write_native(d: pb.Dump, directory: str | Path) -> Path:
    """Pickle ``native_trace(d)`` as ``directory/nccl_trace_rank_<rank>`` (atomically).

    Returns:
        The file written.

    Raises:
        OSError: the folder cannot be written.
    """
    directory = Path(directory)
    data = pickle.dumps(native_trace(d), protocol=pickle.HIGHEST_PROTOCOL)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    final = directory / f"{PREFIX}{d.header.rank}"
    os.replace(tmp, final)
    return final
