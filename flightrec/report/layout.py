"""Layout pieces shared by the terminal renderers, so text reads well from 80 to 200 columns.

Rich wraps a long ``Text`` back to column 0, which breaks a report's indentation, and folds a
table cell mid-token (``float32[`` / ``577]``). These pieces let rich do the fitting with the
right settings instead: a hanging indent for prose, one line cut with an ellipsis for source
code, and tables with narrow padding whose columns never break inside a token.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich import box
from rich.table import Table
from rich.text import Text


def hanging(prefix: str, body: str, style: str = "") -> Table:
    """``prefix`` then ``body``, wrapped at words under the body, never back to column 0."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(prefix, style=style), Text(body, style=style))
    return grid


def code_line(indent: int, code: str, style: str = "") -> Table:
    """A source line on one line: cut with an ellipsis where the terminal is narrower."""
    grid = Table.grid()
    grid.add_column(no_wrap=True, overflow="ellipsis")
    grid.add_row(Text(" " * indent + code, style=style))
    return grid


def compact_table(title: str | None = None) -> Table:
    """A table with one space between columns (its box's blank rule) and a rule under the header."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0),
    )


def longest_token(cells: Iterable[str]) -> int:
    """The longest run without a space among ``cells``: a column's width below which rich
    would fold a token (a tensor signature, a file:line) in two."""
    return max((len(tok) for cell in cells for tok in cell.split()), default=0)
