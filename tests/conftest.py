"""Build the C extensions in place, so that ``pytest`` tests what ``pip install`` runs.

pytest imports the source tree first (``pythonpath`` in pyproject.toml), where no built
extension lies after a fresh clone: without this, the C hot path would be tested only where
someone remembered ``python setup.py build_ext --inplace``, and its tests would quietly skip. It
is compiled from ``_fast.c`` (and the dump reader's loops from ``format/_wire.c``, the progress
records' reader from ``format/_progress.c``, the straggler pass's from
``analysis/timing/_arrivals.c``, the native-pickle reader from ``readers/native/_pickled.c``)
when missing or older than the source (a few seconds, once), before
any test imports flightrec; the subprocesses the integration tests start import the same tree.
Where it cannot be built (no compiler: the install itself would fall back to pure Python), the
tests of the C path skip with that reason and everything else runs on the pure-Python path.
``FLIGHTREC_TEST_NO_BUILD=1`` skips the build.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "flightrec" / "recorder" / "hotpath" / "_fast.c"
SOURCES = (
    SOURCE,
    ROOT / "flightrec" / "format" / "_wire.c",
    ROOT / "flightrec" / "format" / "_progress.c",
    ROOT / "flightrec" / "analysis" / "timing" / "_arrivals.c",
    ROOT / "flightrec" / "readers" / "native" / "_pickled.c",
)


def _built(source: Path = SOURCE) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = source.with_name(source.stem + suffix)
        if path.exists():
            return path
    return None


def _current(source: Path) -> bool:
    built = _built(source)
    return built is not None and built.stat().st_mtime >= source.stat().st_mtime


def _build() -> str:
    """Build if needed; returns what the report header says about the hot path."""
    built = _built()
    if built is not None and all(_current(source) for source in SOURCES):
        return f"C extension {built.name} (up to date)"
    if os.environ.get("FLIGHTREC_TEST_NO_BUILD") == "1":
        return "C extension not rebuilt (FLIGHTREC_TEST_NO_BUILD=1)"
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", tmp, "--build-lib", tmp],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
    built = _built()
    if built is None or built.stat().st_mtime < SOURCE.stat().st_mtime:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"C extension NOT built, pure Python only ({why})"
    return f"C extension {built.name} (built in place for these tests)"


_HOT_PATH = _build()


def pytest_report_header(config: pytest.Config) -> str:
    return f"flightrec hot path: {_HOT_PATH}"
