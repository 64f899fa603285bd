"""Ships ``flightrec-autostart.pth`` at the top of site-packages, and builds the optional C
hot path ``flightrec.recorder.hotpath._fast``, the dump reader's loops
``flightrec.format._wire``, the reporter's progress-record reader
``flightrec.format._progress``, the straggler pass's ``flightrec.analysis.timing._arrivals`` and the
native-dump reader's ``flightrec.readers.native._pickled``.

Everything else lives in pyproject.toml. The extension is optional: where it cannot be built
(no compiler, a big-endian host) the install goes on and the recorder runs its pure-Python hot
path, which records exactly the same entries, more slowly. Tests run from the source tree build it in
place themselves (tests/conftest.py). The .pth file is how ``FLIGHTREC=1`` traces a
training script that never imports flightrec (plain python, spawn children, torchrun workers):
Python executes its single line at interpreter start-up, and that line does nothing but read
one environment variable unless tracing is asked for. An editable install (``pip install -e
.``) gets it too (``EditableWithPth``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools before 64: no editable wheels at all
    from setuptools import Command as editable_wheel

PTH = "flightrec-autostart.pth"


class BuildWithPth(build_py):
    """``pip install .``: the hook goes into the wheel beside the packages."""

    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, "flightrec", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class _WithPth:
    """An editable-install strategy of setuptools that also writes the start-up hook."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, wheel: Any, files: list[str], mapping: Mapping[str, str]) -> None:
        self.inner(wheel, files, mapping)
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "flightrec", PTH), "rb") as f:
            wheel.writestr(PTH, f.read())

    def __enter__(self) -> _WithPth:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> object:
        return self.inner.__exit__(*exc)


class EditableWithPth(editable_wheel):
    """``pip install -e .``: setuptools' editable wheel holds only a path entry or a finder
    for this tree, never the build's other outputs, so the hook is added to it here, at the
    top of site-packages as in a normal install. (Where a setuptools lacks the method this
    wraps, the editable install goes on without the hook, and the recorder says so in the
    job's log: ``flightrec._autostart``.)"""

    def _select_strategy(self, name: str, tag: str, build_lib: Any) -> Any:
        return _WithPth(super()._select_strategy(name, tag, build_lib))


COMMANDS: dict[str, Any] = {"build_py": BuildWithPth}
if hasattr(editable_wheel, "_select_strategy"):  # setuptools 64 and later
    COMMANDS["editable_wheel"] = EditableWithPth

FAST = Extension(
    "flightrec.recorder.hotpath._fast",
    sources=["flightrec/recorder/hotpath/_fast.c"],
    optional=True,  # a failed build leaves the pure-Python hot path, never a failed install
)

WIRE = Extension(
    "flightrec.format._wire",
    sources=["flightrec/format/_wire.c"],
    optional=True,  # a failed build leaves the Python loops of the dump reader (same results)
)

PROGRESS = Extension(
    "flightrec.format._progress",
    sources=["flightrec/format/_progress.c"],
    optional=True,  # a failed build leaves protobuf's parser and the Python checks (same results)
)

ARRIVALS = Extension(
    "flightrec.analysis.timing._arrivals",
    sources=["flightrec/analysis/timing/_arrivals.c"],
    optional=True,  # a failed build leaves the straggler pass's Python loops (same results)
)

PICKLED = Extension(
    "flightrec.readers.native._pickled",
    sources=["flightrec/readers/native/_pickled.c"],
    optional=True,  # a failed build leaves the native reader's Python path (same results)
)

setup(cmdclass=COMMANDS, ext_modules=[FAST, WIRE, PROGRESS, ARRIVALS, PICKLED])
