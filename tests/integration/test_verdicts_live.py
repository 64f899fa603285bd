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

from flightrec.format.read import read_dump
from tests.integration.jobs import REPO, Job, start_job
from tests.integration.test_cli_analyze import flightrec

WORLD = 4
OWN = f"{REPO / 'flightrec'}/"
"""flightrec's package folder (the repository's own folder may well be named flightrec too)."""


def analyze(job: Job, *extra: str) -> tuple[int, dict[str, Any]]:
    result = flightrec("analyze", job.dump_dir, "--json", *extra)
    assert result.returncode in (0, 1), result.stderr + job.output()
    return result.returncode, json.loads(result.stdout)


def text_report(job: Job) -> str:
    return flightrec("analyze", job.dump_dir, env={"COLUMNS": "200"}).stdout


def test_dumps_after_destroy_keep_rank_world_and_job(tmp_path: Path) -> None:
    """Exit dumps written after destroy_process_group() under mp.spawn, no RANK anywhere."""
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_TIMEOUT": "30"}
    with start_job("verdicts.py", ["destroy"], env=env, launch="spawn", workdir=tmp_path) as job:
        assert job.wait(timeout=120) == [0], job.output()
    headers = [d.header for items in job.dumps().values() for _, d in items]
    assert sorted(h.rank for h in headers) == list(range(WORLD))
    assert {h.world_size for h in headers} == {WORLD}
    assert len({h.job_id for h in headers}) == 1 and headers[0].job_id
    status, report = analyze(job)
    assert status == 0, report
    assert report["ranks_with_dump"] == list(range(WORLD))
    assert report["findings"] == [] and report["problems"] == []


def test_flightrecs_own_frames_are_never_where_a_rank_is(tmp_path: Path) -> None:
    """A healthy job's exit dumps run from atexit, inside flightrec: they show none of its
    frames; the ranks returned from main. (Signal dumps: the hang test below.)"""
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_TIMEOUT": "30"}
    with start_job("verdicts.py", ["destroy"], world_size=2, env=env, workdir=tmp_path) as job:
        assert job.wait(timeout=120) == [0, 0], job.output()
    for items in job.dumps().values():
        for _, dump in items:
            (main,) = [t for t in dump.threads if t.is_main]
            assert list(dump.stacks[main.stack].frames) == [], "the program had returned"
            for t in dump.threads:
                if not t.name.startswith("flightrec-"):
                    files = [dump.strings[dump.frames[f].file] for f in dump.stacks[t.stack].frames]
                    assert not any(f.startswith(OWN) for f in files), (t.name, files)
    status, report = analyze(job)
    assert status == 0 and report["findings"] == [], report["findings"]
    rendered = text_report(job)
    assert "ranks 0-1 exited (returned from main)" in rendered, rendered
    assert "flightrec/" not in rendered and "Dumper" not in rendered, rendered


def test_the_hang_is_described_not_the_breakdown_after_it(tmp_path: Path) -> None:
    """Rank 1 sits in its evaluation loop while the others wait in DDP's backward; their
    watchdogs fire, then gloo times them out (they raise and exit, dumping), then rank 1 is
    interrupted (SIGINT: what ``torch.multiprocessing.spawn`` children get when their parent
    goes) and exits, dumping again. The verdict is still rank 1, in ``evaluate``, at its line."""
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", "FLIGHTREC_TIMEOUT": "2"}
    with start_job(
        "verdicts.py", ["eval_sleep", "--culprit", "1", "--pg-timeout", "8"], env=env,
        workdir=tmp_path,
    ) as job:  # fmt: skip
        job.wait_for_output(1, "EVALUATING", timeout=60)
        job.wait_for_dumps(count=3, timeout=60, reason="process_exit")  # the timed-out ranks
        job.signal(1, signal.SIGUSR1)  # a signal dump, taken while it sleeps
        (usr1,) = job.wait_for_dumps(count=1, timeout=30, reason="signal_usr1")
        job.signal(1, signal.SIGINT)
        try:  # (a loaded machine takes seconds to end four processes that held torch)
            job.wait(timeout=60)
        except TimeoutError as exc:  # say where rank 1 is held up, not only that it is
            raise AssertionError(f"{exc}\n{job.where_stuck(1)}") from None
    dump = read_dump(usr1)
    (main,) = [t for t in dump.threads if t.is_main]
    top = dump.frames[dump.stacks[main.stack].frames[0]]
    assert dump.strings[top.name] == "evaluate", dump.strings[top.file]
    assert len(job.wait_for_dumps(count=4, timeout=1, reason="process_exit")) == 4
    status, report = analyze(job)
    first = report["findings"][0]
    assert status == 1 and first["kind"] == "not_arrived" and first["ranks"] == [1], first
    assert "in evaluate at scripts/verdicts.py:" in first["summary"], first["summary"]
    assert any("analysing the hang" in n for n in report["notes"]), report["notes"]
    rendered = text_report(job)
    assert "flightrec/" not in rendered.split("Stack of rank 1")[0], rendered


def test_a_rank_that_raises_mid_training_is_named_with_its_exception(tmp_path: Path) -> None:
    """Rank 2 raises ValueError in compute_loss at step 3 (torch.multiprocessing.spawn: the
    child catches it and calls sys.exit(1); no excepthook runs). No FLIGHTREC_DUMP_ON_EXIT:
    dying of an exception is reason enough to dump."""
    env = {"FLIGHTREC_TIMEOUT": "30"}
    with start_job(
        "verdicts.py", ["raise_mid", "--culprit", "2", "--pg-timeout", "20"], env=env,
        launch="spawn", workdir=tmp_path,
    ) as job:  # fmt: skip
        codes = job.wait(timeout=120)
    assert codes != [0], job.output()
    status, report = analyze(job)
    first = report["findings"][0]
    assert status == 1 and first["kind"] == "dead_rank" and first["ranks"] == [2], first
    assert "died of ValueError: loss is NaN at step 3 at scripts/verdicts.py:" in first["summary"]
    line = _line('raise ValueError(f"loss is NaN')
    assert f"scripts/verdicts.py:{line} in compute_loss" in first["summary"], first["summary"]
    exc = first["evidence"]["exception"]
    assert exc["seen_by"] == "sys.exit" and exc["traceback"][0]["function"] == "compute_loss"
    assert exc["traceback"][0]["code"].startswith("raise ValueError")
    assert not any(f["file"].startswith(OWN) for f in exc["traceback"]), exc["traceback"]
    rendered = text_report(job)
    assert "died of ValueError" in rendered and "Traceback of rank 2" in rendered, rendered


def test_every_rank_raising_before_any_collective_is_a_problem(tmp_path: Path) -> None:
    with start_job(
        "verdicts.py", ["raise_early"], env={"FLIGHTREC_TIMEOUT": "30"}, workdir=tmp_path
    ) as job:
        codes = job.wait(timeout=120)
    assert all(c != 0 for c in codes), job.output()
    status, report = analyze(job)
    assert status == 1, report
    assert report["ranks_with_dump"] == list(range(WORLD))
    first = report["findings"][0]
    assert first["kind"] == "dead_rank" and first["ranks"] == list(range(WORLD)), first
    assert "died of ValueError: no such config: /nonexistent/config.yaml" in first["summary"]
    assert "in load_config, before any collective" in first["summary"], first["summary"]


def _line(text: str) -> str:
    """The line number of ``text`` in the job script."""
    lines = (Path(__file__).parent / "scripts" / "verdicts.py").read_text().splitlines()
    return str(next(i for i, line in enumerate(lines, 1) if text in line))
