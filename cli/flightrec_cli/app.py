"""The Typer application and the single place where errors become exit statuses.

Exit statuses (docs/design.md): 0 nothing found, 1 findings reported, 2 usage error or no readable
dump. Commands raise ``flightrec.errors.FlightrecError``; ``main`` turns it into one line on
stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.core import TyperCommand

from flightrec import __version__
from flightrec.errors import FlightrecError
from flightrec_cli.exiting import leave_now_if_asked
from flightrec_cli.helpstyle import PlainCommand, PlainGroup

EXIT_USAGE = 2
"""A flightrec error (bad input, no readable dump): every command's status 2. The other
statuses are each command's own (``analyze``: 0 nothing found, 1 findings reported)."""


# Subcommand modules under flightrec_cli.commands; each exposes `register(app)`.
COMMANDS: tuple[str, ...] = (
    "simulate",
    "convert",
    "analyze",
    "show",
    "trigger",
    "attach",
    "doctor",
)

app = typer.Typer(
    name="flightrec",
    help="Flight recorder for distributed PyTorch: which rank, which collective, which line.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainGroup,
)
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
"""``-h`` as ``--help``, on every command (a subcommand's context inherits it)."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"flightrec {__version__}")
        raise typer.Exit()


@app.callback(context_settings=HELP_OPTIONS)
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Record collectives on every rank; analyze the dumps when a job hangs or slows down."""


for _name in COMMANDS:
    importlib.import_module(f"flightrec_cli.commands.{_name}").register(app)
for _info in app.registered_commands:
    # Typer fills in its own class where a command names none; ours only changes the help.
    if _info.cls is None or _info.cls is TyperCommand:
        _info.cls = PlainCommand


def main() -> None:
    """Console entry point: run the app, mapping flightrec errors to one line and exit 2.

    Typer's standalone mode already turns usage errors into exit 2 and ``typer.Exit(code)``
    into that code; commands end with ``raise typer.Exit(status)``.
    """
    try:
        try:
            app()
        except FlightrecError as exc:
            typer.echo(f"flightrec: error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
    except SystemExit as done:
        leave_now_if_asked(done.code)  # (``analyze``: skips freeing what it loaded)
        raise
