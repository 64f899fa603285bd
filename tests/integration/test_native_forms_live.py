"""What torch 2.15 writes, recorded live and diagnosed: its hook-based recorder on a backend
without one of its own, dumped by torch's own writer, plainly and in torchft's quorum folders
(tests/integration/native_scripts/hook_job.py). Skipped on a torch without that recorder; CI
runs it on the newest torch (.ci/newest.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flightrec.analysis import analyze_dir

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parent / "native_scripts" / "hook_job.py"


def _needs_the_hook() -> None:
    native = pytest.importorskip("torch._C._distributed_c10d")
    if not hasattr(native, "FlightRecorderHook") or not hasattr(native, "_dump_fr_trace_file"):
        pytest.skip("this torch has no hook-based recorder (torch 2.15 and later have)")
    if sys.version_info >= (3, 13):
        # torch 2.15 on 3.13: _maybe_attach_flight_recorder segfaults at init_process_group for
        # a backend defined in Python (the job's "relay"), flightrec or not. Its dumps read
        # the same on any Python: samples/native/hook_hang was recorded on 3.11.
        pytest.skip("torch 2.15 crashes attaching its recorder hook to a Python backend on 3.13")


@pytest.mark.parametrize(
    ("layout", "culprit", "group"), [("plain", 2, "0"), ("torchft", 3, "replica1/0")]
)
def test_a_hang_recorded_by_the_hook_is_named(
    tmp_path: Path, layout: str, culprit: int, group: str
) -> None:
    _needs_the_hook()
    out = tmp_path / "dumps"
    # A hang timeout of 6 s: gloo connects within it even on a loaded machine.
    env = {**os.environ, "FR_JOB_TIMEOUT_S": "6"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "hang", str(out), layout],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    first = analyze_dir(str(out)).findings[0]
    assert (first.kind, first.ranks, first.process_group, first.op) == (
        "not_arrived", (culprit,), group, "all_reduce",
    )  # fmt: skip
