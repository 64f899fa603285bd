"""`flightrec trigger`: ask every rank of a running job to dump, and say how many did."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from flightrec.errors import UsageError
from flightrec.text import ranks_phrase

EXIT_ALL = 0
EXIT_SOME = 1
EXIT_NONE = 2


def register(app: typer.Typer) -> None:
    app.command("trigger")(trigger_command)


def trigger_command(
    folder: Annotated[
        Path | None,
        typer.Argument(
            metavar="DIR",
            help="The job's FLIGHTREC_DIR: its ranks left their store's address there "
            "(default: $FLIGHTREC_DIR, when neither --port nor $MASTER_PORT is given).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="The job's MASTER_ADDR or torchrun's rendezvous host (default: "
            "$MASTER_ADDR, else 127.0.0.1).",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            help="The job's MASTER_PORT, or the port of torchrun's --rdzv-endpoint "
            "(default: $MASTER_PORT).",
        ),
    ] = None,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job-id",
            help="The job's FLIGHTREC_JOB_ID, if it set one (default: $FLIGHTREC_JOB_ID).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to try to reach the job's store.")
    ] = 5.0,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the ranks to say they dumped.")
    ] = 10.0,
) -> None:
    """Make every rank of a running job write a dump now.

    Every rank waits on the job's store for requests and dumps within a second or two, into
    its own FLIGHTREC_DIR; the command waits for each rank to say so. Point it at the job's
    MASTER_ADDR:MASTER_PORT, at torchrun's --rdzv-endpoint, or at the job's FLIGHTREC_DIR
    (any launcher, --standalone included; the start-up line in the job's log names both).

    Exit status: 0 every rank dumped, 1 some did not (they are named), 2 none answered, or no
    job was found.
    """
    from flightrec.recorder.config import store_namespace
    from flightrec.recorder.exchange.trigger import endpoint_from_folder, trigger

    # torch is not imported here, but where a store does not answer as ours expects, its
    # client is tried: whose failed tries would each log a C++ stack trace; errors here are
    # one line, ours (read when torch is imported, which has not happened in this process).
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    namespace = job_id.strip() if job_id is not None else store_namespace(os.environ)
    source = ""
    if port is None and folder is None and os.environ.get("MASTER_PORT"):
        raw = os.environ["MASTER_PORT"]
        if not raw.isdigit():
            raise UsageError(f"MASTER_PORT={raw!r} is no port: pass --port")
        port = int(raw)
    if port is None:
        where = folder or _default_folder()
        ep = endpoint_from_folder(where)
        host, port = ep.host, ep.port
        if job_id is None and ep.namespace:
            namespace = ep.namespace
        written = time.strftime("%H:%M:%S", time.localtime(ep.written)) if ep.written else "?"
        source = f"{where}/.flightrec-endpoint (written at {written} by pid {ep.pid})"
    host = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        result = trigger(host, port, namespace, timeout, wait)
    except UsageError as exc:
        if source:  # an old job's file: say where the address came from
            raise UsageError(f"{exc} (from {source}: has that job ended?)") from None
        raise
    at = f"{result.address}{' ' + result.via if result.via else ''}"
    asked = f"request {result.request} at {at}"
    if not result.dumped and not result.failed:
        typer.echo(
            f"flightrec: 0 of {result.world_size} ranks answered within {wait:g} s ({asked}): "
            "are they running with FLIGHTREC=1, and do their Python threads run?",
            err=True,
        )
        raise typer.Exit(EXIT_NONE)
    line = f"{len(result.dumped)} of {result.world_size} ranks dumped ({asked})"
    notes = []
    if result.failed:
        notes.append(f"{ranks_phrase(list(result.failed))} could not write a dump (see its log)")
    if result.silent:
        notes.append(f"no answer within {wait:g} s from {ranks_phrase(list(result.silent))}")
    typer.echo("; ".join([line, *notes]))
    raise typer.Exit(EXIT_ALL if len(result.dumped) == result.world_size else EXIT_SOME)


def _default_folder() -> Path:
    """The FLIGHTREC_DIR of this shell (or the recorder's default), for a job started here."""
    from flightrec.recorder.config import DEFAULT_DIR

    raw = os.environ.get("FLIGHTREC_DIR", "").strip() or DEFAULT_DIR
    if "://" in raw:
        raise UsageError(
            f"FLIGHTREC_DIR={raw} is no local folder: pass the job's address with --host and "
            "--port, or the local folder the ranks write into"
        )
    folder = Path(raw)
    if not folder.is_dir():
        raise UsageError(
            "no job to trigger: pass the job's address with --host and --port (its MASTER_ADDR "
            "and MASTER_PORT, or torchrun's --rdzv-endpoint), or its FLIGHTREC_DIR"
        )
    return folder
