"""Help conventions: ``-h`` is ``--help``, and a paragraph of help is never broken mid-sentence
by the line breaks of the docstring it came from."""

from __future__ import annotations

import inspect

import pytest
from flightrec_cli.app import COMMANDS, app
from typer.main import get_command
from typer.testing import CliRunner

WIDE = {"COLUMNS": "400", "NO_COLOR": "1"}


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_h_is_help(command: str) -> None:
    args = [command] if command else []
    short = CliRunner().invoke(app, [*args, "-h"], env=WIDE)
    assert short.exit_code == 0, short.output
    assert short.output == CliRunner().invoke(app, [*args, "--help"], env=WIDE).output


@pytest.mark.parametrize("command", COMMANDS)
def test_each_help_paragraph_is_one_line_on_a_wide_terminal(command: str) -> None:
    out = CliRunner().invoke(app, [command, "--help"], env=WIDE).output
    lines = [" ".join(line.split()) for line in out.splitlines()]
    doc = inspect.cleandoc(get_command(app).commands[command].callback.__doc__ or "")  # type: ignore[attr-defined]
    for paragraph in doc.split("\n\n"):
        joined = " ".join(paragraph.split())
        assert joined in lines, (joined, out)
