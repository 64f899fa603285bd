"""`flightrec attach`: snapshot every rank of a running job on this node, from outside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flightrec.attach.session import INTERVAL_S, SAMPLES, RankOutcome, attach

EXIT_ALL = 0
EXIT_SOME = 1
EXIT_NONE = 2


def register(app: typer.Typer) -> None:
    app.command("attach")(attach_command)


def attach_command(
    pids: Annotated[
        list[int],
        typer.Argument(
            metavar="PID...",
            help="torchrun's agent, an srun step's process, an mp.spawn parent, or ranks' "
            "processes.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Folder to write the snapshots into (one per rank)."),
    ],
    samples: Annotated[
        int, typer.Option("--samples", help="Stack samples per process (2 or more).")
    ] = SAMPLES,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between samples.")
    ] = INTERVAL_S,
) -> None:
    """Snapshot a running job's ranks on this node, traced or not: stacks and torch's ring.

    Finds the rank processes at or below each PID: those with RANK or LOCAL_RANK in their
    environment, or the processes mp.spawn started.

    Reads every thread's Python stack a few times with py-spy (a pause of milliseconds
    each; needs the right to ptrace them), and torch's Flight Recorder ring where the job
    serves it (TORCH_WORKER_SERVER_SOCKET). Writes one dump per rank into --out.

    Then: flightrec analyze DIR. One node per call: on SLURM, run it on every node into one
    shared folder with srun --overlap --ntasks-per-node=1.

    Exit status: 0 every rank found was snapshotted, 1 some could not be (each says why),
    2 none was.
    """
    report = attach(pids, out, samples=samples, interval_s=interval)
    for line in report.problems:
        typer.echo(f"flightrec attach: {line}", err=True)
    if not report.ranks:
        typer.echo("flightrec attach: no rank process found: nothing written", err=True)
        raise typer.Exit(EXIT_NONE)
    written = report.written
    jobs = sorted({r.job_id for r in report.ranks if r.job_id})
    job = f" of job {', '.join(jobs)}" if jobs else ""
    typer.echo(
        f"{len(written)} of {len(report.ranks)} ranks{job} on {report.host} snapshotted in "
        f"{report.seconds:.1f} s ({report.samples} samples {interval:g} s apart) into {out}"
    )
    for r in report.ranks:
        typer.echo(f"  rank {r.rank} pid {r.pid}: {_took(r)}")
    if written:
        typer.echo(f"next: flightrec analyze {out}")
    if not written:
        raise typer.Exit(EXIT_NONE)
    raise typer.Exit(EXIT_ALL if len(written) == len(report.ranks) else EXIT_SOME)


def _took(r: RankOutcome) -> str:
    """What one rank's snapshot holds, or why there is none."""
    if r.path is None:
        return r.problem
    parts = [f"{r.threads} thread{'s' if r.threads != 1 else ''}"]
    if r.children:
        parts.append(f"{r.children} child process{'es' if r.children != 1 else ''}")
    if r.ring_entries is not None:
        parts.append(f"torch's ring: {r.ring_entries} entries")
    elif r.ring_note:
        parts.append(r.ring_note)
    if r.note:
        parts.append(r.note)
    return ", ".join(parts)
