"""DeepSpeed on CPU, as its users run it: ``torchrun --nproc-per-node 4 deepspeed_job.py``
with ``DS_ACCELERATOR=cpu`` (gloo where oneCCL is not installed), traced by ``FLIGHTREC=1``.

DeepSpeed's CPU backend compiles a small C++ op (its shared-memory all-reduce) with g++ the
first time a process group starts; the module builds it once, and skips, saying why, where
it cannot be built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (.ci/frameworks.sh installs the frameworks)"
)

from tests.integration.frameworks import common as fw
from tests.integration.jobs import child_env, start_job

SCRIPT = fw.SCRIPTS / "deepspeed_job.py"
BUILD = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
BUILD_S = 900.0
"""The op takes about 2 minutes of CPU to build; far longer on a loaded machine."""


@pytest.fixture(scope="module")
def cpu_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a DeepSpeed CPU job, with its C++ op built once: in
    ``TORCH_EXTENSIONS_DIR`` where it is set (.ci/frameworks.sh builds it there first), else
    in a folder of this session's (a build killed half-way leaves a lock that would block
    every later one in a shared folder)."""
    ext = os.environ.get("TORCH_EXTENSIONS_DIR") or str(tmp_path_factory.mktemp("ext"))
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": ext}
    try:
        done = subprocess.run(
            [sys.executable, "-c", BUILD], env=child_env(env, flightrec=False),
            capture_output=True, text=True, timeout=BUILD_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip(f"DeepSpeed's CPU op did not build within {BUILD_S:.0f} s")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"DeepSpeed's CPU backend does not build here: {why}")
    return {**env, **fw.FAULT_ENV}


def test_a_stalled_rank_is_named_at_its_line(tmp_path: Path, cpu_env: dict[str, str]) -> None:
    with start_job(SCRIPT, ["stall"], launch="torchrun", env=cpu_env, workdir=tmp_path) as job:
        fw.stalled(job, "deepspeed_job.py")


def test_a_mismatched_all_reduce_names_deepspeed_comm(
    tmp_path: Path, cpu_env: dict[str, str]
) -> None:
    with start_job(SCRIPT, ["mismatch"], launch="torchrun", env=cpu_env, workdir=tmp_path) as job:
        out = fw.wait_for_text(job, fw.VERDICT_DONE)
        fw.mismatched(job, "deepspeed_job.py", via="deepspeed.comm.all_reduce")
    # the verdict in the log names the call too (the summaries keep it)
    said = fw.log_verdict(out)
    line = fw.fault_line("deepspeed_job.py", "mismatch")
    assert f"{line} via deepspeed.comm.all_reduce" in said, said
