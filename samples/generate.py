"""Re-record the shipped samples: real 4-rank gloo jobs traced by flightrec, one per fault.

    python samples/generate.py                 # every scenario into samples/<scenario>/
    python samples/generate.py stalled_rank    # just one

Each scenario runs ``samples/train_job.py`` on 4 processes with FLIGHTREC=1 (the job never
imports flightrec), waits until the ranks' hang dumps are written, then does what torchrun does
to the survivors of a failed job: SIGTERM, which makes each rank dump once more. Every dump file
is kept, so the samples also exercise "several dumps per rank", and so are the black-box ring
files the ranks left behind. ``expected.json`` states the
injected fault's ground truth; it is written from the scenario table below, never from the
analyzer's output. The integration tests record the same scenarios live with ``record()``.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent
sys.path.insert(0, str(SAMPLES.parent))

from tests.integration.jobs import start_job  # noqa: E402

JOB = SAMPLES / "train_job.py"
WORLD = 4


@dataclass(frozen=True)
class Scenario:
    """One recorded fault and its ground truth."""

    name: str
    fault: str
    culprit: int
    description: str
    expected: dict[str, Any] | None
    hang_dumps: int = WORLD  # dumps to wait for before ending the job
    env: dict[str, str] = field(default_factory=dict)


SCENARIOS = [
    Scenario(
        "healthy", "none", 0,
        "Five clean steps; every rank dumps at exit (FLIGHTREC_DUMP_ON_EXIT=1).",
        None, env={"FLIGHTREC_DUMP_ON_EXIT": "1"},
    ),
    Scenario(
        "stalled_rank", "stall", 2,
        "Rank 2 hangs writing a checkpoint shard (outside any collective) at step 3; "
        "ranks 0, 1, 3 wait in the loss all_reduce on the world group.",
        {"kind": "not_arrived", "ranks": [2], "process_group": "0", "op": "all_reduce"},
    ),
    Scenario(
        "crashed_rank", "crash", 1,
        "Rank 1 is SIGKILLed mid-step (as by the OOM killer) and writes no dump; its "
        "black box (the memory-mapped ring) survives. Its peers' next collective fails.",
        {"kind": "dead_rank", "ranks": [1]}, hang_dumps=WORLD - 1,
    ),
    Scenario(
        "op_mismatch", "op_mismatch", 3,
        "A rank-dependent branch makes rank 3 call broadcast where ranks 0-2 all_reduce the loss.",
        {"kind": "mismatch", "ranks": [3], "field": "op", "process_group": "0"},
    ),
    Scenario(
        "size_mismatch", "size_mismatch", 3,
        "Rank 3 appends an extra metric: its loss tensor has 2 elements, the others' 1.",
        {"kind": "mismatch", "ranks": [3], "field": "shape", "process_group": "0"},
    ),
    Scenario(
        "dtype_mismatch", "dtype_mismatch", 3,
        "Rank 3's loss is float64, the others' float32; gloo aborts the rank that receives "
        "the oversized message, which leaves no dump.",
        {"kind": "mismatch", "ranks": [3], "field": "dtype", "process_group": "0"},
        hang_dumps=WORLD - 1,
    ),
    Scenario(
        "p2p_deadlock", "p2p_deadlock", 1,
        "Pipeline stage 1 waits for stage 2's gradient before sending its activations; "
        "stage 2 waits for those activations: a send/recv cycle between ranks 1 and 2.",
        {"kind": "p2p_deadlock", "ranks": [1, 2]},
    ),
    Scenario(
        "subgroup_hang", "subgroup_stall", 3,
        "Rank 3 stalls before the tensor-parallel all_reduce of its pair group [2, 3]; "
        "rank 2 waits there, ranks 0 and 1 wait in the world all_reduce.",
        {"kind": "not_arrived", "ranks": [3], "op": "all_reduce"},
    ),
    Scenario(
        "skipped_collective", "skip_collective", 2,
        "A rank-dependent branch makes rank 2 skip the tensor-parallel all_reduce at step 3: "
        "rank 3 waits for it there while rank 2, moved on, waits in the world all_reduce.",
        {"kind": "not_arrived", "ranks": [2], "op": "all_reduce"},
    ),
    Scenario(
        "extra_collective", "extra_collective", 2,
        "Rank 2 all-reduces an extra metric at step 3: it pairs with its peers' loss "
        "all_reduce, so rank 2 waits in one more all_reduce while its peers go on to the "
        "next step's pipeline exchange and wait for rank 2 there.",
        {"kind": "not_arrived", "ranks": [2]},
    ),
    Scenario(
        "early_exit", "early_exit", 2,
        "Uneven data: rank 2's shard runs out one step early; it leaves the loop for the "
        "final barrier while its pipeline neighbours wait for it in send and recv.",
        {"kind": "not_arrived", "ranks": [2]},
    ),
]  # fmt: skip

BY_NAME = {s.name: s for s in SCENARIOS}


def record(scenario: Scenario, out: Path, timeout: float = 60.0) -> list[Path]:
    """Run one scenario and copy its dump files into ``out``; returns the copied paths.

    Raises:
        TimeoutError: the job did not produce its dumps in time (with the ranks' output).
    """
    env = {
        "SCENARIO_FAULT": scenario.fault,
        "SCENARIO_RANK": str(scenario.culprit),
        "SCENARIO_PG_TIMEOUT": "30",
        "FLIGHTREC_TIMEOUT": "2",
        "FLIGHTREC_BUFFER": "256",  # keeps the committed black-box files small
        **scenario.env,
    }
    with (
        tempfile.TemporaryDirectory(prefix="flightrec-sample-") as tmp,
        start_job(JOB, world_size=WORLD, env=env, workdir=Path(tmp)) as job,
    ):
        if scenario.expected is None:
            job.wait(timeout)
            job.wait_for_dumps(WORLD, timeout=10)
        else:
            job.wait_for_dumps(scenario.hang_dumps, timeout=timeout)
            time.sleep(1.0)  # let ranks that were asked to dump finish writing
            before = len(job.dump_files())
            for rank, proc in enumerate(job.procs):
                if proc.poll() is None:
                    job.signal(rank, signal.SIGTERM)
            alive = sum(1 for p in job.procs if p.poll() is None)
            deadline = time.monotonic() + 10
            while len(job.dump_files()) < before + alive and time.monotonic() < deadline:
                time.sleep(0.1)
        # Everything the job left in its FLIGHTREC_DIR, as a user would find it: dump files and
        # the black-box rings (.ring, .ring.tables) of ranks that did not exit cleanly.
        out.mkdir(parents=True, exist_ok=True)
        left = sorted(
            p for p in job.dump_dir.iterdir() if p.is_file() and not p.name.startswith(".")
        )
        return [Path(shutil.copy2(f, out / f.name)) for f in left]


def expected_json(scenario: Scenario) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "world_size": WORLD,
        "exit_status": 0 if scenario.expected is None else 1,
        "first_finding": scenario.expected,
    }


def main(names: list[str]) -> int:
    for name in names or list(BY_NAME):
        scenario = BY_NAME[name]
        out = SAMPLES / name
        shutil.rmtree(out, ignore_errors=True)
        files = record(scenario, out)
        (out / "expected.json").write_text(json.dumps(expected_json(scenario), indent=2) + "\n")
        print(f"{name}: {len(files)} dump files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
