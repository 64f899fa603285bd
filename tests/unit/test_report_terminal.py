"""The terminal report: verdict first, evidence after, plain text when not a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from flightrec.analysis import analyze
from flightrec.format import flightrec_pb2 as pb
from flightrec.report.terminal import TerminalRenderer
from tests.unit.factories import Job, healthy


def render(job: Job, width: int = 100, **console: object) -> str:
    out = io.StringIO()
    TerminalRenderer(Console(file=out, width=width, **console)).render(analyze(job.run()))  # type: ignore[arg-type]
    return out.getvalue()


def stalled() -> Job:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2, "load_batch", 18)
    return job


def test_verdict_panel_comes_first_then_evidence() -> None:
    text = render(stalled())
    lines = text.splitlines()
    assert "Verdict: not_arrived" in lines[0]
    verdict = " ".join(lines[1:4])
    assert "Rank 2 (node1, pid 1002, cpu) never entered all_reduce #4 on group 0" in verdict
    assert text.index("Verdict") < text.index("Where every rank is") < text.index("Progress")


def test_ranks_grouped_by_what_they_do() -> None:
    text = render(stalled())
    assert "rank 2 is in load_batch at job/train.py:18" in text
    assert "ranks 0-1,3 wait in all_reduce at job/train.py:22" in text
    assert "ranks 0-1,3 wait in all_reduce #4 on group 0 [ranks 0-3] for 30.0 s" in text


def test_progress_table_compresses_ranks() -> None:
    text = render(stalled())
    assert "4/3: ranks 0-1,3" in text and "3/3: rank 2" in text


def test_a_rank_whose_dump_lacks_a_group_is_not_said_to_have_no_dump() -> None:
    """A summary in the job's log keeps the groups with something pending first: rank 2's
    lacks the subgroup. It has a dump; the group is not in it."""
    from flightrec.analysis.loading.loader import Run
    from flightrec.analysis.model import RankDump

    job = stalled()
    job.group("5", [0, 1, 2, 3], desc="tp")
    job.collective(group="5", ranks=[0, 1, 3])
    dumps = {r: job.build(r) for r in range(4)}
    del dumps[2].groups[1]  # rank 2 issued nothing on it
    run = Run({r: RankDump(f"<rank {r}>", d) for r, d in dumps.items()}, 4, (), ())
    out = io.StringIO()
    TerminalRenderer(Console(file=out, width=120)).render(analyze(run))
    text = out.getvalue()
    assert "not in the dump: rank 2" in text, text
    assert "no dump" not in text, text


def test_a_path_named_by_a_dump_is_never_opened(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A dump without source lines (a native dump, an older flightrec) names a readable file:
    # the report shows the frame, not the file's contents.
    script = tmp_path / "train.py"
    script.write_text("\n".join(f"leaked {i}" for i in range(1, 30)) + "\n")
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.ranks[2].threads = [("MainThread", [(str(script), "load_batch", 18)], True, False)]
    text = render(job)
    assert "Stack of rank 2" in text and "load_batch" in text and "leaked" not in text


def test_culprit_stack_shows_the_source_line_the_job_ran(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The file on the analysis machine has changed since the job ran: the dump's copy wins.
    script = tmp_path / "train.py"
    script.write_text("\n".join(f"edited {i}" for i in range(1, 30)) + "\n")
    job = healthy(Job())
    job.source = lambda file, line: f"as run {line}" if file == str(script) else ""
    job.collective(ranks=[0, 1, 3], complete=False)
    job.ranks[2].threads = [("MainThread", [(str(script), "load_batch", 18)], True, False)]
    text = render(job)
    assert "as run 18" in text and "edited 18" not in text


def test_healthy_verdict() -> None:
    text = render(healthy(Job()))
    assert "No problem found" in text


def test_no_ansi_codes_when_not_a_terminal_or_no_color() -> None:
    assert "\x1b[" not in render(stalled())  # a StringIO is not a terminal
    colored = render(stalled(), force_terminal=True)
    assert "\x1b[" in colored
    plain = render(stalled(), force_terminal=True, no_color=True)
    assert "\x1b[3" not in plain  # no colour codes (bold may remain)


def test_fits_a_narrow_terminal() -> None:
    for line in render(stalled(), width=60).splitlines():
        assert len(line) <= 60


def test_control_characters_in_a_dump_never_reach_the_terminal() -> None:
    # A crafted dump names a function that would retitle the window and clear the screen.
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2, "load\x1b]0;pwned\x07batch\x1b[2J", 18)
    text = render(job, color_system=None)
    assert "\x1b" not in text and "\x07" not in text
    assert "load?]0;pwned?batch?[2J" in text


def test_a_ddp_gradient_bucket_is_named_as_such() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False, flags=pb.DDP_BUCKET)
    job.stall(2, "evaluate", 40)
    text = render(job)
    assert "never entered DDP gradient-bucket all_reduce #4 on group 0" in " ".join(text.split())
    assert "ranks 0-1,3 wait in DDP gradient-bucket all_reduce" in text
