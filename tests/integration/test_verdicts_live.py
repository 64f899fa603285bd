"""Verdicts that hold on real jobs (issue 14): real 4-rank gloo jobs not in samples/, analyzed
through the CLI as a user would.

The job script is ``scripts/verdicts.py``: DDP training, ``destroy_process_group()`` in
``finally:``, ranks started by ``torch.multiprocessing.spawn`` without RANK/WORLD_SIZE.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.integration.jobs import Job, start_job
from tests.integration.test_cli_analyze import flightrec

WORLD = 4


def analyze(job: Job, *extra: str) -> tuple[int, dict[str, Any]]:
    result = flightrec("analyze", job.dump_dir, "--json", *extra)
    assert result.returncode in (0, 1), result.stderr + job.output()
    return result.returncode, json.loads(result.stdout)


def text_report(job: Job) -> str:
    return flightrec("analyze", job.dump_dir, env={"COLUMNS": "200"}).stdout


def test_dumps_after_destroy_keep_rank_world_and_job(tmp_path: Path) -> None:
    """Exit dumps written after destroy_process_group() under mp.spawn, no RANK anywhere."""
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_TIMEOUT": "30"}
    with start_job(
        "verdicts.py", ["destroy"], env=env, launch="spawn", workdir=tmp_path
    ) as job:
        assert job.wait(timeout=120) == [0], job.output()
    headers = [d.header for items in job.dumps().values() for _, d in items]
    assert sorted(h.rank for h in headers) == list(range(WORLD))
    assert {h.world_size for h in headers} == {WORLD}
    assert len({h.job_id for h in headers}) == 1 and headers[0].job_id
    status, report = analyze(job)
    assert status == 0, report
    assert report["ranks_with_dump"] == list(range(WORLD))
    assert report["findings"] == [] and report["problems"] == []
