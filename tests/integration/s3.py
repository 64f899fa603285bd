"""A real S3 endpoint for tests: moto's standalone server on 127.0.0.1, started and stopped here.

``s3_endpoint()`` skips the test, with the reason, where moto, fsspec or s3fs is missing (CI
installs them: the ``test`` extra). The environment it returns is what a user sets to point
s3fs and boto at another endpoint (``AWS_ENDPOINT_URL``), plus test credentials.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.jobs import free_port


@dataclass
class S3:
    """A running endpoint: its URL, the environment pointing at it, a boto3 client."""

    endpoint: str
    env: dict[str, str]
    server: Any
    client: Any

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def need_s3() -> None:
    """Skip the calling test, saying what is missing, without moto's server or s3fs."""
    for module, package in (
        ("moto.server", "moto[server]"),
        ("fsspec", "fsspec"),
        ("s3fs", "s3fs"),
        ("boto3", "boto3"),
    ):
        pytest.importorskip(module, reason=f"object storage tests need {package} (the test extra)")


@contextlib.contextmanager
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """Start moto's S3 server on a free loopback port; point this process's s3fs at it."""
    need_s3()
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # One HTTP try per call: flightrec's own retries are what the tests look at.
        "AWS_MAX_ATTEMPTS": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached instance would keep an old endpoint
    try:
        yield S3(endpoint, env, server, boto3.client("s3", endpoint_url=endpoint))
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
