"""Promise 2: the evidence survives. A dump is complete or absent; a rank whose Python cannot
run still leaves its threads' stacks.

(The black box of a SIGKILLed rank being readable and named is
``test_coverage_stacks.py::test_a_rank_that_dies_hard_is_named_from_its_black_box``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightrec.analysis import analyze_dir
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.rawstacks import stacks_path
from flightrec.format.read import read_dump
from flightrec.readers.blackbox import read_blackbox
from flightrec.readers.rawstacks import attach
from flightrec.report.json import finding_to_dict
from tests.integration.jobs import REPO, start_job

pytestmark = pytest.mark.integration
SCRIPT = "reliability_job.py"


def analyze(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "cli")])
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", "analyze", str(folder)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_kill_9_while_writing_large_dumps_leaves_only_whole_files(tmp_path: Path) -> None:
    # One rank fills a 20,000-entry ring, then writes ~1 MB dumps back to back. It is killed
    # with SIGKILL the moment a temporary file shows up (a write in progress), or after a few
    # dumps if the moment was missed.
    env = {"FLIGHTREC_BUFFER": "20000"}
    args = ["--fault", "dump-forever", "--fill", "20000"]
    with start_job(SCRIPT, args, world_size=1, env=env, workdir=tmp_path) as job:
        job.wait_for_output(0, "DUMPED 2", timeout=90)
        deadline = time.monotonic() + 10
        caught = False
        while time.monotonic() < deadline and not caught:
            caught = any(p.name.startswith(".tmp-") for p in job.dump_dir.iterdir())
            if not caught:
                time.sleep(0.0005)
        job.signal(0, signal.SIGKILL)
        assert job.wait(10) == [-9]
    finals = [p for p in job.dump_dir.glob("*.frdump") if not p.name.startswith(".")]
    assert len(finals) >= 2
    for path in finals:  # every file that has a dump's name holds a whole dump
        dump = read_dump(path)
        assert len(dump.entries.record_id) == 20000
    # What a kill mid-write leaves is a hidden temporary, never a file with a dump's name.
    leftovers = [p for p in job.dump_dir.iterdir() if p.name.startswith(".tmp-")]
    if not leftovers:  # the kill missed the write window: leave what it would have left
        half = finals[0].read_bytes()
        (job.dump_dir / ".tmp-killed.frdump").write_bytes(half[: len(half) // 2])
    result = analyze(job.dump_dir)
    assert result.returncode in (0, 1), result.stderr
    assert ".tmp-" not in result.stderr + result.stdout
    assert "truncated" not in result.stderr and "damaged" not in result.stderr, result.stderr


def test_a_rank_holding_the_gil_in_a_c_call_leaves_raw_stacks(tmp_path: Path) -> None:
    # Rank 1 holds the GIL in a 30 s C call at step 5: none of its Python threads can run, so
    # it cannot dump when rank 0's watchdog asks. faulthandler's C thread still writes its
    # stacks beside its black box, which is what the rank leaves when it is then killed.
    env = {"FLIGHTREC_TIMEOUT": "1"}
    with start_job(
        SCRIPT, ["--fault", "gil-wedge"], world_size=2, env=env, workdir=tmp_path
    ) as job:
        job.wait_for_output(1, "WEDGED", timeout=60)
        job.wait_for_dumps(1, timeout=30, reason="watchdog_timeout")
        deadline = time.monotonic() + 20
        while True:
            raw = list(job.dump_dir.glob(".flightrec-rank00001-*.ring.stacks"))
            if raw and "wedged_in_c_call" in raw[0].read_text(errors="replace"):
                break
            assert time.monotonic() < deadline, (raw, job.output())
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0's request has had time to reach rank 1: it did not dump
        job.signal(1, signal.SIGKILL)
        assert job.wait(30)[1] == -9
    dumped = {read_dump(p).header.rank for p in job.dump_files()}
    assert dumped == {0}, dumped  # rank 1's Python never ran again
    (ring,) = job.dump_dir.glob("flightrec-rank00001-*.ring")
    assert stacks_path(ring) == raw[0]
    dump = read_blackbox(ring)
    assert attach(dump, ring)
    (main,) = [t for t in dump.threads if t.is_main]
    names = [dump.strings[dump.frames[i].name] for i in dump.stacks[main.stack].frames]
    assert names[:4] == ["wedged_in_c_call", "wedge_rank_1", "<listcomp>", "<lambda>"], names
    frame = dump.frames[dump.stacks[main.stack].frames[0]]
    assert dump.strings[frame.file].endswith("reliability_job.py") and frame.line > 0
    # The rest of the black box is intact: rank 1's completed all_reduces up to step 5.
    states = list(dump.entries.state)
    assert states and all(s == pb.COMPLETED for s in states), states
    # The analysis reads the stacks with the black box: where rank 1 was is in the report.
    report = analyze_dir(str(job.dump_dir))
    blamed = report.findings[0]
    assert blamed.ranks == (1,), blamed
    assert '"function": "wedged_in_c_call"' in json.dumps(finding_to_dict(blamed)), blamed.evidence
