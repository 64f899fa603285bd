"""`flightrec analyze DIR`: merge every rank's dump and name the culprit, verdict first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from flightrec.analysis import AnalysisOptions, View, analyze_dir, gc_paused
from flightrec.errors import UsageError
from flightrec.format.schema import TAIL_ENTRIES
from flightrec.report.html import HtmlRenderer
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer
from flightrec.report.trace import TraceRenderer
from flightrec_cli.console import report_console
from flightrec_cli.exiting import skip_teardown
from flightrec_cli.progress import StageProgress

# Exit statuses (2, a usage error or no readable dump, is ``app.EXIT_USAGE``).
EXIT_NOTHING_FOUND = 0
EXIT_FINDINGS = 1
TRACE_RECENT = 200
"""Operations per rank a timeline shows by default: the last steps before the hang."""
TRACE_EVENTS = 200_000
"""Operations a default timeline holds at most: a file of tens of MB that Perfetto opens quickly."""


def trace_window(world_size: int) -> int:
    """Newest operations per rank for a default timeline of a job of ``world_size`` ranks."""
    return max(1, min(TRACE_RECENT, TRACE_EVENTS // max(1, world_size)))


def _write(path: Path, text: str) -> None:
    """Write an output file; one line (exit 2) when it cannot be written, not a traceback.
    (Rendered first, written whole: a rendering that fails leaves no half file.)"""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)


def analyze_command(
    path: Annotated[
        str,
        typer.Argument(
            help="Folder of dumps (searched recursively) or a file; or a URL of either "
            "(s3://bucket/prefix, any fsspec protocol: pip install 'torch-flightrec[s3]')."
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (schema flightrec.report/1).")
    ] = False,
    view: Annotated[
        View,
        typer.Option(
            "--view",
            help="Which dump to use for a rank that dumped more than once: hang (each rank's "
            "dump at the first hang event), latest, earliest.",
        ),
    ] = View.HANG,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            metavar="OUT.json",
            help="Also write a timeline (Chrome trace / Perfetto JSON) of every rank's operations.",
        ),
    ] = None,
    trace_recent: Annotated[
        int | None,
        typer.Option(
            "--trace-recent",
            metavar="N",
            min=1,
            help="Newest N operations per rank in the --trace timeline "
            f"(default: {TRACE_RECENT}, fewer past {TRACE_EVENTS:,} operations in all).",
        ),
    ] = None,
    trace_all: Annotated[
        bool,
        typer.Option("--trace-all", help="Every recorded operation in the --trace timeline."),
    ] = False,
    compact: Annotated[
        bool,
        typer.Option(
            "--compact",
            help="With --json, for the largest jobs: long rank lists as ranges ('0-131071 "
            "except 517'), no per-rank dump paths; the blamed ranks' evidence (and --rank's).",
        ),
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="OUT.html",
            help="Also write a one-file HTML report: verdict, findings, stacks and the "
            "collective grid of each process group (no network needed to open it).",
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            metavar="ID",
            help="In a folder of several jobs, the one to analyse (default: the newest; the "
            "report names the others).",
        ),
    ] = None,
    ranks: Annotated[
        list[int] | None,
        typer.Option(
            "--rank",
            metavar="RANK",
            help="With --json --compact: also give this rank's dump, process and state (repeatable).",
        ),
    ] = None,
) -> None:
    """Diagnose a hung or slow job from its dumps: which rank, which collective, which line.

    Exit status: 0 nothing found, 1 findings reported, 2 usage error or no readable dump.
    Files that cannot be read get one line each on stderr; the rest are still analysed.
    """
    if trace is not None and not trace.parent.is_dir():  # before minutes of analysis, not after
        raise UsageError(f"--trace {trace}: no such folder {trace.parent}")
    # A timeline of more than the newest entries of each ring needs every file read whole.
    whole = trace is not None and (trace_all or (trace_recent or 0) > TAIL_ENTRIES)
    # The collector stays paused while the report is written too: with a large job loaded,
    # each of its full collections walks millions of objects that hold no cycles (2.2 s of
    # the JSON report's 2.4 s at 16,384 ranks).
    with gc_paused():
        # Drawn on a terminal once the work outlasts a second; never with --json.
        with StageProgress(enabled=not (as_json or compact)) as shown:
            shown.stage("Reading dumps")
            report = analyze_dir(
                str(path),
                AnalysisOptions(
                    view=view,
                    progress=shown.files if shown.enabled else None,
                    tail=False if whole else None,
                    job=job,
                ),
            )
            if trace is not None:
                shown.stage("Writing the timeline")
                recent = None if trace_all else trace_recent or trace_window(report.world_size)
                _write(trace, rendered(TraceRenderer, report, recent=recent))
            if html is not None:
                shown.stage("Writing the HTML report")
                _write(html, rendered(HtmlRenderer, report))
        for problem in report.run.problems:
            typer.echo(f"flightrec: skipped {problem}", err=True)
        if as_json or compact:
            JsonRenderer(sys.stdout, compact=compact, ranks=tuple(ranks or ())).render(report)
        else:
            TerminalRenderer(report_console()).render(report)
    skip_teardown()  # everything is written: the process may end without freeing the job
    raise typer.Exit(EXIT_FINDINGS if report.findings else EXIT_NOTHING_FOUND)
