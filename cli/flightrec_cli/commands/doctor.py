"""`flightrec doctor`: whether tracing would work here, which recording path runs, and why."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)


def doctor_command(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object on stdout instead of the text.")
    ] = False,
    live: Annotated[
        bool,
        typer.Option(
            "--live/--no-live",
            help="Prove it: trace a 1-rank gloo all_reduce in a fresh Python (a few seconds).",
        ),
    ] = True,
) -> None:
    """Check this Python, its torch and the FLIGHTREC_* settings: flightrec's version, the
        recording path (C or pure Python), the tensor-memory reader and frame walk (and why one is
        off), the start-up hook, where dumps would go, and (unless --no-live) whether a real 1-rank
    gloo job started here is traced. Run it first when something looks wrong,
        and paste its output into bug reports.

        Exit status: 0 tracing would work, 1 it would not (the lines marked "!" say why).
    """
    from flightrec.recorder.diagnose import diagnose

    found = diagnose(live=live)
    if as_json:
        typer.echo(json.dumps(found.as_dict(), indent=2))
    else:
        width = max(len(item.topic) for item in found.items)
        for item in found.items:
            mark = "!" if item.blocks else " "
            why = f"  ({item.why})" if item.why else ""
            typer.echo(f"{mark} {item.topic:<{width}}  {item.value}{why}")
        verdict = "tracing would work" if found.tracing_works else "tracing would NOT work"
        typer.echo(f"\n{verdict}")
    raise typer.Exit(0 if found.tracing_works else 1)
