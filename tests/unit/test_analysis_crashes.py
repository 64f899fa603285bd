"""Ranks that died of an exception: the verdict names the exception and its line; what came
after the hang stays evidence; a thread's death is said where it explains a stall."""

from __future__ import annotations

from pathlib import Path

from flightrec.analysis import analyze_dir
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.write import write_dump
from tests.unit.factories import Job, healthy


def with_exception(
    dump: pb.Dump, kind: str, message: str, *, thread: str = "MainThread", at_s: float = 0.0
) -> pb.Dump:
    """``dump`` with an exception raised at /job/train.py:57 in compute_loss."""
    frames = []
    for file, name, line, code in [
        ("/job/train.py", "compute_loss", 57, "raise ValueError('loss is NaN')"),
        ("/job/train.py", "main", 90, "compute_loss()"),
    ]:
        dump.strings.extend([file, name, code])
        n = len(dump.strings)
        frames.append(len(dump.frames))
        dump.frames.add(file=n - 3, name=n - 2, line=line, code=n - 1)
    dump.stacks.add(frames=frames)
    dump.exceptions.add(
        type=kind, message=message, thread=thread, is_main=thread == "MainThread",
        stack=len(dump.stacks) - 1, wall_time_ns=dump.header.wall_time_ns + int(at_s * 1e9),
        via="sys.excepthook",
    )  # fmt: skip
    return dump


def test_a_rank_that_died_of_an_exception_is_the_verdict(tmp_path: Path) -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.exited(2)
    for r in range(4):
        dump = job.build(r)
        if r == 2:
            dump = with_exception(dump, "ValueError", "loss is NaN\nat step 3", at_s=-1)
        write_dump(dump, tmp_path, f"r{r}.frdump")
    report = analyze_dir(str(tmp_path))
    first = report.findings[0]
    assert first.kind == "dead_rank" and first.ranks == (2,)
    assert "died of ValueError: loss is NaN / at step 3 at job/train.py:57 in compute_loss" in (
        first.summary
    ), first.summary
    assert "it never entered all_reduce #4 on group 0" in first.summary
    assert report.states[2].describe() == "died of ValueError in compute_loss at job/train.py:57"


def test_an_exception_after_the_hang_is_evidence_not_the_verdict(tmp_path: Path) -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    for r in range(4):
        write_dump(job.build(r), tmp_path, f"r{r}-0.frdump")
    late = job.build(2, dump_index=1, reason=pb.PROCESS_EXIT, wall_offset_s=30)
    write_dump(with_exception(late, "RuntimeError", "timeout"), tmp_path, "r2-1.frdump")
    first = analyze_dir(str(tmp_path)).findings[0]
    assert first.kind == "not_arrived" and first.ranks == (2,)
    assert "died of" not in first.summary
    assert first.exception is not None and first.exception.type == "RuntimeError"


def test_peers_that_died_of_the_timeout_after_the_hang_are_said_to_be_a_consequence(
    tmp_path: Path,
) -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    for r in range(4):
        write_dump(job.build(r), tmp_path, f"r{r}-0.frdump")
    for r in (0, 1, 3):  # gloo's timeout ends the waiting ranks 30 s on
        late = job.build(r, dump_index=1, reason=pb.PROCESS_EXIT, wall_offset_s=30)
        write_dump(with_exception(late, "RuntimeError", "timed out"), tmp_path, f"r{r}-1.frdump")
    findings = analyze_dir(str(tmp_path)).findings
    assert findings[0].kind == "not_arrived" and findings[0].ranks == (2,)
    # Folded into the root cause (issue 31): no finding of its own blames the waiting ranks.
    assert [f for f in findings if f.kind == "dead_rank"] == []
    dead = [x for x in findings[0].explains if x.kind == "dead_rank"]
    assert [x.ranks for x in dead] == [(0, 1, 3)]
    assert "s after the hang was declared" in dead[0].summary, dead[0].summary
    (wait,) = findings[0].consequences
    assert wait.waiting == wait.ended == (0, 1, 3)


def test_a_stalled_rank_whose_loader_thread_died_says_so(tmp_path: Path) -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    for r in range(4):
        dump = job.build(r)
        if r == 2:
            dump = with_exception(dump, "OSError", "disk full", thread="loader", at_s=-5)
        write_dump(dump, tmp_path, f"r{r}.frdump")
    first = analyze_dir(str(tmp_path)).findings[0]
    assert first.ranks == (2,) and first.kind == "not_arrived"
    assert "its thread 'loader' had died of OSError: disk full" in first.summary, first.summary


def test_every_rank_dying_before_any_collective_is_a_finding(tmp_path: Path) -> None:
    job = Job()
    for r in range(4):
        job.exited(r)
        write_dump(with_exception(job.build(r), "ValueError", "no config"), tmp_path, f"{r}")
    report = analyze_dir(str(tmp_path))
    (f,) = report.findings
    assert f.ranks == (0, 1, 2, 3) and f.kind == "dead_rank"
    assert f.summary.endswith("in compute_loss, before any collective"), f.summary


def test_an_exceptions_text_never_reaches_the_terminal_raw(tmp_path: Path) -> None:
    job = Job()
    for r in range(4):
        job.exited(r)
        dump = with_exception(job.build(r), "Value\x1b[2JError", "bad\x1b]0;title\x07 input")
        write_dump(dump, tmp_path, f"{r}")
    (f,) = analyze_dir(str(tmp_path)).findings
    assert "\x1b" not in f.summary and "\x07" not in f.summary
    assert "died of Value?[2JError: bad?]0;title? input" in f.summary, f.summary
