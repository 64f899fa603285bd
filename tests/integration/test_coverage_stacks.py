"""Real training stacks and hard deaths on 2-4 gloo ranks: what flightrec sees and concludes.

Each job is ``scripts/coverage.py`` traced by FLIGHTREC=1 alone; the analysis is the library's
(``analyze_dir``), the same that ``flightrec analyze`` renders.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from flightrec.analysis import analyze_dir
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import RING_SUFFIX
from tests.integration.jobs import SCRIPTS, Job, start_job

SCRIPT = SCRIPTS / "coverage.py"


def line_of(text: str) -> int:
    """Line number of the first line of the script containing ``text``."""
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {SCRIPT}")


def wait_for_every_rank(job: Job, timeout: float) -> None:
    """Wait until every rank wrote a dump (a rank may write two before another writes one)."""
    deadline = time.monotonic() + timeout
    while len({p.name.split("-")[1] for p in job.dump_files()}) < job.world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank dumped after {timeout}s\n{job.output()}")
        time.sleep(0.1)
    time.sleep(0.5)  # a rank's dump may be followed by its answer to a peer's request


def rings(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{RING_SUFFIX}")) if folder.exists() else []


def test_ddp_uneven_inputs_blames_the_rank_that_ran_one_step_fewer(tmp_path: Path) -> None:
    with start_job(
        SCRIPT, ["ddp", "--steps", "3", "--short-rank", "2", "--pg-timeout", "20"],
        world_size=4, env={"FLIGHTREC_TIMEOUT": "2"}, workdir=tmp_path,
    ) as job:  # fmt: skip
        wait_for_every_rank(job, timeout=60)
        dumps = job.dumps()
    report = analyze_dir(str(job.dump_dir))
    first = report.findings[0]
    assert first.kind == "not_arrived" and first.ranks == (2,), first.summary
    # DDP's construction (shape check, parameter broadcast) and its bucket rebuild at the
    # second forward are issued from C++: PyTorch's recorder saw them, numbered in between.
    # Every gradient bucket is an all_reduce numbered on the DDP group, with the bucket's size,
    # whose stack reaches the user's backward() call. Ranks 0, 1 and 3 completed two steps'
    # buckets (several per step) and wait in the third step's first bucket.
    backward = line_of("loss.backward()")
    params = 16 * 32 + 32 + 32 * 4 + 4
    for rank in (0, 1, 3):
        dump = dumps[rank][-1][1]
        e = dump.entries
        ops = [dump.strings[o] for o in e.op]
        buckets = [i for i, op in enumerate(ops) if op == "all_reduce"]
        assert set(ops[: buckets[0]]) == {"all_gather", "broadcast"}, ops
        assert set(ops[buckets[0] :]) == {"all_reduce", "broadcast"}, ops
        assert list(e.seq) == list(range(1, len(e.seq) + 1))
        done = [i for i in buckets if e.state[i] == pb.COMPLETED]
        assert len(done) > 2, "several buckets per step"
        assert sum(sum(dump.tensor_specs[e.inputs[i]].dims) for i in done) == 2 * params
        waiting = min(e.seq[i] for i in buckets if e.state[i] != pb.COMPLETED)
        assert first.op == "all_reduce" and first.seq == waiting
        for i in buckets:
            frames = [dump.frames[f] for f in dump.stacks[e.stack[i]].frames]
            assert any(
                dump.strings[f.file].endswith("coverage.py") and f.line == backward for f in frames
            )


def test_fsdp2_all_gathers_and_reduce_scatters_are_recorded(tmp_path: Path) -> None:
    with start_job(
        SCRIPT, ["fsdp", "--steps", "2"], world_size=2,
        env={"FLIGHTREC_DUMP_ON_EXIT": "1"}, workdir=tmp_path,
    ) as job:  # fmt: skip
        assert job.wait(60) == [0, 0], job.output()
        dumps = job.dumps()
    for rank in (0, 1):
        dump = dumps[rank][-1][1]
        ops = [dump.strings[o] for o in dump.entries.op]
        gathers = [o for o in ops if o.startswith("all_gather")]
        scatters = [o for o in ops if o.startswith("reduce_scatter")]
        # Two steps: a forward all-gather per sharded module (3), a backward re-gather for the
        # two layers (2), and one reduce-scatter per layer with parameters (2).
        assert len(gathers) >= 2 * 3 and len(scatters) >= 2 * 2, ops
        assert list(dump.entries.seq) == list(range(1, len(ops) + 1))
    # A healthy run that dumped at exit leaves no black box behind.
    assert rings(job.dump_dir) == []
    # Healthy: no finding. On a loaded machine, ranks that each lose the core in turn really
    # do wait on one another: a spread imbalance, which names no rank, may be said.
    findings = analyze_dir(str(job.dump_dir)).findings
    assert [f for f in findings if f.kind != FindingKind.IMBALANCE or f.ranks] == [], findings


@pytest.mark.parametrize("how", ["sigkill", "exit", "abort"])
def test_a_rank_that_dies_hard_is_named_from_its_black_box(tmp_path: Path, how: str) -> None:
    with start_job(
        SCRIPT, ["die", "--steps", "4", "--die-rank", "1", "--how", how, "--pg-timeout", "10"],
        world_size=4, env={"FLIGHTREC_TIMEOUT": "2"}, workdir=tmp_path,
    ) as job:  # fmt: skip
        codes = job.wait(60)
    assert codes[1] == {"sigkill": -9, "exit": 3, "abort": -6}[how], job.output()
    left = [p.name for p in rings(job.dump_dir)]
    assert any(name.startswith("flightrec-rank00001-") for name in left), left
    report = analyze_dir(str(job.dump_dir))
    assert 1 in report.ranks_with_dump
    first = report.findings[0]
    assert first.kind == "dead_rank" and first.ranks == (1,), first.summary
    where = f"coverage.py:{line_of('dist.all_reduce(t)')}"
    assert "died after completing all_reduce #4" in first.summary, first.summary
    assert f"its last call was at scripts/{where}" in first.summary, first.summary
    dead = report.run.dumps[1]
    assert dead.header.source == "flightrec-blackbox"
    # The black box carries the line of code the rank ran, not what this machine's file says.
    last = dead.stack(dead.columns["stack"][-1])
    assert any(f.code == "dist.all_reduce(t)" for f in last), last
