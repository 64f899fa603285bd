"""Real 4-rank pipeline-parallel gloo jobs (torch.distributed.pipelining, 2 replicas x 2
stages): a slow rank is named as a slow worker, with the rank it held up folded under it; a
heavier last stage is named as a slow stage; a healthy job gets neither.

One driver (scripts/pipeline.py --runs) imports torch once and forks the three jobs in turn,
each dumping at the end of its loop. The shapes are wide (a slow rank computes twice as long)
so that a loaded machine's scheduling noise does not blur them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flightrec.analysis import analyze_dir
from flightrec.analysis.facts.lateness import StragglerEvidence
from flightrec.analysis.findings.slow_stage import SlowStageEvidence
from flightrec.analysis.model import Action, FindingKind
from tests.integration.jobs import SCRIPTS, child_env

SHAPES = ("healthy", "slow-rank", "heavy-last")


def test_pipelines_slow_rank_heavy_stage_and_healthy(tmp_path: Path) -> None:
    cmd = [
        sys.executable, str(SCRIPTS / "pipeline.py"), "--runs", ",".join(SHAPES),
        "--out", str(tmp_path), "--steps", "12", "--slow-rank", "2",
    ]  # fmt: skip
    result = subprocess.run(
        cmd, env=child_env(flightrec=False), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = {shape: analyze_dir(str(tmp_path / shape)) for shape in SHAPES}
    for report in reports.values():
        assert report.ranks_with_dump == (0, 1, 2, 3)

    assert reports["healthy"].findings == []

    # Rank 2 (stage 0 of replica 1) computes twice as long: it is last at every data-parallel
    # all_reduce of its stage, and rank 3 (its next stage), which waited on its sends, is
    # folded under it rather than blamed.
    (slow,) = reports["slow-rank"].findings
    assert (slow.kind, slow.ranks) == (FindingKind.STRAGGLER, (2,)), slow.summary
    ev = slow.evidence
    assert isinstance(ev, StragglerEvidence) and ev.slow_worker, slow.summary
    assert (ev.stage, ev.stages) == (0, 2)
    assert ev.own_time is not None and ev.own_time.share > 1.3 * ev.own_time.others_share
    assert {r for x in slow.explains for r in x.ranks} <= {3}
    assert "is a slow worker (stage 0 of 2)" in slow.summary
    assert slow.advice is not None and slow.advice.action is Action.RESTART

    # The last stage (ranks 1 and 3) computes twice as long: stage imbalance, no single rank.
    (heavy,) = reports["heavy-last"].findings
    assert (heavy.kind, heavy.ranks) == (FindingKind.SLOW_STAGE, (1, 3)), heavy.summary
    assert isinstance(heavy.evidence, SlowStageEvidence) and heavy.evidence.stage == 1
    assert "Stage 1 of 2 (the last stage) is slower than the others" in heavy.summary
    assert heavy.advice is not None and heavy.advice.action is Action.FIX_CODE
