"""A folder of several jobs (a reused FLIGHTREC_DIR), and a folder with no dump in it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from flightrec.analysis.loading.loader import AnalysisOptions, load_dir
from flightrec.errors import NoDumpsError, UsageError
from flightrec.format.read import read_dump
from flightrec.format.write import write_dump
from tests.unit.factories import Job, healthy
from tests.unit.test_analysis_loader import stalled


def two_jobs(folder: Path) -> None:
    stalled().write(folder)  # job-1, the newest
    old = healthy(Job(job_id="old-job"))
    for rank in range(2):
        write_dump(old.build(rank, wall_offset_s=-3600), folder / "old", f"r{rank}.frdump")


def test_the_newest_job_is_analysed_and_the_others_named(tmp_path: Path) -> None:
    two_jobs(tmp_path)
    run = load_dir(tmp_path)
    assert {d.header.job_id for d in run.dumps.values()} == {"job-1"}
    (note,) = [n for n in run.notes if "jobs" in n]
    assert note.startswith("this folder holds 2 jobs: analysing the newest, 'job-1' (4 ranks")
    assert "ignored another job 'old-job' (2 ranks, last dump " in note
    assert note.endswith("choose one with --job ID")


def test_job_picks_one(tmp_path: Path) -> None:
    two_jobs(tmp_path)
    run = load_dir(tmp_path, AnalysisOptions(job="old-job"))
    assert {d.header.job_id for d in run.dumps.values()} == {"old-job"}
    assert sorted(run.dumps) == [0, 1]
    assert not any("jobs" in n for n in run.notes)


def test_an_unknown_job_is_a_usage_error_naming_the_jobs(tmp_path: Path) -> None:
    two_jobs(tmp_path)
    with pytest.raises(UsageError, match=r"no dump of job 'nope'; its jobs: 'job-1' \(4 ranks"):
        load_dir(tmp_path, AnalysisOptions(job="nope"))


def test_no_dump_says_what_the_folder_holds(tmp_path: Path) -> None:
    with pytest.raises(NoDumpsError, match=r"\(the folder holds no files\)$"):
        load_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NoDumpsError, match="its one file is not a flightrec, black-box or"):
        load_dir(tmp_path)
    (tmp_path / ".flightrec-endpoint").write_text("flightrec endpoint 1\n")
    with pytest.raises(NoDumpsError, match="a traced job used this folder but wrote no dump"):
        load_dir(tmp_path)


def test_dump_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        path = write_dump(stalled().build(0), tmp_path, "d.frdump")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664
    assert [p.name for p in tmp_path.iterdir()] == ["d.frdump"]  # no temporary left
    assert read_dump(path).header.rank == 0
