"""Verdicts that name the cause and fold what it explains (issue 31, points 4, 6, 7, 8, 9):
real gloo jobs not in samples/, run by ``scripts/consequences.py``, analysed through the CLI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import SCRIPTS, Job, child_env, free_port, start_job
from tests.integration.test_cli_analyze import flightrec

pytest.importorskip("torch.distributed")

ENV = {"FLIGHTREC_TIMEOUT": "2", "FLIGHTREC_DUMP_ON_EXIT": "1"}


def analyze(folder: Path) -> dict[str, Any]:
    result = flightrec("analyze", folder, "--json")
    assert result.returncode == 1, result.stderr
    return dict(json.loads(result.stdout))


def text(folder: Path) -> str:
    return flightrec("analyze", folder, env={"COLUMNS": "200"}).stdout


def section(report: str, title: str) -> str:
    """The lines of the terminal report's section ``title`` (up to the next title)."""
    lines = report.split(title, 1)[1].splitlines()[1:] if title in report else []
    out = []
    for line in lines:
        if not line.startswith("  "):
            break
        out.append(line)
    return "\n".join(out)


def run(job: Job, timeout: float = 120) -> None:
    try:
        job.wait(timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def test_stale_all_to_all_splits_name_the_rank_and_no_dead_rank_waits(tmp_path: Path) -> None:
    """MoE dispatch: rank 1 reuses last step's split sizes. gloo aborts one side of the
    exchange, every other rank's connection is reset: one finding, rank 1, and every
    rank's end said as such, never "waits"."""
    with start_job("consequences.py", ["moe_stale"], env=ENV, workdir=tmp_path) as job:
        run(job)
    report = analyze(job.dump_dir)
    (first,) = report["findings"]
    assert (first["kind"], first["ranks"], first["field"]) == ("mismatch", [1], "split_sizes")
    assert "cannot tell" not in first["summary"]
    assert "rank 1 then died" in first["summary"], first["summary"]
    rendered = text(job.dump_dir)
    for title in ("Blocked because of it", "Where every rank is"):
        assert not re.search(r"\bwaits? in\b", section(rendered, title)), rendered


def test_torchrun_two_nodes_peers_killed_by_the_timeout_are_consequences(tmp_path: Path) -> None:
    """Two torchrun agents on loopback (--nnodes 2, two ranks each); rank 1 sits in its data
    loader, gloo's timeout kills the others on both nodes: one finding, the deaths in it."""
    port = free_port()
    dumps = tmp_path / "dumps"
    env = child_env({"FLIGHTREC_DIR": str(dumps), "FLIGHTREC_TIMEOUT": "2"})
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
            f"--node-rank={node}", "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={port}", str(SCRIPTS / "consequences.py"), "hang",
            "--culprit", "1", "--pg-timeout", "4",
        ]  # fmt: skip
        log = open(tmp_path / f"node{node}.log", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for p, _ in procs:
            p.wait(timeout=90)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    report = analyze(dumps)
    (first,) = report["findings"]
    assert (first["kind"], first["ranks"], first["op"]) == ("not_arrived", [1], "all_reduce")
    folded = {r for x in first["explains"] for r in x["ranks"] if x["kind"] == "dead_rank"}
    assert folded == {0, 2, 3}, first["explains"]
    assert first["consequences"][0]["ended_ranks"] == [0, 2, 3]


def test_subgroups_are_named_by_their_members(tmp_path: Path) -> None:
    """``new_subgroups(2)``: rank 1 skips its pair's all_reduce (torch describes the pairs as
    "undefined")."""
    with start_job(
        "consequences.py", ["subgroups", "--stall", "6"], env=ENV, workdir=tmp_path
    ) as job:
        run(job)
    first = analyze(job.dump_dir)["findings"][0]
    assert (first["kind"], first["ranks"], first["pg_ranks"]) == ("not_arrived", [1], [0, 1])
    assert "group 1 [ranks 0-1]" in first["summary"]
    assert "undefined" not in text(job.dump_dir)


def test_a_transfer_wait_is_named_by_its_peer(tmp_path: Path) -> None:
    """A pipeline pair: rank 2 never sends rank 3 its microbatch; rank 3 waits in irecv."""
    with start_job(
        "consequences.py", ["p2p_pair", "--stall", "6"], env=ENV, workdir=tmp_path
    ) as job:
        run(job)
    first = analyze(job.dump_dir)["findings"][0]
    assert (first["kind"], first["ranks"]) == ("not_arrived", [2])
    blocked = section(text(job.dump_dir), "Blocked because of it")
    assert "irecv #4 from rank 2" in blocked, blocked
    assert "on group 0 [ranks 0-3]" not in blocked.split("irecv")[1].splitlines()[0]


def test_native_dumps_under_any_name_read_alike_in_both_forms(tmp_path: Path) -> None:
    """PyTorch's own recorder (TORCH_FR_BUFFER_SIZE, no flightrec), dumps named ``_dump_<r>``
    (pickle) and ``<host>_trace.<r>`` (JSON): found by their content, the same verdict."""
    native = tmp_path / "native"
    env = {"TORCH_FR_BUFFER_SIZE": "2000"}
    with start_job(
        "consequences.py", ["subgroups", "--stall", "6", "--native", str(native)],
        env=env, flightrec=False, workdir=tmp_path,
    ) as job:  # fmt: skip
        run(job)
    summaries = []
    for form in ("pickle", "json"):
        report = analyze(native / form)
        assert report["ranks_with_dump"] == [0, 1, 2, 3] and report["problems"] == []
        first = report["findings"][0]
        assert (first["kind"], first["ranks"], first["seq"]) == ("not_arrived", [1], 4)
        assert "its last call was all_reduce #4 on group 0" in first["summary"]
        assert "it was in" not in first["summary"]
        summaries.append(first["summary"].split("; it left its routine")[0])
    # The JSON form carries no stacks: its verdict is the pickle's without the line of code.
    pickle_text, json_text = summaries
    assert re.sub(r" at scripts/consequences\.py:\d+", "", pickle_text) == json_text
