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

With torch 2.15 or later, ``hook_hang`` and ``torchft_hang`` record what 2.15's hook-based
recorder writes (``HOOK_SCENARIOS``, tests/integration/native_scripts/hook_job.py), and
``torchcomms_hang`` is built per torchcomms' writer code (samples/native/torchcomms.py: only
a GPU job writes it).
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


# Forms torch 2.15 writes (tests/integration/native_scripts/hook_job.py, torch 2.15 or later):
# its hook-based recorder on a backend without one of its own, dumped by torch's own writer.
HOOK_SCENARIOS: dict[str, dict[str, object]] = {
    "hook_hang": {
        "layout": "plain",
        "description": (
            "rank 2 never enters the third step's all_reduce; recorded by torch 2.15's "
            "FlightRecorderHook on an out-of-tree backend ('relay', forwarding to gloo): "
            "'relay:all_reduce' entries with no start or completion times, written by torch's "
            "_dump_fr_trace_file as comm_lib_trace_rank_<r> (PyTorch native dumps, pickle form)"
        ),
        "first_finding": {
            "kind": "not_arrived",
            "ranks": [2],
            "process_group": "0",
            "seq": 5,
            "op": "all_reduce",
        },
    },
    "torchft_hang": {
        "layout": "torchft",
        "description": (
            "torchft's layout: two replica groups of two ranks, each with its own default group, "
            "dumped per quorum into trace_quorum_<q>/<global rank> (TORCH_FR_DUMP_DYNAMIC_FILE_NAME"
            "=1, as torchft's Manager sets it); quorum 1 healthy, in quorum 2 global rank 3 never "
            "enters its replica group's third all_reduce (torch 2.15, hook-based recorder on the "
            "'relay' backend, pickle form)"
        ),
        "first_finding": {
            "kind": "not_arrived",
            "ranks": [3],
            "process_group": "replica1/0",
            "seq": 5,
            "op": "all_reduce",
        },
    },
}
HOOK_SCRIPT = ROOT / "tests" / "integration" / "native_scripts" / "hook_job.py"


def record_hook(scenario: str) -> None:
    """Run one torch 2.15 scenario and write its sample folder."""
    spec = HOOK_SCENARIOS[scenario]
    d = HERE / scenario
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run(
        [sys.executable, str(HOOK_SCRIPT), "hang", str(d), str(spec["layout"])],
        check=True, timeout=300,
    )  # fmt: skip
    expected = {
        "scenario": scenario,
        "description": spec["description"],
        "world_size": 4,
        "exit_status": 1,
        "first_finding": spec["first_finding"],
    }
    (d / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")


def main() -> None:
    wanted = sys.argv[1:] or [*SCENARIOS, *HOOK_SCENARIOS, "torchcomms_hang"]
    for scenario in wanted:
        if scenario in HOOK_SCENARIOS:
            record_hook(scenario)
        elif scenario == "torchcomms_hang":
            from construct_torchcomms import write_sample

            write_sample(HERE / scenario)
        else:
            record(scenario)


if __name__ == "__main__":
    main()
