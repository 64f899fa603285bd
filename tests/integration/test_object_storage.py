"""FLIGHTREC_DIR as an S3 URL and ``flightrec analyze s3://...``, against a real S3 endpoint
(moto's server on 127.0.0.1) and real 4-rank gloo jobs."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightrec.format.schema import SUFFIX
from tests.integration.jobs import child_env, start_job
from tests.integration.s3 import S3, s3_endpoint

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    with s3_endpoint(monkeypatch) as endpoint:
        yield endpoint


def analyze(target: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightrec_cli", "analyze", target, *args],
        env=child_env(env, flightrec=False), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def wait_for_keys(s3: S3, bucket: str, prefix: str, count: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        keys = [k for k in s3.keys(bucket, prefix) if k.endswith(SUFFIX)]
        if len(keys) >= count or time.monotonic() > deadline:
            return keys
        time.sleep(0.1)


def test_live_hang_dumps_land_in_the_bucket_and_are_analyzed_from_there(
    s3: S3, tmp_path: Path
) -> None:
    s3.client.create_bucket(Bucket="dumps")
    spool = tmp_path / "spool"
    env = {
        **s3.env,
        "FLIGHTREC_DIR": "s3://dumps/jobs/hang-1",
        "FLIGHTREC_SPOOL": str(spool),
        "FLIGHTREC_TIMEOUT": "2",
        "FLIGHTREC_VERDICT": "0",
    }
    with start_job("scenario.py", ["stall", "--stall-rank", "2"], env=env, workdir=tmp_path) as job:
        keys = wait_for_keys(s3, "dumps", "jobs/hang-1/", 4, timeout=30)
        assert len(keys) >= 4, job.output()
        # Uploaded dumps leave the spool; the black boxes stay local (a hard crash needs them).
        time.sleep(0.5)
        assert not list(spool.glob(f"*{SUFFIX}")), job.output()
        assert list(spool.glob("flightrec-rank*.ring")), job.output()
        assert not [k for k in s3.keys("dumps") if k.endswith(".ring")]
        assert all(p.poll() is None for p in job.procs), job.output()  # the job waits on
        # SIGTERM (torchrun's, when a worker dies) ends a process without its atexit
        # handlers: its last dump is still uploaded before it goes.
        job.signal(2, signal.SIGTERM)
        job.procs[2].wait(20)
        assert [k for k in s3.keys("dumps", "jobs/hang-1/") if "signal_term" in k], job.output()

    result = analyze("s3://dumps/jobs/hang-1", s3.env, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["ranks_with_dump"] == [0, 1, 2, 3]
    assert "signal_term" not in report["dumps"]["2"]  # the hang's dump, not what came after
    first = report["findings"][0]
    assert first["kind"] == "not_arrived" and first["ranks"] == [2], first
    # Files are named by the objects they came from, never by a deleted temporary folder.
    assert all(p.startswith("s3://dumps/jobs/hang-1/") for p in report["dumps"].values())


def test_endpoint_down_during_the_job_keeps_dumps_locally_with_one_warning_each(
    s3: S3, tmp_path: Path
) -> None:
    s3.client.create_bucket(Bucket="down")
    spool = tmp_path / "spool"
    env = {
        **s3.env,
        "FLIGHTREC_DIR": "s3://down/job",
        "FLIGHTREC_SPOOL": str(spool),
        "FLIGHTREC_TIMEOUT": "2",
        "FLIGHTREC_UPLOAD_RETRIES": "1",
        "FLIGHTREC_VERDICT": "0",
    }
    with start_job("scenario.py", ["stall", "--stall-rank", "2"], env=env, workdir=tmp_path) as job:
        for rank in range(4):
            job.wait_for_output(rank, "READY", timeout=30)
        s3.server.stop()  # the endpoint goes away while the job runs
        deadline = time.monotonic() + 30
        while True:  # every rank dumped, and each dump's upload was given up on
            logs = [log.read_text(errors="replace") for log in job.logs]
            lines = [
                line for text in logs for line in text.splitlines() if "could not upload" in line
            ]
            kept = sorted(spool.glob(f"*{SUFFIX}"))
            settled = all("could not upload" in text for text in logs) and len(lines) == len(kept)
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(kept) >= 4, job.output()
        assert not any("Traceback" in text for text in logs), job.output()
        assert len(lines) == len(kept), job.output()  # one warning per dump kept
        assert all("after 2 tries" in line and "it stays at" in line for line in lines), lines
        # The job is unaffected: its ranks still wait (rank 2 in its data loader).
        assert all(p.poll() is None for p in job.procs), job.output()
    # What stayed in the spool is analysed as any local folder.
    result = analyze(str(spool), {}, "--json")
    assert json.loads(result.stdout)["findings"][0]["ranks"] == [2]


def test_a_bucket_without_permission_is_one_clear_line(
    s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    # Authorization on after the next four requests (the setup below): then only IAM users
    # with a policy may act, and this one has none.
    monkeypatch.setattr(
        settings, "INITIAL_NO_AUTH_ACTION_COUNT", ActionAuthenticatorMixin.request_count + 4
    )
    import boto3

    iam = boto3.client("iam", endpoint_url=s3.endpoint)
    iam.create_user(UserName="nobody")
    key = iam.create_access_key(UserName="nobody")["AccessKey"]
    s3.client.create_bucket(Bucket="private")
    s3.client.put_object(Bucket="private", Key="job/x.frdump", Body=b"x")
    env = dict(
        s3.env, AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"]
    )
    result = analyze("s3://private/job", env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "s3://private/job" in lines[0] and "Access Denied" in lines[0], lines


def test_a_missing_bucket_and_an_empty_prefix_are_one_line_each(s3: S3) -> None:
    s3.client.create_bucket(Bucket="empty")
    for url, says in (("s3://no-such-bucket/job", "cannot list"), ("s3://empty/job", "no objects")):
        result = analyze(url, s3.env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and url in lines[0] and says in lines[0], result.stderr


def test_a_sample_reads_the_same_from_a_bucket_and_names_unreadable_objects(
    s3: S3, tmp_path: Path
) -> None:
    s3.client.create_bucket(Bucket="samples")
    sample = SAMPLES / "crashed_rank"
    for f in sample.iterdir():
        s3.client.upload_file(str(f), "samples", f"crashed/{f.name}")
    s3.client.put_object(Bucket="samples", Key="crashed/garbage.frdump", Body=b"not a dump")
    s3.client.put_object(Bucket="samples", Key="crashed/.tmp-123.frdump", Body=b"partial")
    local = analyze(str(sample), {}, "--json")
    remote = analyze("s3://samples/crashed", s3.env, "--json")
    assert remote.returncode == local.returncode == 1, remote.stderr
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert [(f["kind"], f["ranks"], f["seq"]) for f in a["findings"]] == [
        (f["kind"], f["ranks"], f["seq"]) for f in b["findings"]
    ]
    assert {r: Path(p).name for r, p in a["dumps"].items()} == {
        r: p.rsplit("/", 1)[1] for r, p in b["dumps"].items()
    }
    skipped = [line for line in remote.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and "s3://samples/crashed/garbage.frdump" in skipped[0], remote.stderr
    # One object named directly is analysed as one file.
    name = next(p.name for p in sample.glob(f"*{SUFFIX}"))
    one = analyze(f"s3://samples/crashed/{name}", s3.env, "--json")
    assert json.loads(one.stdout)["ranks_with_dump"] != []


def test_downloads_are_bounded_in_size_and_stay_inside_their_folder(s3: S3, tmp_path: Path) -> None:
    from flightrec.readers.remote import download

    s3.client.create_bucket(Bucket="odd")
    dump = next((SAMPLES / "healthy").glob(f"*{SUFFIX}"))
    s3.client.upload_file(str(dump), "odd", f"job/{dump.name}")
    limit = dump.stat().st_size
    s3.client.put_object(Bucket="odd", Key="job/huge.frdump", Body=b"\0" * (limit + 1))
    s3.client.put_object(Bucket="odd", Key="job/checkpoint.pt", Body=b"\0" * (limit + 1))
    s3.client.put_object(Bucket="odd", Key="job/../escape.frdump", Body=b"x")
    with download("s3://odd/job", limit=limit, parallel=2) as got:
        files = sorted(p.relative_to(got.folder).as_posix() for p in got.folder.rglob("*"))
        assert files == [dump.name]
        assert got.problems == (
            ("s3://odd/job/huge.frdump", f"larger than {limit:,} bytes; not downloaded"),
        )
        # The checkpoint (too large, not named like a dump) and the key leaving the folder.
        assert got.skipped == 2
        folder = got.folder
    assert not folder.exists()
    assert not (folder.parent / "escape.frdump").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_exit_dumps_are_uploaded_before_a_clean_exit(s3: S3, tmp_path: Path) -> None:
    s3.client.create_bucket(Bucket="exits")
    spool = tmp_path / "spool"
    env = {
        **s3.env,
        "FLIGHTREC_DIR": "s3://exits/run",
        "FLIGHTREC_SPOOL": str(spool),
        "FLIGHTREC_DUMP_ON_EXIT": "1",
    }
    with start_job("scenario.py", ["healthy"], env=env, workdir=tmp_path) as job:
        codes = job.wait(timeout=60)
    assert codes == [0] * 4, job.output()
    keys = [k for k in s3.keys("exits", "run/") if k.endswith(SUFFIX)]
    assert len(keys) == 4 and all("process_exit" in k for k in keys), (keys, job.output())
    assert not list(spool.glob(f"*{SUFFIX}"))
    for noise in ("Traceback", "Exception ignored", "flightrec: "):
        assert noise not in job.output(), job.output()
