"""Lightning, as its users run it: ``python lightning_job.py`` with ``Trainer(strategy="ddp")``
(or an FSDP strategy); Lightning's launcher starts the other ranks, ``FLIGHTREC=1`` traces them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest

pytest.importorskip(
    "lightning", reason="Lightning is not installed (.ci/frameworks.sh installs the frameworks)"
)

from tests.integration.frameworks import common as fw
from tests.integration.jobs import Job, start_job

SCRIPT = "lightning_job.py"


def run(tmp_path: Path, args: list[str], env: dict[str, str]) -> AbstractContextManager[Job]:
    return start_job(fw.SCRIPTS / SCRIPT, args, launch="self", env=env, workdir=tmp_path)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_stalled_rank_is_named_at_its_line(tmp_path: Path, strategy: str) -> None:
    with run(tmp_path, ["stall", "--strategy", strategy], fw.FAULT_ENV) as job:
        fw.stalled(job, SCRIPT)


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path: Path) -> None:
    with run(tmp_path, ["raise"], fw.FAULT_ENV) as job:
        fw.raised(job, SCRIPT)


def test_a_mismatched_all_gather_names_the_lightning_call(tmp_path: Path) -> None:
    with run(tmp_path, ["mismatch"], fw.FAULT_ENV) as job:
        fw.mismatched(job, SCRIPT, via="LightningModule.all_gather")


def test_a_healthy_run_reports_nothing(tmp_path: Path) -> None:
    with run(tmp_path, ["none"], fw.HEALTHY_ENV) as job:
        fw.healthy(job)
