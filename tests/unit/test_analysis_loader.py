"""Loading a folder: one view per rank, one line per bad file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightrec.analysis import analyze_dir
from flightrec.analysis.loading.loader import AnalysisOptions, View, load_dir
from flightrec.errors import NoDumpsError, UsageError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.format.write import write_dump
from tests.unit.factories import Job, healthy


def stalled() -> Job:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    return job


def test_finds_dumps_recursively_and_skips_other_files(tmp_path: Path) -> None:
    job = stalled()
    job.write(tmp_path / "node0", ranks=[0, 1])
    job.write(tmp_path / "node1" / "deep", ranks=[2, 3])
    (tmp_path / "expected.json").write_text("{}")
    (tmp_path / "README").write_text("notes")
    run = load_dir(tmp_path)
    assert run.ranks_with_dump == (0, 1, 2, 3)
    assert run.problems == ()


def test_bad_files_cost_one_line_each_and_analysis_goes_on(tmp_path: Path) -> None:
    paths = stalled().write(tmp_path)
    paths[3].write_bytes(paths[3].read_bytes()[:-9])  # truncated
    (tmp_path / "flightrec-rank00009-1-000-x.frdump").write_bytes(b"garbage")
    (tmp_path / "empty.frdump").write_bytes(b"")
    report = analyze_dir(str(tmp_path))
    reasons = {Path(p.path).name: p.reason for p in report.run.problems}
    assert len(reasons) == 3
    assert "truncated" in reasons[paths[3].name]
    assert "not a flightrec dump" in reasons["flightrec-rank00009-1-000-x.frdump"]
    assert reasons["empty.frdump"] == "empty file"
    assert all("\n" not in str(p) for p in report.run.problems)
    # Rank 3's dump is unreadable: rank 2 (stalled) is still named first.
    assert report.findings[0].ranks == (2,)
    assert report.run.missing_ranks == (3,)


def test_empty_folder_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(NoDumpsError, match="no readable dump"):
        load_dir(tmp_path)
    with pytest.raises(UsageError, match="no such file"):
        load_dir(tmp_path / "nope")


def test_a_text_file_given_directly_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(NoDumpsError, match="1 unreadable"):
        load_dir(text)


def test_several_dumps_per_rank_hang_by_default_latest_and_earliest_on_request(
    tmp_path: Path,
) -> None:
    job = stalled()
    for r in range(4):
        first = job.build(r, dump_index=0, reason=pb.WATCHDOG_TIMEOUT)
        write_dump(first, tmp_path, f"r{r}-0.frdump")
    job.collective(ranks=[2])  # after the watchdog dump, rank 2 arrived; then SIGTERM dumps
    for r in range(4):
        later = job.build(r, dump_index=1, reason=pb.SIGNAL_TERM, wall_offset_s=5)
        write_dump(later, tmp_path, f"r{r}-1.frdump")
    hang = load_dir(tmp_path)
    assert {d.header.dump_index for d in hang.dumps.values()} == {0}
    assert hang.hang_wall_ns and set(hang.later) == {0, 1, 2, 3}
    assert any("analysing the hang" in n and "WATCHDOG_TIMEOUT" in n for n in hang.notes)
    latest = load_dir(tmp_path, AnalysisOptions(View.LATEST))
    assert {d.header.dump_index for d in latest.dumps.values()} == {1}
    assert any("dumped more than once; using the latest" in n for n in latest.notes)
    assert any("SIGNAL_TERM" in n for n in latest.notes)
    first = load_dir(tmp_path, AnalysisOptions(View.EARLIEST))
    assert {d.header.dump_index for d in first.dumps.values()} == {0}


def test_duplicate_files_are_reported_once(tmp_path: Path) -> None:
    paths = stalled().write(tmp_path)
    copy = tmp_path / "copy" / paths[0].name
    copy.parent.mkdir()
    copy.write_bytes(paths[0].read_bytes())
    run = load_dir(tmp_path)
    assert len(run.problems) == 1 and "duplicate of" in run.problems[0].reason


def test_dumps_of_another_job_are_set_aside(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    old = healthy(Job(job_id="old-job"))
    write_dump(old.build(0, wall_offset_s=-3600), tmp_path / "old", "x.frdump")
    run = load_dir(tmp_path)
    assert run.dumps[0].header.job_id == "job-1"
    assert any("another job 'old-job'" in n for n in run.notes)


def test_dumps_of_one_process_are_one_rank_of_one_job(tmp_path: Path) -> None:
    """An older flightrec's exit dumps after destroy_process_group() said "rank 0 of 1" with
    no job id; the process's hang dump says who it was."""
    job = stalled()
    job.write(tmp_path)
    for rank in range(4):
        late = job.build(rank, dump_index=1, reason=pb.PROCESS_EXIT, wall_offset_s=5)
        late.header.rank, late.header.world_size, late.header.job_id = 0, 1, ""
        late.schema_minor = 1  # as that flightrec wrote them: member lists, no grids
        for g in late.groups:
            members = list(members_of(g))
            g.ClearField("rank_grid")
            g.ranks[:] = members
        write_dump(late, tmp_path, f"flightrec-rank00000-{1000 + rank}-001-process_exit.frdump")
    run = load_dir(tmp_path, AnalysisOptions(View.LATEST))
    assert run.ranks_with_dump == (0, 1, 2, 3) and run.world_size == 4
    assert run.problems == ()
    assert all(d.header.reason == pb.PROCESS_EXIT for d in run.dumps.values())
    assert all(d.header.job_id == "job-1" for d in run.dumps.values())
    assert any("one rank of one job" in n for n in run.notes)


def test_a_dump_without_a_job_id_is_not_another_job(tmp_path: Path) -> None:
    job = stalled()
    job.write(tmp_path, ranks=[0, 1, 2])
    orphan = job.build(3)
    orphan.header.job_id = ""
    write_dump(orphan, tmp_path, "flightrec-rank00003-1003-000-watchdog_timeout.frdump")
    run = load_dir(tmp_path)
    assert run.ranks_with_dump == (0, 1, 2, 3)
    assert not any("another job" in n for n in run.notes)


def test_a_hang_the_watchdog_declared_is_described_not_a_trigger_before_it(
    tmp_path: Path,
) -> None:
    """``flightrec trigger`` while the job was on its way (rank 2 already stalled, the others
    waiting for 6 s, under the 10 s timeout), then the watchdog: the default view describes
    the hang the watchdog declared, with full confidence, not the trigger's snapshot."""
    job = stalled()
    for r in range(4):
        snap = job.build(r, reason=pb.CLI_TRIGGER, wall_offset_s=-8)
        snap.header.timeout_s = 10.0
        for e in range(len(snap.entries.enqueue_ns)):  # the waits were 6 s old then
            if not snap.entries.complete_ns[e]:
                snap.entries.enqueue_ns[e] = snap.header.mono_time_ns - 6_000_000_000
        write_dump(snap, tmp_path, f"{r}-0")
        reason = pb.PEER_REQUEST if r == 2 else pb.WATCHDOG_TIMEOUT
        hang = job.build(r, dump_index=1, reason=reason)
        hang.header.timeout_s = 10.0
        write_dump(hang, tmp_path, f"{r}-1")
    run = load_dir(tmp_path)
    assert {d.header.reason for d in run.dumps.values()} == {pb.WATCHDOG_TIMEOUT, pb.PEER_REQUEST}
    assert not any("CLI_TRIGGER dump" in n for n in run.notes), run.notes
    first = analyze_dir(str(tmp_path)).findings[0]
    assert (first.kind, first.ranks) == ("not_arrived", (2,))
    assert first.below_timeout is None and "low confidence" not in first.summary, first.summary
    # Without the watchdog's dumps, the trigger's snapshot is all there is: said as such.
    for path in tmp_path.glob("*-1"):
        path.unlink()
    first = analyze_dir(str(tmp_path)).findings[0]
    assert first.below_timeout is not None and "low confidence" in first.summary


def test_the_hang_view_takes_each_ranks_answer_to_the_first_hang_event(tmp_path: Path) -> None:
    """Rank 2 was stalled; the others' watchdogs fired. After the hang: rank 0 raised (a
    collective error), everyone got SIGTERM. The stalled rank's request dump is its snapshot,
    not its SIGTERM dump; a rank that exited before the hang keeps its exit dump."""
    job = stalled()
    job.exited(3)
    reasons = {0: pb.WATCHDOG_TIMEOUT, 1: pb.WATCHDOG_TIMEOUT, 2: pb.PEER_REQUEST}
    for r, reason in reasons.items():
        write_dump(
            job.build(r, reason=reason, wall_offset_s=1 if r == 2 else 0), tmp_path, f"{r}-0"
        )
    write_dump(job.build(3, wall_offset_s=-30), tmp_path, "3-0")
    write_dump(
        job.build(0, dump_index=1, reason=pb.COLLECTIVE_ERROR, wall_offset_s=8), tmp_path, "0-1"
    )
    for r in range(3):
        write_dump(
            job.build(r, dump_index=2, reason=pb.SIGNAL_TERM, wall_offset_s=9), tmp_path, f"{r}-2"
        )
    run = load_dir(tmp_path)
    assert {r: d.header.reason for r, d in run.dumps.items()} == {**reasons, 3: pb.PROCESS_EXIT}
    assert [d.header.reason for d in run.later[0]] == [pb.COLLECTIVE_ERROR, pb.SIGNAL_TERM]
    assert 3 not in run.later
    report = analyze_dir(str(tmp_path))
    assert report.findings[0].ranks == (2,)
