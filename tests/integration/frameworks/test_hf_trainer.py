"""The transformers ``Trainer``, as its users run it: ``torchrun --nproc-per-node 4
hf_trainer_job.py`` with a tiny GPT-2 built from its config, traced by ``FLIGHTREC=1``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest

pytest.importorskip(
    "transformers",
    reason="transformers is not installed (.ci/frameworks.sh installs the frameworks)",
)

from tests.integration.frameworks import common as fw
from tests.integration.jobs import Job, start_job

SCRIPT = "hf_trainer_job.py"


def run(tmp_path: Path, fault: str, env: dict[str, str]) -> AbstractContextManager[Job]:
    return start_job(fw.SCRIPTS / SCRIPT, [fault], launch="torchrun", env=env, workdir=tmp_path)


def test_a_rank_stalled_in_a_callback_is_named_at_its_line(tmp_path: Path) -> None:
    with run(tmp_path, "stall", fw.FAULT_ENV) as job:
        out = fw.stalled(job, SCRIPT)
    # the others wait inside Trainer.train: their line is the user's call of it
    assert "via Trainer.train" in out, out


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path: Path) -> None:
    with run(tmp_path, "raise", fw.FAULT_ENV) as job:
        fw.raised(job, SCRIPT)


def test_a_mismatched_gather_names_accelerators_gather(tmp_path: Path) -> None:
    with run(tmp_path, "mismatch", fw.FAULT_ENV) as job:
        fw.mismatched(job, SCRIPT, via="Accelerator.gather")


def test_a_healthy_run_reports_nothing(tmp_path: Path) -> None:
    with run(tmp_path, "none", fw.HEALTHY_ENV) as job:
        fw.healthy(job)
