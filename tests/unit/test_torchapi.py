"""What the installed torch offers the recorder, probed at start-up (recorder/torchapi.py), and
a torch newer than the newest tested: traced through the public API, saying so in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flightrec.recorder import torchapi

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.15.0+cu132", (2, 15)), ("2.4.1", (2, 4)), ("2.16.0.dev20261101", (2, 16)), ("x", None)],
)
def test_release_of(version: str, release: tuple[int, int] | None) -> None:
    assert torchapi.release_of(version) == release


def test_the_installed_torch_is_within_the_tested_range() -> None:
    pytest.importorskip("torch.distributed")
    api = torchapi.probe()
    release = torchapi.release_of(api.version)
    assert release is not None and torchapi.OLDEST_TESTED <= release <= torchapi.NEWEST_TESTED
    assert api.fast_paths and not api.notice()
    # Every release tested has these; a new one that drops one fails here, not in a job.
    assert api.world and api.native_dump


def test_a_newer_torch_turns_the_private_paths_off() -> None:
    pytest.importorskip("torch.distributed")
    major, minor = torchapi.NEWEST_TESTED
    api = torchapi.probe(version=f"{major}.{minor + 1}.0")
    assert api.newer_than_tested and not api.fast_paths and not api.merge_native
    line = api.notice()
    assert "\n" not in line and f"torch {major}.{minor + 1}.0 is newer" in line


JOB = textwrap.dedent(
    """
    import socket
    from flightrec.recorder import torchapi
    torchapi.NEWEST_TESTED = (2, 0)  # every torch is newer than that
    import torch, torch.distributed as dist  # FLIGHTREC=1: the start-up hook traces from here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(3))
    from flightrec.recorder import runtime
    from flightrec.recorder.hooks import codegen
    rt = runtime.current()
    assert rt is not None and rt.hooks.installed and not codegen.USE_FAST, "not traced"
    assert not rt.config.native, "PyTorch's recorder merged"
    dist.destroy_process_group()
    """
)


def test_a_job_on_a_newer_torch_is_traced_and_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    env = {
        "FLIGHTREC": "1", "FLIGHTREC_DIR": str(tmp_path), "FLIGHTREC_DUMP_ON_EXIT": "1",
        "PYTHONPATH": f"{ROOT}:{ROOT / 'cli'}", "PATH": "/usr/bin:/bin",
    }  # fmt: skip
    run = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if "newer than the newest tested" in line]
    assert len(lines) == 1 and "public API" in lines[0], run.stderr
    from flightrec.format.read import read_dump

    (dump,) = sorted(tmp_path.rglob("*.frdump"))
    assert "all_reduce" in read_dump(dump).strings
