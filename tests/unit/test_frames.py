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
        ("flightrec/recorder/hooks/ddp.py", True),
        ("/job/train.py", False),
        (f"{VENV}/torchtitan/train.py", False),  # a training framework is the user's code
        (f"{VENV}/typing_extensions_helpers/x.py", False),
        # A folder's name makes nothing a library (issue 31): a clone of this repository, or
        # a job kept in ~/torch/, is the user's code.
        ("/home/u/flightrec/train.py", False),
        ("/tmp/x/flightrec/tests/integration/scripts/verdicts.py", False),
        ("/home/u/torch/train.py", False),
        ("/home/u/torch/data/loader.py", False),
        # ... while a source install of either, on any machine, keeps its package layout.
        ("/home/u/pytorch/torch/distributed/distributed_c10d.py", True),
        ("/home/u/pytorch/torch/_tensor.py", True),
        ("/tmp/x/flightrec/flightrec/recorder/hooks/install.py", True),
    ],
)
def test_library_files(file: str, library: bool) -> None:
    assert is_library_file(file) is library


def test_a_cut_stack_keeps_the_innermost_frame_and_the_users() -> None:
    files = [f"{VENV}/torch/a.py", f"{VENV}/typing_extensions.py", "/job/train.py", "/job/main.py"]
    assert keep_user_frames(files, files, 3) == [files[0], files[2], files[3]]


def test_this_processs_own_installation_is_library_code() -> None:
    """Wherever flightrec and the standard library are installed here, their files are library
    code, user files beside them are not."""
    import os
    import selectors

    import flightrec

    package = os.path.dirname(os.path.abspath(flightrec.__file__))
    assert is_library_file(os.path.join(package, "frames.py"))
    assert is_library_file(selectors.__file__)
    assert not is_library_file(os.path.join(os.path.dirname(package), "train.py"))
