"""The real `flightrec analyze` and `flightrec show` in a subprocess, on files factories wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.factories import Job, healthy

ROOT = Path(__file__).resolve().parents[2]


def flightrec(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    full.pop("FLIGHTREC", None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
        check=False,
    )


def stalled() -> Job:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    return job


def test_healthy_job_exits_0(tmp_path: Path) -> None:
    healthy(Job()).write(tmp_path)
    result = flightrec("analyze", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "No problem found" in result.stdout and result.stderr == ""


def test_fault_exits_1_with_verdict_first(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    result = flightrec("analyze", tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[0].count("Verdict") == 1
    assert "Rank 2" in result.stdout.split("Where every rank is")[0]


def test_json_parses_and_follows_the_contract(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    result = flightrec("analyze", tmp_path, "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["schema"] == "flightrec.report/1"
    assert data["findings"][0]["kind"] == "not_arrived" and data["findings"][0]["ranks"] == [2]


def test_missing_ranks_still_analysed(tmp_path: Path) -> None:
    stalled().write(tmp_path, ranks=[0, 1, 3])
    data = json.loads(flightrec("analyze", tmp_path, "--json").stdout)
    assert data["ranks_with_dump"] == [0, 1, 3]
    assert (data["findings"][0]["kind"], data["findings"][0]["ranks"]) == ("missing_dump", [2])


def test_empty_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = flightrec("analyze", tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no readable dump" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_path_is_exit_2(tmp_path: Path) -> None:
    result = flightrec("analyze", tmp_path / "nope")
    assert result.returncode == 2 and "no such file" in result.stderr


@pytest.mark.parametrize(
    ("name", "data"),
    [("notes.txt", b"hello world\n"), ("x.frdump", b"\x00garbage\xff" * 10), ("e.frdump", b"")],
)
def test_bad_single_file_is_one_line_and_exit_2(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    for command in ("analyze", "show"):
        result = flightrec(command, path)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert name in result.stderr or "no readable dump" in result.stderr


def test_truncated_dump_beside_good_ones_is_partial_analysis(tmp_path: Path) -> None:
    paths = stalled().write(tmp_path)
    paths[1].write_bytes(paths[1].read_bytes()[:40])
    result = flightrec("analyze", tmp_path, "--json")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and paths[1].name in result.stderr
    assert json.loads(result.stdout)["ranks_with_dump"] == [0, 2, 3]


def test_no_ansi_when_piped_even_with_colour_terminal_type(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    for env in ({"TERM": "xterm-256color"}, {"NO_COLOR": "1", "TERM": "xterm-256color"}):
        assert "\x1b[" not in flightrec("analyze", tmp_path, env=env).stdout


def test_no_color_is_honoured_on_a_forced_terminal(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    colored = flightrec("analyze", tmp_path, env={"FORCE_COLOR": "1", "TERM": "xterm"}).stdout
    assert "\x1b[" in colored
    plain = flightrec(
        "analyze", tmp_path, env={"FORCE_COLOR": "1", "TERM": "xterm", "NO_COLOR": "1"}
    ).stdout
    assert "\x1b[31" not in plain and "\x1b[32" not in plain


def test_show_prints_one_dump(tmp_path: Path) -> None:
    path = stalled().write(tmp_path, ranks=[2])[0]
    result = flightrec("show", path)
    assert result.returncode == 0, result.stderr
    for words in ("rank           2 of 4", "Process groups", "Entries", "MainThread", "load_batch"):
        assert words in result.stdout


def test_view_option_picks_which_dump_of_each_rank(tmp_path: Path) -> None:
    from flightrec.format import flightrec_pb2 as pb
    from flightrec.format.write import write_dump

    job = stalled()
    for r in range(4):
        write_dump(job.build(r, dump_index=0), tmp_path, f"r{r}-0.frdump")
    job.collective(ranks=[2], complete=False)  # later, rank 2 arrived too: all wait together
    for r in range(4):
        later = job.build(r, dump_index=1, reason=pb.SIGNAL_TERM, wall_offset_s=5)
        write_dump(later, tmp_path, f"r{r}-1.frdump")
    hang = json.loads(flightrec("analyze", tmp_path, "--json").stdout)
    latest = json.loads(flightrec("analyze", tmp_path, "--json", "--view", "latest").stdout)
    earliest = json.loads(flightrec("analyze", tmp_path, "--json", "--view", "earliest").stdout)
    assert latest["findings"][0]["kind"] == "stuck"
    assert (hang["findings"][0]["kind"], hang["findings"][0]["ranks"]) == ("not_arrived", [2])
    assert any("analysing the hang" in n for n in hang["notes"])
    assert (earliest["findings"][0]["kind"], earliest["findings"][0]["ranks"]) == (
        "not_arrived",
        [2],
    )
    assert any("using the earliest dump" in n for n in earliest["notes"])
    assert flightrec("analyze", tmp_path, "--view", "bogus").returncode == 2


def test_show_on_a_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    stalled().write(tmp_path)
    result = flightrec("show", tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "is a folder" in result.stderr


SAMPLE = ROOT / "samples" / "p2p_deadlock"


def test_show_names_what_a_recv_receives() -> None:
    path = sorted(SAMPLE.glob("flightrec-rank00001-*.frdump"))[0]
    # Wide enough for one line per entry (at 80 columns the tensors column wraps after "->").
    result = flightrec("show", path, "--limit", "0", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    recvs = [line for line in result.stdout.splitlines() if " recv from " in line]
    assert recvs and all("-> float32[64]" in line for line in recvs)


def test_piped_report_keeps_long_lines_whole() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [sys.executable, "-m", "flightrec_cli", "analyze", str(SAMPLE)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])},
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    # The culprit's source line is printed whole, not folded at 80 columns.
    assert any(
        "dist.recv(grad, src=rank + 1)  # waits for a gradient its neighbour cannot send yet"
        in line
        for line in result.stdout.splitlines()
    )
    assert "flightrec wrapper" not in result.stdout


def test_trace_recent_keeps_the_newest_operations(tmp_path: Path) -> None:
    full, recent = tmp_path / "full.json", tmp_path / "recent.json"
    assert flightrec("analyze", SAMPLE, "--trace", full).returncode == 1
    assert flightrec("analyze", SAMPLE, "--trace", recent, "--trace-recent", "2").returncode == 1

    def spans(path: Path) -> dict[object, int]:
        counts: dict[object, int] = {}
        for event in json.loads(path.read_text())["traceEvents"]:
            if event.get("ph") == "X":
                counts[event["tid"]] = counts.get(event["tid"], 0) + 1
        return counts

    assert max(spans(full).values()) > 2
    assert spans(recent) and max(spans(recent).values()) <= 2


def test_a_default_timeline_holds_a_recent_window_and_trace_all_everything(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    simulate = ("simulate", "--ranks", "64", "--entries", "600", "--fault", "stall")
    assert flightrec(*simulate, "--fault-rank", "5", "--out", job).returncode == 0
    default, everything = tmp_path / "default.json", tmp_path / "all.json"
    assert flightrec("analyze", job, "--trace", default).returncode == 1
    assert flightrec("analyze", job, "--trace", everything, "--trace-all").returncode == 1

    def spans(path: Path) -> list[int]:
        counts: dict[object, int] = {}
        for event in json.loads(path.read_text())["traceEvents"]:
            if event.get("ph") == "X":
                counts[(event["pid"], event["tid"])] = (
                    counts.get((event["pid"], event["tid"]), 0) + 1
                )
        return list(counts.values())

    assert max(spans(default)) <= 200 < max(spans(everything))
    assert default.stat().st_size * 2 < everything.stat().st_size
