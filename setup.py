"""Ships ``flightrec-autostart.pth`` at the top of site-packages, and builds the optional C
hot path ``flightrec.recorder.hotpath._fast``, the dump reader's loops
``flightrec.format._wire``, the straggler pass's ``flightrec.analysis.timing._arrivals`` and the
native-dump reader's ``flightrec.readers.native._pickled``.

Everything else lives in pyproject.toml. The extension is optional: where it cannot be built
(no compiler, a big-endian host) the install goes on and the recorder runs its pure-Python hot
path, which records exactly the same entries, more slowly. Tests run from the source tree build it in
place themselves (tests/conftest.py). The .pth file is how ``FLIGHTREC=1`` traces a
training script that never imports flightrec (plain python, spawn children, torchrun workers):
Python executes its single line at interpreter start-up, and that line does nothing but read
one environment variable unless tracing is asked for.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "flightrec-autostart.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, "flightrec", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


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

setup(cmdclass={"build_py": BuildWithPth}, ext_modules=[FAST, WIRE, ARRIVALS, PICKLED])
