"""`flightrec show FILE`: print one dump readably."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flightrec.analysis import RankDump
from flightrec.errors import UsageError
from flightrec.readers import read_any
from flightrec.report.dump import DumpRenderer
from flightrec_cli.console import report_console


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
    if file.is_dir():
        raise UsageError(
            f"{file}: is a folder; show prints one dump file (`flightrec analyze {file}` reads a folder)"
        )
    result = read_any(file)
    renderer = DumpRenderer(report_console(), limit or None)
    for dump in result if isinstance(result, list) else [result]:
        renderer.render(RankDump(str(file), dump))
    raise typer.Exit(0)
