"""Re-record the native Flight Recorder samples from real 4-rank gloo jobs.

Usage (from the repository root, with torch installed):
    python samples/native/generate.py [SCENARIO ...]

(A dtype mismatch is not among them: gloo aborts the process on it before any dump.)
Each scenario runs ``tests/integration/native_scripts/fr_job.py`` (4 processes, gloo, PyTorch's
own recorder on through TORCH_FR_BUFFER_SIZE) and writes:
    samples/native/<scenario>/nccl_trace_rank_<r>           pickle form (``_dump_fr_trace``)
    samples/native/<scenario>-json/<host>-comm_lib_trace_rank_<r>   JSON form
each folder with an ``expected.json`` describing the fault injected (not the analyzer's output).
Stacks in the dumps hold this machine's paths; nothing else is edited after recording.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = ROOT / "tests" / "integration" / "native_scripts" / "fr_job.py"

# What each scenario injects; the first finding an analyzer must report.
SCENARIOS: dict[str, dict[str, object]] = {
    "hang": {
        "description": "rank 2 never enters the third step's all_reduce on the default group",
        "first_finding": {
            "kind": "not_arrived",
            "ranks": [2],
            "process_group": "0",
            "seq": 5,
            "op": "all_reduce",
        },
    },
    "op_mismatch": {
        "description": "rank 0 calls broadcast where ranks 1-3 call all_reduce (seq 5); fr_trace (given repaired group names) blames ranks 1, 2 and 3",
        "first_finding": {
            "kind": "mismatch",
            "ranks": [0],
            "process_group": "0",
            "seq": 5,
            "field": "op",
        },
    },
    "size_mismatch": {
        "description": "rank 1 all-reduces 8 elements where ranks 0, 2, 3 all-reduce 4 (seq 5)",
        "first_finding": {
            "kind": "mismatch",
            "ranks": [1],
            "process_group": "0",
            "seq": 5,
            "field": "shape",
        },
    },
    "subgroup_hang": {
        "description": (
            "groups [0,1] and [2,3]; rank 3 never enters its subgroup's third all_reduce, so rank 2 "
            "waits there and ranks 0 and 1 wait in the next world all_reduce"
        ),
        "first_finding": {
            "kind": "not_arrived",
            "ranks": [3],
            "process_group": "2",
            "seq": 3,
            "op": "all_reduce",
        },
    },
}


def record(scenario: str) -> None:
    """Run one scenario's job and write both sample folders."""
    pdir, jdir = HERE / scenario, HERE / f"{scenario}-json"
    for d in (pdir, jdir):
        shutil.rmtree(d, ignore_errors=True)
    subprocess.run(
        [sys.executable, str(SCRIPT), scenario, str(pdir), str(jdir)], check=True, timeout=120
    )
    for d, form in ((pdir, "pickle"), (jdir, "JSON")):
        spec = SCENARIOS[scenario]
        expected = {
            "scenario": d.name,
            "description": f"{spec['description']} (PyTorch native dumps, {form} form, torch gloo)",
            "world_size": 4,
            "exit_status": 1,
            "first_finding": spec["first_finding"],
        }
        (d / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")


def main() -> None:
    for scenario in sys.argv[1:] or list(SCENARIOS):
        record(scenario)


if __name__ == "__main__":
    main()
