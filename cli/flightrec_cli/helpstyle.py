"""Conventional help text whatever Typer's version: ``Usage: flightrec analyze [OPTIONS] PATH``.

Newer Typer releases print a type beside every flag (``--json <bool>``), wrap required
arguments in braces on the usage line (``{path}``) and name integer options ``<int range>``.
Users read those as values to type. These command classes keep the help conventional: flags
show no type, arguments are named in capitals, and options with a value show their metavar.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperCommand, TyperGroup


def reflow(text: str | None) -> str | None:
    """Join the lines of each paragraph of a docstring: Typer prints a docstring's line
    breaks as they are, so a paragraph wrapped at the source's width broke mid-sentence in
    the help (its own wrapping then broke it again at the terminal's)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _literal(command: Any) -> None:
    """Help texts read literally: under Typer's rich markup a bracketed word is a style tag
    and vanishes (``pip install 'torch-flightrec[s3]'`` printed without its ``[s3]``)."""
    if getattr(command, "rich_markup_mode", None) != "rich":
        return
    from rich.markup import escape

    command.help = escape(command.help) if command.help else command.help
    for p in command.params:
        if getattr(p, "help", None):
            p.help = escape(p.help)


def _is_choice(p: Any) -> bool:
    # Typer with click: ``p.type.choices``; Typer with its own parser: ``p.type_descriptor``.
    descriptor = getattr(p, "type_descriptor", None)
    return bool(
        getattr(getattr(p, "type", None), "choices", None)
        or getattr(descriptor, "is_choice", False)
    )


def _plain(params: list[Any]) -> list[Any]:
    for p in params:
        if getattr(p, "param_type_name", "") != "option" or p.metavar is not None:
            continue
        if getattr(p, "is_flag", False):
            p.metavar = ""  # a flag takes no value: show none
        elif not _is_choice(p):  # choices list themselves
            p.metavar = (p.name or "value").upper()
    return params


def _usage(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for p in command.get_params(ctx):
        if getattr(p, "param_type_name", "") != "argument":
            continue
        name = p.metavar or (p.name or "").upper()
        if p.nargs != 1:
            name += "..."
        pieces.append(name if p.required else f"[{name}]")
    return pieces


class PlainCommand(TyperCommand):
    """A subcommand with conventional help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)
        _literal(self)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self, ctx)


class PlainGroup(TyperGroup):
    """The top-level command with conventional help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)
        _literal(self)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))
