"""Ray Train, as its users run it: ``TorchTrainer`` with four CPU workers, flightrec turned on
through the job's ``runtime_env`` (the driver itself is not traced), dumps in an absolute
``FLIGHTREC_DIR``. Ray Train runs the training function in a thread of its own: the verdict
must name the line that thread stalled at, not the main thread's ``Worker.main_loop``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip(
    "ray.train.torch",
    reason="Ray Train is not installed (.ci/frameworks.sh installs the frameworks)",
)

from tests.integration.frameworks import common as fw
from tests.integration.jobs import start_job

SCRIPT = fw.SCRIPTS / "ray_job.py"


def test_a_hung_worker_is_named_by_world_rank_host_pid_and_line(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    args = ["stall", "--dumps", str(dumps), "--timeout", "8"]
    env = {"RAY_DISABLE_USAGE_STATS": "1"}
    with start_job(SCRIPT, args, launch="self", flightrec=False, env=env, workdir=tmp_path) as job:
        out = fw.wait_for_text(job, fw.VERDICT_DONE)
        report = fw.analyzed(job)
    line = fw.fault_line("ray_job.py", "stall")
    # Ray's own list of the worker group: which process is world rank 2, on which host
    worker = re.search(r"\(ip=(\S+), pid=(\d+)\) world_rank=2,", out)
    assert worker, out
    said = fw.log_verdict(out)
    assert re.search(rf"Rank 2 \(\S+, pid {worker.group(2)}, cpu\) never entered", said), said
    assert f"in train_loop at {line}" in said, said
    assert "main_loop" not in said, said
    summary = fw.assert_names(report, "not_arrived", 2, line)
    assert f"pid {worker.group(2)}" in summary, summary
    assert all(p.parent == dumps for p in job.dump_files())
