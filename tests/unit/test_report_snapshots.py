"""What a person reads, kept word for word: for every shipped sample, the terminal report at 80
and at 120 columns, the verdict the live reporter prints into the job's log, and the visible
text of the HTML report are compared with the files under ``tests/snapshots/<sample>/``.

A change of wording, layout or verdict shows up as a diff of those files, to be reviewed with
the change. After an intended change, rewrite them and review the diff::

    FLIGHTREC_UPDATE_SNAPSHOTS=1 python -m pytest tests/unit/test_report_snapshots.py -p no:cacheprovider
    git diff tests/snapshots

The renderings must not depend on where the repository lies or when the test runs: the samples
are analysed from a copy under a temporary folder by relative path, every file of the copy
carries one fixed modification time (a checkout gives files the time of the checkout, and the
native reader measures how long after its newest entry a file was written), and the black
boxes of ``crashed_rank`` are read as on the host that wrote them, after the process ended.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from flightrec.analysis import Report, analyze_dir
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.summary import encode, summarize
from flightrec.live import verdict
from flightrec.readers import blackbox, read_any
from flightrec.report.html import HtmlRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
SNAPSHOTS = REPO / "tests" / "snapshots"
FOLDERS = sorted(p.parent.relative_to(SAMPLES).as_posix() for p in SAMPLES.glob("**/expected.json"))
UPDATE = os.environ.get("FLIGHTREC_UPDATE_SNAPSHOTS") == "1"
FILE_TIME_NS = 2_000_000_000 * 10**9
"""The modification time of every file of the copy (2033-05-18): long after every sample's
newest entry, as the time of a checkout is."""
RECORDING_HOST = "vm"
"""The host name the samples' processes ran on."""
WIDTHS = (80, 120)
ROUND = 1
GATHERED_S = 0.5


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples copied under a temporary folder, each file with the same time."""
    root = tmp_path_factory.mktemp("snapshots")
    shutil.copytree(SAMPLES, root / "samples")
    for path in (root / "samples").rglob("*"):
        os.utime(path, ns=(FILE_TIME_NS, FILE_TIME_NS))
    return root


@pytest.fixture(autouse=True)
def _fixed_place(copy: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(copy)
    # A black box's process is judged alive by asking this host, and a box from another host
    # by the age of its heartbeat against now: read them as on their own host, long after.
    monkeypatch.setattr(socket, "gethostname", lambda: RECORDING_HOST)
    monkeypatch.setattr(blackbox, "_alive", lambda host, pid: False)
    yield


def terminal_text(report: Report, width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    TerminalRenderer(console).render(report)
    return out.getvalue()


def inlog_text(report: Report) -> str:
    """What the live reporter prints into the job's log, from summaries of the dumps the
    analysis chose (a summary is what each rank publishes through the store)."""
    raw: dict[int, bytes] = {}
    for rank, chosen in sorted(report.run.dumps.items()):
        read = read_any(chosen.path)
        dumps = read if isinstance(read, list) else [read]
        dump: pb.Dump = next(d for d in dumps if d.header.rank == rank)
        raw[rank] = encode(summarize(dump, ROUND, chosen.path))
    return verdict.render(raw, ROUND, "WATCHDOG_TIMEOUT", report.world_size, GATHERED_S)


class _Visible(HTMLParser):
    """The text a browser shows: no scripts, no styles, one line per block of text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "title"):
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "title"):
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.lines.extend(" ".join(line.split()) for line in data.splitlines())


def html_text(report: Report) -> str:
    parser = _Visible()
    parser.feed(rendered(HtmlRenderer, report))
    parser.close()
    return "".join(f"{line}\n" for line in parser.lines if line)


def renderings(folder: str) -> dict[str, str]:
    report = analyze_dir(f"samples/{folder}")
    shown = {f"terminal-{w}.txt": terminal_text(report, w) for w in WIDTHS}
    shown["inlog.txt"] = inlog_text(report)
    shown["html.txt"] = html_text(report)
    return shown


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_rendered_text_matches_its_snapshot(folder: str) -> None:
    here = SNAPSHOTS / folder
    for name, text in renderings(folder).items():
        path = here / name
        if UPDATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            continue
        assert path.exists(), f"no snapshot {path.relative_to(REPO)}: see this module's docstring"
        assert text == path.read_text(encoding="utf-8"), (
            f"{path.relative_to(REPO)} differs from what is rendered now; if the change is "
            "meant, rewrite the snapshots (this module's docstring) and review the diff"
        )


def test_the_renderings_do_not_depend_on_the_checkout(copy: Path) -> None:
    # The files are named as the command line named them (relative), never by where they lie.
    for folder in ("crashed_rank", "native/torchft_hang"):
        for name, text in renderings(folder).items():
            assert str(copy) not in text, (folder, name)


def test_every_snapshot_belongs_to_a_sample() -> None:
    kept = {p.parent.relative_to(SNAPSHOTS).as_posix() for p in SNAPSHOTS.glob("**/*.txt")}
    assert kept <= set(FOLDERS), sorted(kept - set(FOLDERS))
