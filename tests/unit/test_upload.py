"""FLIGHTREC_DIR as a URL: the settings it makes, and the upload thread against fsspec's
in-memory filesystem (no network)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest

from flightrec.format.location import is_url, join_url, local_path, url_scheme
from flightrec.readers.remote import _relative
from flightrec.recorder.config import DEFAULT_DIR, from_env
from flightrec.recorder.dumping.upload import Uploader


def test_a_url_dir_spools_locally_and_uploads_there() -> None:
    c = from_env({"FLIGHTREC_DIR": "s3://bucket/jobs/42/", "FLIGHTREC_SPOOL": "/scratch/fr"})
    assert c.upload_url == "s3://bucket/jobs/42" and c.directory == "/scratch/fr"
    c = from_env({"FLIGHTREC_DIR": "gs://b/p"})
    assert c.upload_url == "gs://b/p" and c.directory == DEFAULT_DIR
    c = from_env({"FLIGHTREC_DIR": "file:///shared/fr"})
    assert c.upload_url == "" and c.directory == "/shared/fr"
    c = from_env({"FLIGHTREC_DIR": "/shared/fr", "FLIGHTREC_SPOOL": "/ignored"})
    assert c.upload_url == "" and c.directory == "/shared/fr"


def test_bad_retry_and_port_values_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    c = from_env({"FLIGHTREC_UPLOAD_RETRIES": "99", "FLIGHTREC_METRICS_PORT": "http"})
    assert c.upload_retries == 3 and c.metrics_port == 0
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    c = from_env({"FLIGHTREC_METRICS_PORT": "9400", "FLIGHTREC_METRICS_ADDR": "127.0.0.1"})
    assert c.metrics_port == 9400 and c.metrics_addr == "127.0.0.1"


def test_locations() -> None:
    assert url_scheme("S3://b/p") == "s3" and is_url("memory://x")
    assert not is_url("/tmp/x") and not is_url("file:///tmp/x") and not is_url("dumps")
    assert local_path("file:///tmp/x") == "/tmp/x" and local_path("rel/x") == "rel/x"
    assert join_url("s3://b/p/", "/x.frdump") == "s3://b/p/x.frdump"


def test_keys_that_leave_the_folder_or_are_hidden_are_refused() -> None:
    assert _relative("b/p/r0/x.frdump", "b/p") == "r0/x.frdump"
    for key in ("b/p/../x", "b/p/.tmp-1.frdump", "b/p/a/./x", "b/p//x", "b/px", "b/p/a\\..\\x"):
        assert _relative(key, "b/p") is None, key


def spooled(
    tmp_path: Path, name: str = "flightrec-rank00001-7-000-watchdog_timeout.frdump"
) -> Path:
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    path = spool / name
    path.write_bytes(b"dump bytes")
    return path


def test_an_uploaded_dump_leaves_the_spool(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec", reason="uploads need fsspec (the s3 extra)")
    path = spooled(tmp_path)
    up = Uploader("memory://fr-test/job", str(path.parent), retries=0)
    up.submit(path)
    up.close(wait_s=10)
    fs = fsspec.filesystem("memory")
    assert fs.cat_file(f"/fr-test/job/{path.name}") == b"dump bytes"
    assert not path.exists()
    assert (up.uploaded, up.failed, up.pending) == (1, 0, 0)


def test_a_failed_upload_is_retried_then_kept_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("fsspec", reason="uploads need fsspec (the s3 extra)")
    path = spooled(tmp_path)
    # No such protocol: every try fails the same way.
    up = Uploader("nosuchproto://b/job", str(path.parent), retries=2, backoff_s=0.01)
    caller = threading.current_thread()
    up.submit(path)  # returns at once; the work is on the upload thread
    up.close(wait_s=10)
    assert path.read_bytes() == b"dump bytes"
    assert (up.uploaded, up.failed) == (0, 1)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    message = warned[0].getMessage()
    assert "after 3 tries" in message and str(path) in message and "nosuchproto://b/job/" in message
    assert (
        all(r.threadName == "flightrec-upload" for r in warned)
        and caller.name != "flightrec-upload"
    )


def test_exit_does_not_wait_past_its_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("fsspec", reason="uploads need fsspec (the s3 extra)")
    path = spooled(tmp_path)
    # Retries a minute apart: still pending when the process ends.
    up = Uploader("nosuchproto://b/job", str(path.parent), retries=5, backoff_s=60)
    up.submit(path)
    up.close(wait_s=0.3)
    assert path.exists()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("1 dump(s) not uploaded" in line and str(path.parent) in line for line in lines)


def test_a_url_without_fsspec_is_one_usage_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from flightrec.errors import UsageError
    from flightrec.readers.remote import download

    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "fsspec.core", None)
    with pytest.raises(UsageError) as err, download("s3://bucket/job"):
        pass
    assert str(err.value).startswith("s3://bucket/job: ")
    assert "pip install 'torch-flightrec[s3]'" in str(err.value)
