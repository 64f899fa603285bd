"""Uncaught exceptions are recorded where Python hands them over, and handed on unchanged."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flightrec.recorder.dumping.exceptions import ExceptionHooks, RaisedException, from_error_file


def compute_loss() -> None:
    raise ValueError("loss is NaN")


@pytest.fixture
def hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[ExceptionHooks, list[RaisedException], list[Any]]:
    seen: list[RaisedException] = []
    previous: list[Any] = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: previous.append(("sys", a[0])))
    monkeypatch.setattr(
        threading, "excepthook", lambda args: previous.append(("thread", args.exc_type))
    )
    h = ExceptionHooks(seen.append)
    h.install()
    yield h, seen, previous
    h.uninstall()


def test_the_main_threads_exception_is_recorded_and_the_previous_hook_runs(hooks: Any) -> None:
    _, seen, previous = hooks
    try:
        compute_loss()
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    (x,) = seen
    assert (x.type, x.message, x.is_main, x.via) == (
        "ValueError",
        "loss is NaN",
        True,
        "sys.excepthook",
    )
    assert x.frames[0][1] == "compute_loss" and x.frames[0][0] == __file__
    assert previous == [("sys", ValueError)]


def test_another_threads_exception_is_recorded_and_chained(hooks: Any) -> None:
    _, seen, previous = hooks
    t = threading.Thread(target=compute_loss, name="loader")
    t.start()
    t.join()
    (x,) = seen
    assert (x.thread, x.is_main, x.via) == ("loader", False, "threading.excepthook")
    assert previous == [("thread", ValueError)]


def test_a_failure_exit_while_handling_an_exception_records_it(hooks: Any) -> None:
    """torch.multiprocessing.spawn's children end so: except Exception: ...; sys.exit(1)."""
    h, seen, _ = hooks
    with pytest.raises(SystemExit):
        try:
            compute_loss()
        except Exception:
            sys.exit(1)
    with pytest.raises(SystemExit):
        sys.exit(0)  # a clean exit records nothing
    (x,) = seen
    assert (x.type, x.via) == ("ValueError", "sys.exit")
    h.uninstall()
    assert sys.exit is not h._exit


def test_torchruns_error_file_is_read_when_this_process_wrote_it(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    stack = 'Traceback (most recent call last):\n  File "train.py", line 9, in main\n    step()\n  File "train.py", line 57, in compute_loss\n    raise ValueError("x")\nValueError: x\n'
    body = {"message": {"message": "ValueError: loss is NaN", "extraInfo": {"py_callstack": stack}}}
    path.write_text(json.dumps(body))
    x = from_error_file(str(path), 0)
    assert x is not None and (x.type, x.message) == ("ValueError", "loss is NaN")
    assert x.frames == [("train.py", "compute_loss", 57), ("train.py", "main", 9)]
    assert from_error_file(str(path), time.time_ns() + 10**12) is None  # an older attempt's
    path.write_text("{not json")
    assert from_error_file(str(path), 0) is None


def _target() -> None:
    raise RuntimeError("CUDA error: device-side assert triggered")


def test_a_multiprocessing_process_that_raises_is_recorded(tmp_path: Path) -> None:
    """Process._bootstrap prints the traceback itself and exits 1: neither an excepthook nor
    sys.exit sees the exception; multiprocessing's exit function, in its finally, does."""
    import multiprocessing

    out = tmp_path / "seen.json"

    def record(x: RaisedException) -> None:
        out.write_text(json.dumps([x.type, x.message, x.via, x.is_main, x.frames[0][1]]))

    h = ExceptionHooks(record)
    h.install()
    try:
        p = multiprocessing.get_context("fork").Process(target=_target)
        p.start()
        p.join(30)
    finally:
        h.uninstall()
    assert p.exitcode == 1
    kind, message, via, is_main, function = json.loads(out.read_text())
    assert (kind, via, is_main, function) == (
        "RuntimeError",
        "multiprocessing.Process",
        True,
        "_target",
    )
    assert message == "CUDA error: device-side assert triggered"


def test_multiprocessing_exit_elsewhere_records_nothing(hooks: Any) -> None:
    """Called from anywhere but Process._bootstrap (a parent's atexit), it only passes on."""
    h, seen, _ = hooks
    passed: list[bool] = []
    real, h._prev_mp_exit = h._prev_mp_exit, lambda: passed.append(True)
    try:
        raise ValueError("handled")
    except ValueError:
        h._mp_exit()
    finally:
        h._prev_mp_exit = real  # what uninstall puts back
    assert seen == [] and passed == [True]
