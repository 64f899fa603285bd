"""The progress display: on a terminal after the delay, never off a terminal or when turned off."""

from __future__ import annotations

import io
import time

from flightrec_cli.progress import StageProgress
from rich.console import Console


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_long_work_on_a_terminal_shows_the_stage_and_the_files() -> None:
    console, out = _terminal()
    with StageProgress(console=console, delay_s=0.0) as shown:
        shown.stage("Reading dumps")
        shown.files(3, 8)
        time.sleep(0.3)  # the display's own refresh draws it
        shown.files(8, 8)
        time.sleep(0.3)
    text = out.getvalue()
    assert "Reading dumps" in text and "3/8 files" in text
    assert "Analysing 8 dumps" in text  # the stage after the last file


def test_work_shorter_than_the_delay_draws_nothing() -> None:
    console, out = _terminal()
    with StageProgress(console=console, delay_s=5.0) as shown:
        shown.stage("Reading dumps")
        shown.files(1, 2)
    assert out.getvalue() == ""


def test_nothing_is_drawn_off_a_terminal_or_when_turned_off() -> None:
    plain = io.StringIO()
    with StageProgress(console=Console(file=plain), delay_s=0.0) as shown:
        assert not shown.enabled
        shown.ranks(5, 10)
        time.sleep(0.2)
    console, out = _terminal()
    with StageProgress(enabled=False, console=console, delay_s=0.0) as shown:
        shown.files(1, 2)
        time.sleep(0.2)
    assert plain.getvalue() == "" and out.getvalue() == ""
