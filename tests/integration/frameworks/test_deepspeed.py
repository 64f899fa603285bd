"""DeepSpeed on CPU, as its users run it: ``torchrun --nproc-per-node 4 deepspeed_job.py``
with ``DS_ACCELERATOR=cpu`` (gloo where oneCCL is not installed), traced by ``FLIGHTREC=1``.

DeepSpeed's CPU backend compiles a small C++ op (its shared-memory all-reduce) with g++ the
first time a process group starts; the module builds it once, and skips, saying why, where
it cannot be built.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (.ci/frameworks.sh installs the frameworks)"
)

from tests.integration.frameworks.common import (
    FAULT_ENV,
    JOB_S,
    SCRIPTS,
    VERDICT_DONE,
    analyzed,
    assert_names,
    fault_line,
    log_verdict,
    wait_for_text,
)
from tests.integration.jobs import child_env, start_job

SCRIPT = SCRIPTS / "deepspeed_job.py"
BUILD = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"


@pytest.fixture(scope="module")
def cpu_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a DeepSpeed CPU job, with its C++ op built (once, in a folder of
    this session's: a build killed half-way leaves a lock that would block every later one)."""
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(tmp_path_factory.mktemp("ext"))}
    try:
        done = subprocess.run(
            [sys.executable, "-c", BUILD], env=child_env(env, flightrec=False),
            capture_output=True, text=True, timeout=JOB_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip(f"DeepSpeed's CPU op did not build within {JOB_S:.0f} s")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"DeepSpeed's CPU backend does not build here: {why}")
    return {**env, **FAULT_ENV}


def test_a_stalled_rank_is_named_at_its_line(tmp_path: Path, cpu_env: dict[str, str]) -> None:
    with start_job(SCRIPT, ["stall"], launch="torchrun", env=cpu_env, workdir=tmp_path) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job)
    line = fault_line("deepspeed_job.py", "stall")
    said = log_verdict(out)
    assert "Rank 2 (" in said and "never entered" in said and line in said, said
    assert_names(report, "not_arrived", 2, line)


def test_a_mismatched_all_reduce_names_deepspeed_comm(
    tmp_path: Path, cpu_env: dict[str, str]
) -> None:
    with start_job(SCRIPT, ["mismatch"], launch="torchrun", env=cpu_env, workdir=tmp_path) as job:
        out = wait_for_text(job, VERDICT_DONE)
        report = analyzed(job)
    line = fault_line("deepspeed_job.py", "mismatch")
    said = log_verdict(out)
    assert f"{line} via deepspeed.comm.all_reduce" in said, said
    assert_names(report, "mismatch", 2, line, via="deepspeed.comm.all_reduce")
