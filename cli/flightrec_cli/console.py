"""The console every command prints its report on."""

from __future__ import annotations

import os

from rich.console import Console

# Reports piped into a file or a CI log would otherwise be cut to rich's default of 80
# columns, which folds every file path and stack line. A terminal keeps its own width, and
# COLUMNS still wins when it is set.
PIPED_WIDTH = 160


def report_console() -> Console:
    """A console on stdout: the terminal's width, or ``PIPED_WIDTH`` when not a terminal."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=PIPED_WIDTH)
    return console
