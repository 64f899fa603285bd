"""Which frames are the user's (``flightrec.frames``): what a verdict points at."""

from __future__ import annotations

import os
import selectors
import threading

import pytest

import flightrec
from flightrec import frames
from flightrec.analysis.model import FrameInfo, is_library_frame, user_frame
from flightrec.format import flightrec_pb2 as pb
from flightrec.frames import (
    FrameOrigin,
    Roots,
    call_name,
    is_library_file,
    keep_user_frames,
    roots_of_this_process,
    without_own_frames,
)

VENV = "/home/u/.venv/lib/python3.11/site-packages"
USER, FRAMEWORK, CORE = FrameOrigin.USER, FrameOrigin.FRAMEWORK, FrameOrigin.CORE


@pytest.mark.parametrize(
    ("file", "origin"),
    [
        (f"{VENV}/torch/distributed/distributed_c10d.py", CORE),
        (f"{VENV}/typing_extensions.py", CORE),  # torch's deprecated-API wrapper
        ("/usr/lib/python3.11/threading.py", CORE),
        ("<frozen importlib._bootstrap>", CORE),
        ("flightrec/recorder/hooks/ddp.py", CORE),
        ("/job/train.py", USER),
        # Any other installed package is a library: the user's line is the first frame
        # outside it (accelerate's gather is not where the user made the call).
        (f"{VENV}/accelerate/utils/operations.py", FRAMEWORK),
        (f"{VENV}/torchtitan/train.py", FRAMEWORK),
        ("/usr/lib/python3/dist-packages/ray/train/_internal/utils.py", FRAMEWORK),
        (f"{VENV}/typing_extensions_helpers/x.py", FRAMEWORK),
        # A folder's name makes nothing a library: a clone of this repository, or a job kept
        # in ~/torch/, is the user's code.
        ("/home/u/flightrec/train.py", USER),
        ("/tmp/x/flightrec/tests/integration/scripts/verdicts.py", USER),
        ("/home/u/torch/train.py", USER),
        ("/home/u/torch/data/loader.py", USER),
        # ... while a source install of either, on any machine, keeps its package layout.
        ("/home/u/pytorch/torch/distributed/distributed_c10d.py", CORE),
        ("/home/u/pytorch/torch/_tensor.py", CORE),
        ("/tmp/x/flightrec/flightrec/recorder/hooks/install.py", CORE),
    ],
)
def test_origin_from_the_path_alone(file: str, origin: FrameOrigin) -> None:
    """What a reader decides for a frame its dump gives no origin (older and native dumps)."""
    assert Roots().origin(file) is origin
    assert frames.is_library_file(file) is (origin is not USER)


def test_the_recording_processs_folders_decide() -> None:
    """Prefixes, site folders and editable installs are libraries; the working tree is the
    user's, and where they nest the deeper folder wins."""
    roots = Roots(
        core=("/opt/py/lib/python3.11/",),
        installed=("/usr/local/", "/proj/.venv/", "/src/lightning/"),
        user=("/usr/local/app/", "/proj/"),
    )
    assert roots.origin("/usr/local/share/ray/worker.py") is FRAMEWORK  # below a prefix
    assert roots.origin("/usr/local/app/train.py") is USER  # a job installed under /usr/local
    assert roots.origin("/proj/train.py") is USER
    assert roots.origin("/proj/.venv/lib/python3.11/site-packages/x/y.py") is FRAMEWORK
    assert roots.origin("/src/lightning/src/lightning/fabric/strategies/ddp.py") is FRAMEWORK
    assert roots.origin("/opt/py/lib/python3.11/json/decoder.py") is CORE
    assert roots.origin("/elsewhere/model.py") is USER


def test_an_editable_install_is_a_framework_unless_it_is_the_working_tree(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    work = tmp_path / "proj"
    (work / "pkg").mkdir(parents=True)
    lightning = tmp_path / "lightning"
    (lightning / "src").mkdir(parents=True)
    monkeypatch.chdir(work)
    roots = roots_of_this_process(editable=lambda: [str(work), str(lightning), str(work / "pkg")])
    assert roots.origin(str(lightning / "src" / "trainer.py")) is FRAMEWORK
    assert roots.origin(str(work / "pkg" / "model.py")) is USER
    assert roots.origin(str(work / "train.py")) is USER


def test_this_processs_own_installation_is_library_code() -> None:
    """Wherever flightrec and the standard library are installed here, their files are library
    code, user files beside them are not."""
    package = os.path.dirname(os.path.abspath(flightrec.__file__))
    assert is_library_file(os.path.join(package, "frames.py"))
    assert is_library_file(selectors.__file__)
    assert not is_library_file(os.path.join(os.path.dirname(package), "train.py"))
    assert frames.origin_of(pytest.__file__) is FRAMEWORK  # installed here


def test_the_schema_and_the_rules_name_the_same_origins() -> None:
    assert {o.name: o.value for o in FrameOrigin} == {
        name.removeprefix("ORIGIN_"): value for name, value in pb.FrameOrigin.items()
    }


def test_a_cut_stack_keeps_the_innermost_frame_the_framework_call_and_the_users() -> None:
    names = ["torch", "accelerate op", "Accelerator.gather", "train", "main", "runpy"]
    origins = [CORE, FRAMEWORK, FRAMEWORK, USER, USER, CORE]
    assert keep_user_frames(names, origins, names, 4) == [
        "torch",
        "Accelerator.gather",
        "train",
        "main",
    ]
    assert keep_user_frames(names, origins, names, 3) == ["torch", "Accelerator.gather", "train"]
    # behind a decorator's wrapper, the function it wraps is the call kept
    wrapped = ["backend", "all_reduce", "timed_op.<locals>.log_wrapper", "step", "main"]
    origins = [FRAMEWORK, FRAMEWORK, FRAMEWORK, USER, USER]
    assert keep_user_frames(wrapped, origins, wrapped, 3) == ["backend", "all_reduce", "step"]
    plain = [CORE, CORE, USER, USER]
    assert keep_user_frames(["a", "b", "c", "d"], plain, ["a", "b", "c", "d"], 3) == ["a", "c", "d"]


def _frame(file: str, function: str, line: int, origin: FrameOrigin = FrameOrigin.UNKNOWN):  # type: ignore[no-untyped-def]
    return FrameInfo(file, function, line, origin=origin)


def test_the_users_line_names_the_framework_call_it_made() -> None:
    stack = (
        _frame(f"{VENV}/torch/distributed/distributed_c10d.py", "all_gather", 3900),
        _frame(f"{VENV}/accelerate/utils/operations.py", "_gpu_gather_one", 355),
        _frame(f"{VENV}/accelerate/accelerator.py", "Accelerator.gather", 2600),
        _frame("/job/train.py", "main", 42),
    )
    frame = user_frame(stack)
    assert frame == stack[3] and frame is not None
    assert frame.where() == "job/train.py:42 via Accelerator.gather"
    # a decorator's wrapper is named by the function it wraps
    wrapped = (
        _frame(f"{VENV}/torch/distributed/distributed_c10d.py", "all_reduce", 2800),
        _frame(f"{VENV}/deepspeed/comm/torch.py", "TorchBackend.all_reduce", 160),
        _frame(f"{VENV}/deepspeed/comm/comm.py", "all_reduce", 640),
        _frame(f"{VENV}/deepspeed/comm/comm.py", "timed_op.<locals>.log_wrapper", 117),
        _frame("/job/train.py", "step", 9),
    )
    found = user_frame(wrapped)
    assert found is not None and found.called == "deepspeed.comm.all_reduce"
    # straight into torch: the op names the call
    direct = user_frame((wrapped[0], wrapped[4]))
    assert direct is not None and direct.where() == "job/train.py:9"
    # no user frame at all: the framework's call into torch, not torch's own line
    assert user_frame(wrapped[:3]) == wrapped[1]


def test_a_recorded_origin_beats_the_path() -> None:
    """A dump says whose code a frame was where the job ran (an editable install, a project
    kept under the interpreter's prefix); the reader believes it."""
    library = _frame(
        "/src/lightning/fabric/strategies/ddp.py", "DDPStrategy.all_reduce", 9, FRAMEWORK
    )
    user = _frame(f"{VENV}/myjob/train.py", "main", 3, USER)
    assert is_library_frame(library) and not is_library_frame(user)
    assert user_frame((library, user)) == user


@pytest.mark.parametrize(
    ("file", "function", "name"),
    [
        (f"{VENV}/accelerate/accelerator.py", "Accelerator.gather", "Accelerator.gather"),
        (f"{VENV}/deepspeed/comm/comm.py", "all_reduce", "deepspeed.comm.all_reduce"),
        (f"{VENV}/lightning/__init__.py", "seed_everything", "lightning.seed_everything"),
        ("/src/pkg/util.py", "helper", "helper"),
    ],
)
def test_call_names(file: str, function: str, name: str) -> None:
    assert call_name(file, function) == name


def test_dump_time_stacks_start_where_the_program_was() -> None:
    own = os.path.dirname(os.path.abspath(flightrec.__file__)) + os.sep
    lib = threading.__file__
    program = [("train.py", "save_checkpoint", 48), ("train.py", "main", 90)]

    def cut(stack, own_thread=True):  # type: ignore[no-untyped-def]
        return without_own_frames(stack, [f for f, _, _ in stack], own_thread)

    # SIGTERM caught the main thread: flightrec's handler waits for the dump on top of it
    handler = [(lib, "Condition.wait", 331), (lib, "Event.wait", 629)]
    handler += [(own + "recorder/signals.py", "_handler", 115)]
    assert cut(handler + program) == program
    # a thread inside a traced collective keeps torch's frames and the wrapper's caller
    inside = [("torch/distributed/distributed_c10d.py", "all_reduce", 3252)]
    inside += [("<flightrec wrapper of all_reduce>", "all_reduce", 9), *program]
    assert cut(inside) == inside
    # flightrec's own threads keep their stacks
    watchdog = [(own + "recorder/watchdog.py", "_loop", 60), (lib, "run", 982)]
    assert cut(watchdog) == watchdog
    # the main thread writing the exit dump from atexit: the program returned from main
    assert cut([(own + "recorder/dumping/dumper.py", "Dumper._dump", 250)], False) == []
    # a helper thread that only runs flightrec's signal dump says nothing either
    assert cut(watchdog, own_thread=False) == []
    # a dump from another machine: the recorder's modules by their layout
    elsewhere = [("/opt/x/site-packages/flightrec/recorder/signals.py", "_handler", 1), *program]
    assert cut(elsewhere, own_thread=False) == program
