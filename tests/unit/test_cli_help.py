"""Help reads conventionally at any width: no type beside a flag, no braces on usage lines."""

from __future__ import annotations

import re

import pytest
from flightrec_cli.app import COMMANDS, app
from typer.testing import CliRunner


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_shows_no_placeholder_types(command: str, width: int) -> None:
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "<bool>" not in out
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert not re.search(r"[{}]", usage), usage
    assert "--help" in out


def test_arguments_are_named_in_capitals_on_the_usage_line() -> None:
    out = CliRunner().invoke(app, ["analyze", "--help"], env={"COLUMNS": "80"}).output
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert usage.rstrip().endswith("[OPTIONS] PATH")


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_bracketed_words_in_help_are_printed_as_written(command: str) -> None:
    """Rich markup would take ``[s3]`` for a style tag and drop it."""
    args = [command, "--help"] if command else ["--help"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert "\\[" not in out, out
    if command == "analyze":
        assert "pip install 'torch-flightrec[s3]'" in " ".join(out.split()), out
