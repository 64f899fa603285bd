"""Build the ``torchcomms_hang`` sample: dumps as torchcomms' Flight Recorder writes them.

Only a GPU job writes these (torchcomms' NCCL communicators; no torchcomms release on the
package index runs here), so they are constructed, field by field, the way its writer builds
them (``comms/torchcomms/hooks/fr/FlightRecorder.cpp`` of meta-pytorch/torchcomms,
``FlightRecorder::dump`` with ``FlightRecorderHook::dump_file``'s arguments):

- a pickle (protocol 2) of ``{"version", "pg_config", "comm_lib_version", "pg_status",
  "entries"}``; ``pg_config`` keyed by communicator name, ``ranks`` as ``"[0,1,2,3]"`` (no
  spaces); ``pg_status`` empty (the hook passes no status);
- one entry per operation: ``record_id``, ``pg_id`` (registration order), ``process_group`` =
  (communicator name, backend), ``collective_seq_id`` = one counter for the whole process
  from 0, ``p2p_seq_id`` 0, ``op_id``, ``profiling_name`` = ``"<backend>:<op>"``, sizes and
  c10 dtype names, ``state`` from CUDA events, ``retired``, ``timeout_ms`` 600000 (the hook's
  default), ``is_p2p`` false; no ``frames`` (``dump_file`` writes no stacks);
- files ``comm_lib_trace_rank_<rank>``.

The job: communicators ``world`` (ranks 0-3), ``tp01`` and ``tp23``; each step all-reduces on
``world``, then on its pair (ranks 0 and 1 twice, ranks 2 and 3 once), then broadcasts on
``world``, so the recorder-wide numbers of one ``world`` collective differ between the pairs.
Rank 2 never enters the third step's ``world`` all-reduce; the others wait in it (started,
never completed).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

BACKEND = "ncclx"
WORLD = [0, 1, 2, 3]
PAIRS = {0: "tp01", 1: "tp01", 2: "tp23", 3: "tp23"}
START_NS = 1_795_000_000_000_000_000


def _ops(rank: int) -> list[tuple[str, str]]:
    """(communicator, op) in the order ``rank`` issues them, up to where it stops."""
    out: list[tuple[str, str]] = []
    for step in range(3):
        if step == 2 and rank == 2:
            break  # rank 2 is busy elsewhere
        out.append(("world", "all_reduce"))
        if step == 2:
            break  # the others wait in it
        out += [(PAIRS[rank], "all_reduce")] * (2 if rank < 2 else 1)
        out.append(("world", "broadcast"))
    return out


def dump(rank: int) -> dict[str, object]:
    ops = _ops(rank)
    pg_ids = {"world": 0, PAIRS[rank]: 1}
    entries = []
    for i, (comm, op) in enumerate(ops):
        created = START_NS + (rank + 1) * 1_000 + i * 2_000_000
        last = i == len(ops) - 1 and rank != 2
        entries.append({
            "record_id": i, "pg_id": pg_ids[comm], "process_group": (comm, BACKEND),
            "thread_name": "pt_main_thread", "thread_id": str(140_000_000 + rank),
            "collective_seq_id": i, "p2p_seq_id": 0, "op_id": i,
            "profiling_name": f"{BACKEND}:{op}", "time_created_ns": created,
            "input_sizes": [[1024]], "input_dtypes": ["Float"],
            "output_sizes": [[1024]], "output_dtypes": ["Float"],
            "state": "started" if last else "completed",
            "time_discovered_started_ns": created + 20_000,
            "time_discovered_completed_ns": None if last else created + 900_000,
            "retired": not last, "timeout_ms": 600_000, "is_p2p": False,
        })  # fmt: skip
    config = {
        name: {"name": name, "desc": BACKEND, "ranks": "[" + ",".join(map(str, ranks)) + "]"}
        for name, ranks in (("world", WORLD), (PAIRS[rank], [r for r in WORLD if PAIRS[r] == PAIRS[rank]]))
    }  # fmt: skip
    return {
        "version": "2.10", "pg_config": config, "comm_lib_version": "2.27.7",
        "pg_status": {}, "entries": entries,
    }  # fmt: skip


def write_sample(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in WORLD:
        (folder / f"comm_lib_trace_rank_{rank}").write_bytes(pickle.dumps(dump(rank), protocol=2))
    expected = {
        "scenario": folder.name,
        "description": (
            "torchcomms' recorder (constructed per its writer code: only a GPU job writes it): "
            "one counter for all communicators, so ranks 0-1 (two tp01 all-reduces a step) and "
            "ranks 2-3 (one) number the same world collective differently; rank 2 never enters "
            "the third step's world all_reduce (PyTorch native dumps, pickle form, ncclx)"
        ),
        "world_size": 4,
        "exit_status": 1,
        "first_finding": {"kind": "not_arrived", "ranks": [2], "process_group": "world",
                          "seq": 5, "op": "all_reduce"},
    }  # fmt: skip
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")


if __name__ == "__main__":
    write_sample(Path(__file__).resolve().parent / "torchcomms_hang")
