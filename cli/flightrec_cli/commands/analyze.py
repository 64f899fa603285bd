"""`flightrec analyze DIR`: merge every rank's dump and name the culprit, verdict first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from flightrec.analysis import AnalysisOptions, View, analyze_dir
from flightrec.report.json import JsonRenderer
from flightrec.report.terminal import TerminalRenderer
from flightrec.report.trace import TraceRenderer


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)


def analyze_command(
    path: Annotated[Path, typer.Argument(help="Folder of dumps (searched recursively) or a file.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (schema flightrec.report/1).")
    ] = False,
    view: Annotated[
        View,
        typer.Option("--view", help="Which dump to use for a rank that dumped more than once."),
    ] = View.LATEST,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            metavar="OUT.json",
            help="Also write a timeline (Chrome trace / Perfetto JSON) of every rank's operations.",
        ),
    ] = None,
) -> None:
    """Diagnose a hung or slow job from its dumps: which rank, which collective, which line.

    Exit status: 0 nothing found, 1 findings reported, 2 usage error or no readable dump.
    Files that cannot be read get one line each on stderr; the rest are still analysed.
    """
    report = analyze_dir(str(path), AnalysisOptions(view=view))
    for problem in report.run.problems:
        typer.echo(f"flightrec: skipped {problem}", err=True)
    if trace is not None:
        trace.write_text(TraceRenderer().render(report), encoding="utf-8")
    if as_json:
        sys.stdout.write(JsonRenderer().render(report))
    else:
        TerminalRenderer(Console(highlight=False)).render(report)
    raise typer.Exit(1 if report.findings else 0)
