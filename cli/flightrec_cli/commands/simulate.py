"""`flightrec simulate`: write the dumps of a simulated job with one injected fault."""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from flightrec.errors import UsageError
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate
from flightrec_cli.progress import StageProgress


class DumpFormat(enum.Enum):
    """File format of the simulated dumps."""

    FLIGHTREC = "flightrec"
    """flightrec's protobuf dumps."""
    NATIVE = "native"
    """PyTorch's native Flight Recorder pickles, named like torch's (``nccl_trace_rank_N``)."""


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)


def simulate_command(
    out: Annotated[
        Path, typer.Option("--out", help="Folder to write the dumps (and expected.json) into.")
    ],
    ranks: Annotated[int, typer.Option("--ranks", min=1, help="World size.")] = 64,
    entries: Annotated[int, typer.Option("--entries", min=1, help="Ring entries per rank.")] = 2000,
    layout: Annotated[
        str, typer.Option("--layout", help="Parallel layout, e.g. tp=8,pp=4; dp is the rest.")
    ] = "tp=8,pp=4",
    fault: Annotated[
        Fault,
        typer.Option(
            "--fault",
            metavar="FAULT",
            help="Fault to inject: " + ", ".join(f.value for f in Fault) + ".",
        ),
    ] = Fault.STALL,
    fault_rank: Annotated[
        int, typer.Option("--fault-rank", min=0, help="Rank the fault hits.")
    ] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed for jitter, clocks and delays.")] = 0,
    processes: Annotated[int, typer.Option("--processes", min=1, help="Writer processes.")] = min(
        4, os.cpu_count() or 1
    ),
    form: Annotated[
        DumpFormat,
        typer.Option(
            "--format",
            metavar="FORMAT",
            help="flightrec (dumps), or native: PyTorch's pickle form (nccl_trace_rank_N) of "
            "the same job, for comparing with fr_trace.",
        ),
    ] = DumpFormat.FLIGHTREC,
    played: Annotated[
        bool,
        typer.Option(
            "--played",
            help="Play the timing out (ranks compute, then wait for the last to arrive), as "
            "slow_worker, slow_stage and spread_imbalance always do; for a healthy job to "
            "compare with them.",
        ),
    ] = False,
    no_completion: Annotated[
        bool,
        typer.Option(
            "--no-completion-times",
            help="Record no completion times (PyTorch's recorder without timing).",
        ),
    ] = False,
) -> None:
    """Write realistic flightrec dumps of a tp/pp/dp job with one fault; print the expected verdict."""
    try:
        config = SimConfig(
            parse_layout(layout, ranks),
            entries,
            fault,
            fault_rank,
            seed=seed,
            played=played,
            completion=not no_completion,
        )
        # On a terminal, once it takes more than a second: a 4,096-rank job takes half a minute.
        with StageProgress() as shown:
            shown.stage(f"Planning a job of {ranks:,} ranks")
            expected = simulate(
                config,
                out,
                processes=processes,
                form=form.value,
                progress=shown.ranks if shown.enabled else None,
            )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    verdict = {
        "scenario": f"simulate-{fault.value}",
        "description": f"{ranks} ranks, {layout}, {entries} entries, {fault.value} on rank "
        f"{fault_rank}, {form.value} format",
        "world_size": ranks,
        "exit_status": 1 if expected else 0,
        "first_finding": expected or None,
    }
    (out / "expected.json").write_text(json.dumps(verdict, indent=2) + "\n")
    typer.echo(json.dumps(verdict["first_finding"]))
