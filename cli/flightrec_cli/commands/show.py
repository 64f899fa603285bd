"""`flightrec show FILE`: print one dump readably."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from flightrec.analysis import RankDump, read_any
from flightrec.report.dump import DumpRenderer


def register(app: typer.Typer) -> None:
    app.command("show")(show_command)


def show_command(
    file: Annotated[Path, typer.Argument(help="A dump file (flightrec or PyTorch native).")],
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="Newest entries to show; 0 shows all.")
    ] = 100,
) -> None:
    """Print one dump: header, process groups, entries and every thread's stack.

    Exit status: 0 shown, 2 the file cannot be read (one line on stderr).
    """
    result = read_any(file)
    renderer = DumpRenderer(Console(highlight=False), limit or None)
    for dump in result if isinstance(result, list) else [result]:
        renderer.render(RankDump(str(file), dump))
    raise typer.Exit(0)
