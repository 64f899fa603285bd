"""`flightrec convert SRC_DIR OUT_DIR`: write flightrec dumps from PyTorch's native ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flightrec.readers.native import convert_dir


def register(app: typer.Typer) -> None:
    app.command("convert")(convert_command)


def convert_command(
    src: Annotated[
        Path, typer.Argument(help="Folder with PyTorch Flight Recorder dumps (pickle or JSON).")
    ],
    out: Annotated[Path, typer.Argument(help="Folder to write flightrec dumps into.")],
) -> None:
    """Convert PyTorch native Flight Recorder dumps to flightrec dumps, never executing them.

    Exit status: 0 every file converted; 1 some files refused (one line each on stderr);
    2 nothing convertible.
    """
    result = convert_dir(src, out)
    for err in result.errors:
        typer.echo(f"flightrec: skipped {err}", err=True)
    for note in result.notes:
        typer.echo(f"flightrec: note: {note}", err=True)
    typer.echo(f"wrote {len(result.written)} dump(s) to {out}")
    raise typer.Exit(1 if result.errors else 0)
