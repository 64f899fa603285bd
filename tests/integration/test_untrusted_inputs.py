"""Promise 3: flightrec trusts nothing it reads, from the job's store or from a dump folder.

Store side: a request description is parsed into a rank and a reason from a fixed vocabulary;
hostile values change no file name and no path; a request of another job's namespace is not
ours; a flood of requests (or a counter pushed to 10^12) costs at most one dump per second.
Analyzer side: every kind of bad file costs one line on stderr, beside good dumps and alone,
with the exit status of the contract (1 findings, 2 no readable dump).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import MAGIC as BLACKBOX_MAGIC
from flightrec.format.read import read_dump
from flightrec.format.schema import MAGIC_PREFIX, SUFFIX
from flightrec.format.write import write_dump
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.store import parse_request, post_request
from tests.unit.factories import Job, healthy

ROOT = Path(__file__).resolve().parents[2]
# Every name flightrec may create in FLIGHTREC_DIR: built from integers, a sanitized host name
# and a fixed vocabulary only.
OUR_NAMES = re.compile(
    r"^(flightrec-rank-?\d{5}-\d+-\d{3}-[a-z0-9_]+\.frdump"
    r"|\.?flightrec-(rank\d{5}-)?[A-Za-z0-9_.-]+-\d+\.ring(\.tables|\.stacks)?"
    r"|\.flightrec-endpoint)$"
)


# -- the store --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"3 WATCHDOG_TIMEOUT", (3, "WATCHDOG_TIMEOUT")),
        (b"-1 CLI_TRIGGER", (-1, "CLI_TRIGGER")),
        (b"../../etc/passwd ../../x", (-1, "")),
        (b"2 ../../etc/cron.d/x", (2, "")),
        (b"7 __import__('os').system('id')", (7, "")),
        (b"99999999999 WATCHDOG_TIMEOUT", (-1, "WATCHDOG_TIMEOUT")),
        (b"-5 PEER_REQUEST", (-1, "PEER_REQUEST")),
        (b"\xff\xfe\x00 \x80", (-1, "")),
        (b"1 " + b"A" * 10_000_000, (-1, "")),
        (b"", (-1, "")),
    ],
)
def test_a_request_description_is_a_rank_and_a_known_reason(
    raw: bytes, expected: tuple[int, str]
) -> None:
    assert parse_request(raw) == expected


torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flightrec.recorder.exchange.store import connect, default_store  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.gloo import traced_runtime  # noqa: E402


@pytest.fixture
def client(pg: None) -> object:
    """A second client of the job's store: what anyone who can reach MASTER_PORT has."""
    store = default_store()
    return connect(store.host, store.port)


def wait_for_files(folder: Path, count: int, timeout: float = 10.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(p for p in folder.glob(f"*{SUFFIX}") if not p.name.startswith("."))
        if len(files) >= count or time.monotonic() > deadline:
            return files
        time.sleep(0.05)


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def listening(rt: Runtime, namespace: str) -> None:
    """Poll the store under ``namespace`` (FLIGHTREC_JOB_ID) instead of the default one."""
    rt.peers.stop()  # started by enable() where the group already existed
    rt.peers.namespace = namespace
    rt.start_background()
    assert rt.peers.poller is not None


def test_hostile_store_values_never_leave_the_dump_folder(
    tmp_path: Path, client: object, pg: None
) -> None:
    folder = tmp_path / "a" / "b" / "dumps"
    with traced_runtime(folder, buffer=16) as rt:
        listening(rt, "job-1")
        dist.all_reduce(torch.ones(2))
        keys = Keys("job-1")
        hostile = [b"../../../escaped ../../../escaped", b"0 ../../x\n/etc/passwd\xff"]
        for n, value in enumerate(hostile, start=1):
            client.set(keys.request(n), value)  # type: ignore[attr-defined]
            before = len(wait_for_files(folder, 0, 0))
            assert len(wait_for_files(folder, before + 1)) == before + 1
            time.sleep(1.0)  # one request-driven dump per second
    files = all_files(tmp_path)
    assert files and all(p.parent == folder for p in files), files
    assert all(OUR_NAMES.match(p.name) for p in files), [p.name for p in files]
    for path in folder.glob(f"*{SUFFIX}"):
        h = read_dump(path).header
        assert h.reason == pb.PEER_REQUEST and h.requested_by in (-1, 0)
        assert h.reason_detail.endswith("(unknown)") and ".." not in h.reason_detail


def test_a_request_of_another_job_is_not_ours(tmp_path: Path, client: object, pg: None) -> None:
    with traced_runtime(tmp_path, buffer=16) as rt:
        listening(rt, "job-a")
        post_request(client, Keys("job-b"), 3, "WATCHDOG_TIMEOUT")
        time.sleep(1.0)
        assert wait_for_files(tmp_path, 0, 0) == []
        post_request(client, Keys("job-a"), 3, "WATCHDOG_TIMEOUT")
        (path,) = wait_for_files(tmp_path, 1)
    h = read_dump(path).header
    assert (h.reason, h.requested_by) == (pb.PEER_REQUEST, 3)


def test_a_request_flood_costs_at_most_one_dump_per_second(
    tmp_path: Path, client: object, pg: None
) -> None:
    with traced_runtime(tmp_path, buffer=16) as rt:
        listening(rt, "job-flood")
        keys = Keys("job-flood")
        client.set(keys.requests, str(10**12))  # type: ignore[attr-defined]  # a counter moved
        start = time.monotonic()
        while time.monotonic() - start < 1.5:
            post_request(client, keys, 0, "CLI_TRIGGER")
            time.sleep(0.01)
        time.sleep(0.3)
        files = wait_for_files(tmp_path, 0, 0)
        assert 1 <= len(files) <= 2, files
        # The poller is still alive and caught up: a later request is answered.
        time.sleep(1.0)
        post_request(client, keys, 0, "CLI_TRIGGER")
        assert len(wait_for_files(tmp_path, len(files) + 1)) == len(files) + 1


# -- the analyzer -----------------------------------------------------------------------------
def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli")])
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", "analyze", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def stalled() -> Job:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    return job


WHY = {
    "truncated": "truncated", "zero-length": "empty file", "random": "not a flightrec dump",
    "wrong-version": "schema 9", "enormous": "larger than any dump",
    "enormous-ring": "larger than any black box",
}  # fmt: skip
"""Each bad kind, and the words its one line gives as the reason."""


def bad_files(folder: Path, good: Path) -> dict[str, Path]:
    """One file of each bad kind, named like dumps, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = good.read_bytes()
    wrong = read_dump(good)
    wrong.schema_major = 9
    files = {
        "truncated": data[: len(data) // 2],
        "zero-length": b"",
        "random": os.urandom(4096),
        "wrong-version": wrong.SerializeToString(),
    }
    out = {}
    for kind, content in files.items():
        out[kind] = folder / f"flightrec-{kind}{SUFFIX}"
        out[kind].write_bytes(content)
    enormous = folder / f"flightrec-enormous{SUFFIX}"
    with open(enormous, "wb") as f:  # sparse: 300 MB claimed, nothing allocated
        f.write(MAGIC_PREFIX)
        f.truncate(300 * 1024 * 1024)
    out["enormous"] = enormous
    ring = folder / "flightrec-rank00003-node9-999.ring"
    with open(ring, "wb") as f:  # a black box, sparse, far larger than any ring
        f.write(BLACKBOX_MAGIC)
        f.truncate(300 * 1024 * 1024)
    out["enormous-ring"] = ring
    return out


def test_every_bad_file_is_one_line_and_the_good_ones_are_analyzed(tmp_path: Path) -> None:
    job = stalled()
    paths = job.write(tmp_path)
    bad = bad_files(tmp_path / "bad", paths[0])
    # A second process claiming rank 1, and a dump of another job.
    dup = job.build(1, dump_index=0)
    dup.header.pid = 4242
    write_dump(dup, tmp_path / "dup", "flightrec-rank00001-4242-000-watchdog_timeout.frdump")
    other = healthy(Job(job_id="old-job")).build(0, wall_offset_s=-3600)
    write_dump(other, tmp_path / "old", "flightrec-rank00000-77-000-watchdog_timeout.frdump")
    start = time.monotonic()
    result = analyze(tmp_path)
    assert time.monotonic() - start < 60
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == len(bad), lines
    for kind, path in bad.items():
        (line,) = [x for x in lines if path.name in x]
        assert WHY[kind] in line, line
    assert "Rank 2" in result.stdout.split("\n", 3)[1]
    assert "rank 1 written by more than one process" in result.stdout
    assert "another job 'old-job'" in " ".join(result.stdout.split())


def test_duplicated_rank_and_other_job_beside_a_healthy_job(tmp_path: Path) -> None:
    # No finding, so exit 0; each oddity is one note, and no file is blamed on stderr.
    job = healthy(Job())
    for rank in range(job.world_size):
        job.exited(rank)
    job.write(tmp_path)
    dup = job.build(1, dump_index=0)
    dup.header.pid = 4242
    write_dump(dup, tmp_path / "dup", "flightrec-rank00001-4242-000-process_exit.frdump")
    other = healthy(Job(job_id="old-job")).build(0, wall_offset_s=-3600)
    write_dump(other, tmp_path / "old", "flightrec-rank00000-77-000-watchdog_timeout.frdump")
    result = analyze(tmp_path)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    # A long note wraps at the terminal's width: read the report as one line of words.
    notes = " ".join(result.stdout.split()).split("note: ")[1:]
    assert len(notes) == 2, notes
    assert "rank 1 written by more than one process" in notes[1]
    assert "another job 'old-job'" in notes[0]


@pytest.mark.parametrize(
    "kind", ["truncated", "wrong-version", "enormous", "enormous-ring"]
)  # others: test_cli_analyze
def test_a_bad_file_alone_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    (good,) = stalled().write(tmp_path / "good", ranks=[0])
    path = bad_files(tmp_path / "bad", good)[kind]
    result = analyze(path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(path) in result.stderr and WHY[kind] in result.stderr, result.stderr
