"""Accelerate, as its users run it: ``accelerate launch --multi_gpu --num_processes 4
accelerate_job.py`` (on CPU: torchrun underneath, gloo), traced by ``FLIGHTREC=1``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest

pytest.importorskip(
    "accelerate", reason="accelerate is not installed (.ci/frameworks.sh installs the frameworks)"
)

from tests.integration.frameworks import common as fw
from tests.integration.jobs import Job, free_port, start_job

SCRIPT = "accelerate_job.py"


def run(tmp_path: Path, fault: str, env: dict[str, str]) -> AbstractContextManager[Job]:
    """``accelerate launch`` of the script with 4 CPU processes on this machine."""
    launcher = [
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=4",
        "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
    ]  # fmt: skip
    return start_job(
        fw.SCRIPTS / SCRIPT, [fault], launch="self", launcher=launcher, env=env, workdir=tmp_path
    )


def test_a_stalled_rank_is_named_at_its_line(tmp_path: Path) -> None:
    with run(tmp_path, "stall", fw.FAULT_ENV) as job:
        fw.stalled(job, SCRIPT)


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path: Path) -> None:
    with run(tmp_path, "raise", fw.FAULT_ENV) as job:
        fw.raised(job, SCRIPT)


def test_a_mismatched_gather_names_accelerators_gather(tmp_path: Path) -> None:
    with run(tmp_path, "mismatch", fw.FAULT_ENV) as job:
        fw.mismatched(job, SCRIPT, via="Accelerator.gather")


def test_a_healthy_run_reports_nothing(tmp_path: Path) -> None:
    with run(tmp_path, "none", fw.HEALTHY_ENV) as job:
        fw.healthy(job)
