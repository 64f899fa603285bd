"""The HTML report's grid model and page, on samples and hand-built jobs (the page in a real
browser: tests/integration/test_html_browser.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from flightrec.analysis import analyze, analyze_dir
from flightrec.report.grid import EACH_RANK_UP_TO, Cell, build_grid
from flightrec.report.html import HtmlRenderer
from flightrec.report.renderer import rendered
from tests.unit.factories import Job, healthy

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"


def _data(page: str) -> dict[str, object]:
    found = re.search(r'<script type="application/json" id="grid-data">(.*?)</script>', page, re.S)
    assert found is not None
    data: dict[str, object] = json.loads(found.group(1))
    return data


def test_a_stalled_rank_never_entered_what_its_peers_wait_in() -> None:
    report = analyze_dir(str(SAMPLES / "stalled_rank"))
    grid = build_grid(report)
    world = grid.groups[0]  # the group the verdict names comes first
    assert world.key == "0" and world.focus == 4 and world.seqs[0] == 1
    col = world.seqs.index(4)
    rows = {row.ranks: row for row in world.rows}
    assert rows[(2,)].culprit and rows[(2,)].cells[col] == Cell.NOT_ENTERED
    for r in (0, 1, 3):
        assert not rows[(r,)].culprit
        assert rows[(r,)].cells[col] == Cell.PENDING
        assert set(rows[(r,)].cells[:col]) == {Cell.COMPLETED}
    # The cell's entry: what rank 0 was blocked in.
    entry = grid.entries[rows[(0,)].entries[col]]
    assert entry["op"] == "all_reduce" and entry["seq"] == 4 and entry["state"] == "enqueued"
    assert entry["in"] and "before_dump_s" in entry
    assert any("train_job.py" in line for line in grid.stacks[int(str(entry["stack"]))])


def test_a_mismatched_call_is_marked_on_the_ranks_it_blames() -> None:
    report = analyze_dir(str(SAMPLES / "op_mismatch"))
    f = report.findings[0]
    assert f.kind == "mismatch" and f.seq is not None
    g = next(g for g in build_grid(report).groups if g.key == f.process_group)
    col = g.seqs.index(f.seq)
    marked = {r for row in g.rows if row.cells[col] == Cell.MISMATCHED for r in row.ranks}
    assert marked == set(f.ranks)


def test_a_p2p_findings_number_marks_no_collective_column() -> None:
    # recv #4 is the fourth transfer from one peer, not the group's collective #4.
    report = analyze_dir(str(SAMPLES / "p2p_deadlock"))
    f = report.findings[0]
    assert (f.kind, f.op, f.seq) == ("p2p_deadlock", "recv", 4)
    assert all(g.focus is None for g in build_grid(report).groups)


def test_alike_ranks_of_a_large_group_share_a_row_and_the_culprit_has_its_own() -> None:
    job = healthy(Job(world_size=64), steps=5)
    job.collective(ranks=[r for r in range(64) if r != 37], complete=False)
    job.stall(37)
    report = analyze(job.run())
    assert report.findings[0].ranks == (37,)
    g = build_grid(report).groups[0]
    assert g.size == 64 > EACH_RANK_UP_TO
    assert [(row.label, row.culprit) for row in g.rows] == [
        ("ranks 0-63 except 37 (63)", False),
        ("rank 37", True),
    ]
    assert g.rows[0].cells[-1] == Cell.PENDING and g.rows[1].cells[-1] == Cell.NOT_ENTERED


def test_a_small_group_shows_every_rank() -> None:
    report = analyze(healthy(Job(world_size=8), steps=3).run())
    g = build_grid(report).groups[0]
    assert [row.ranks for row in g.rows] == [(r,) for r in range(8)]
    assert all(set(row.cells) == {Cell.COMPLETED} for row in g.rows)


def test_the_page_is_self_contained_and_names_the_verdict_and_the_culprit() -> None:
    report = analyze_dir(str(SAMPLES / "stalled_rank"))
    page = rendered(HtmlRenderer, report)
    assert page.startswith("<!DOCTYPE html>")
    # Nothing fetched: no stylesheet, script or image from anywhere.
    assert not re.search(r"<link|<img|\bsrc=|@import|url\(", page)
    assert re.findall(r"https?://[^\"' )]+", page) == ["http://www.w3.org/2000/svg"]
    assert 'id="verdict" class="bad" data-kind="not_arrived" data-ranks="2"' in page
    assert "never entered all_reduce #4" in page
    data = _data(page)
    groups = data["groups"]
    assert isinstance(groups, list)
    assert [row["label"] for row in groups[0]["rows"] if row["culprit"]] == ["rank 2"]


def test_a_healthy_job_says_so() -> None:
    page = rendered(HtmlRenderer, analyze_dir(str(SAMPLES / "healthy")))
    assert 'id="verdict" class="ok"' in page and "no problem found" in page
    assert '"culprit":true' not in page


def test_strings_from_a_dump_cannot_inject_markup() -> None:
    job = healthy(Job(world_size=2), steps=2)
    evil = "</script><script>alert(1)</script><b>"
    job.collective(ranks=[0], complete=False, function=evil)
    job.stall(1, function=evil)
    page = rendered(HtmlRenderer, analyze(job.run()))
    assert "<script>alert(1)" not in page and evil not in page
    assert page.count("</script>") == 2  # the data element's and the page script's own
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page  # shown, as text
    assert evil in json.dumps(_data(page))  # and intact in the data the script reads


def test_the_command_writes_the_page_or_says_in_one_line_why_not(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "cli")])}

    def analyze(page: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flightrec_cli", "analyze", str(SAMPLES / "stalled_rank"),
             "--json", "--html", str(page)],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    ok = analyze(tmp_path / "report.html")
    assert ok.returncode == 1 and json.loads(ok.stdout)["findings"]
    assert ok.stderr == ""  # --json: no progress display, whatever stderr is
    assert "Verdict: not_arrived" in (tmp_path / "report.html").read_text()
    bad = analyze(tmp_path / "missing" / "report.html")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        f"flightrec: error: cannot write {tmp_path / 'missing' / 'report.html'}: "
        "No such file or directory"
    ]


def test_blocked_ranks_whose_process_ended_waited_then_died() -> None:
    """The page says what the terminal says of ranks gloo's timeout killed in the wait."""
    from tests.unit.test_analysis_failed import ddp_job, torch_timeout_first

    report = analyze(torch_timeout_first(ddp_job()).run())
    page = rendered(HtmlRenderer, report)
    assert "ranks 0-1,3 waited in DDP gradient-bucket all_reduce #6 on group 0" in page, page
    assert "then died" in page and "ranks 0-1,3 wait in" not in page
