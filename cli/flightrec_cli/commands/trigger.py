"""`flightrec trigger`: ask every rank of a running job to dump, through its rendezvous store."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flightrec.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("trigger")(trigger_command)


def trigger_command(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="Store host of the job (default: $MASTER_ADDR, else 127.0.0.1)."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Store port of the job (default: $MASTER_PORT).")
    ] = None,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job-id",
            help="The job's FLIGHTREC_JOB_ID, if it set one (default: $FLIGHTREC_JOB_ID).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the store.")
    ] = 5.0,
) -> None:
    """Make every rank of a running job write a dump now (needs torch on this machine).

    Every rank waits on the job's store for requests and dumps within a second or two; the
    files go to each rank's FLIGHTREC_DIR. Exit status: 0 request posted, 2 no store answered.
    """
    from flightrec.recorder.store import request_dump

    host = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if port is None:
        raw = os.environ.get("MASTER_PORT", "")
        if not raw.isdigit():
            raise UsageError("no store port: pass --port or set MASTER_PORT")
        port = int(raw)
    from flightrec.recorder.config import store_namespace

    namespace = job_id.strip() if job_id is not None else store_namespace(os.environ)
    n = request_dump(host, port, namespace, timeout)
    typer.echo(f"asked every rank of the job at {host}:{port} to dump (request {n})")
    raise typer.Exit(0)
