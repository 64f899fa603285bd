"""Which frames are the user's (``flightrec.frames``): what a verdict points at."""

from __future__ import annotations

import pytest

from flightrec.frames import is_library_file, keep_user_frames

VENV = "/home/u/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("file", "library"),
    [
        (f"{VENV}/torch/distributed/distributed_c10d.py", True),
        (f"{VENV}/typing_extensions.py", True),  # torch's deprecated-API wrapper
        ("/usr/lib/python3.11/threading.py", True),
        ("<frozen importlib._bootstrap>", True),
        ("flightrec/recorder/ddp.py", True),
        ("/job/train.py", False),
        (f"{VENV}/torchtitan/train.py", False),  # a training framework is the user's code
        (f"{VENV}/typing_extensions_helpers/x.py", False),
    ],
)
def test_library_files(file: str, library: bool) -> None:
    assert is_library_file(file) is library


def test_a_cut_stack_keeps_the_innermost_frame_and_the_users() -> None:
    files = [f"{VENV}/torch/a.py", f"{VENV}/typing_extensions.py", "/job/train.py", "/job/main.py"]
    assert keep_user_frames(files, files, 3) == [files[0], files[2], files[3]]
