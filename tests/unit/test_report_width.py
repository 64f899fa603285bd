"""The report and ``flightrec show`` read well at 80 columns and at 200, on every sample:
no line wider than the terminal, no tensor signature or file:line broken across lines."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from flightrec.analysis import RankDump, analyze_dir
from flightrec.readers import read_any
from flightrec.report.dump import DumpRenderer
from flightrec.report.terminal import TerminalRenderer

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
FOLDERS = sorted(p.parent for p in SAMPLES.glob("**/expected.json"))
# A file:line cut after the colon, or a tensor signature cut inside its brackets.
BROKEN = re.compile(r"\.py:$|\.py:\D|[a-z0-9]\[[\dx]*$|^[\dx]*\]")


def _console(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, highlight=False), out


def _check(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width, line
        assert not BROKEN.search(line.strip()), line


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_report_fits_the_terminal(folder: Path, width: int) -> None:
    console, out = _console(width)
    TerminalRenderer(console).render(analyze_dir(str(folder)))
    _check(out.getvalue(), width)


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_show_fits_the_terminal(folder: Path, width: int) -> None:
    # the first dump file, in a sample's own subfolders too (torchft's per-quorum folders)
    file = next(p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "expected.json")
    console, out = _console(width)
    result = read_any(file)
    for dump in result if isinstance(result, list) else [result]:
        DumpRenderer(console, limit=None).render(RankDump(str(file), dump))
    _check(out.getvalue(), width)


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_report_lines_end_without_spaces(folder: Path, width: int) -> None:
    # Rich pads table cells and wrapped lines to their column's width; pasted into an issue
    # or diffed in CI those spaces are noise.
    console, out = _console(width)
    TerminalRenderer(console).render(analyze_dir(str(folder)))
    lines = out.getvalue().splitlines()
    assert lines and all(line == line.rstrip() for line in lines), [
        line for line in lines if line != line.rstrip()
    ]
