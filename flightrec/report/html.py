"""The one-file HTML report: verdict, findings, where ranks are, and the collective grid.

Everything is inlined (styles, script, data): the file opens from a laptop's disk with no
network. The page's text is built here with every string from a dump escaped
(``html.escape``); the grids are drawn by the page's script as inline SVG from one JSON
object (``grid.build_grid``), embedded with ``<`` escaped so no dump string can close the
script element. The page skeleton is ``templates/report.html``, package data; plain string
building fills its slots, which keeps the analyzer free of a templating dependency.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from html import escape
from importlib import resources
from typing import TYPE_CHECKING, Any, TextIO

from flightrec.analysis.model import Consequence, FrameInfo, is_library_frame
from flightrec.report.grid import Cell, Grid, build_grid
from flightrec.report.json import compact_report_to_dict

# The terminal report's sentences ("rank 2 is in ...", "ranks 0-1,3 wait in ...", "ranks 0,3
# waited in ..., then died"): one wording.
from flightrec.report.terminal import blocked_lines, sentence
from flightrec.text import compress, ranks_phrase

if TYPE_CHECKING:
    from flightrec.analysis import Report

# How each cell state looks, one row per state: the legend, the page's colours and its
# tooltips all read this.
CELL_LOOK: dict[Cell, tuple[str, str]] = {
    Cell.COMPLETED: ("completed", "#66bb6a"),
    Cell.PENDING: ("pending (entered, not completed)", "#ffa726"),
    Cell.NOT_ENTERED: ("never entered", "#e3e7eb"),
    Cell.MISMATCHED: ("mismatched", "#8e24aa"),
    Cell.FAILED: ("failed", "#d32f2f"),
    Cell.UNKNOWN: ("issued, completion unknown", "#90a4ae"),
    Cell.NO_DUMP: ("no dump", "#37474f"),
}
_SLOT = re.compile(r"\{\{(\w+)\}\}")
MAX_SITUATIONS = 24
"""Situations ("where every rank is") the page lists; the rest are counted."""
MAX_FRAMES = 14
MAX_OTHER_FINDINGS = 50


def _blocked(c: Consequence) -> list[str]:
    took = f" for {c.waited_s:.1f} s" if c.waited_s >= 0.05 else ""
    what = f"{c.label or c.op} #{c.seq} on group {c.process_group}"
    return blocked_lines(c.waiting, c.ended, what, took)


class HtmlRenderer:
    """Renders a ``Report`` as one self-contained HTML page.

    Args:
        out: where to write.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def render(self, report: Report) -> None:
        """Write the page."""
        grid = build_grid(report)
        template = (
            resources.files("flightrec.report")
            .joinpath("templates/report.html")
            .read_text(encoding="utf-8")
        )
        slots = {
            "title": escape(_title(report)),
            "colours": "".join(f"--c{int(c)}: {look[1]}; " for c, look in CELL_LOOK.items()),
            "body": _body(report, grid),
            "data": _script_json(_grid_data(grid)),
        }
        # One pass over the template: text put into a slot is never searched for slots.
        self.out.write(_SLOT.sub(lambda m: slots[m.group(1)], template))


def _title(report: Report) -> str:
    if not report.findings:
        return "flightrec: no problem found"
    f = report.findings[0]
    return f"flightrec: {f.kind}" + (f" on ranks {compress(f.ranks)}" if f.ranks else "")


def _script_json(value: Any) -> str:
    """JSON for a ``<script>`` element: ``<`` escaped, so ``</script>`` cannot appear."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _grid_data(grid: Grid) -> dict[str, Any]:
    return {
        "cells": [CELL_LOOK[c][0] for c in Cell],
        "groups": [
            {
                "key": g.key,
                "label": g.label,
                "seqs": list(g.seqs),
                "focus": g.focus,
                "rows": [
                    {
                        "label": row.label,
                        "ranks": len(row.ranks),
                        "first": row.ranks[0],
                        "cells": list(row.cells),
                        "entries": list(row.entries),
                        "culprit": row.culprit,
                        "blamed": row.blamed,
                    }
                    for row in g.rows
                ],
            }
            for g in grid.groups
        ],
        "entries": grid.entries,
        "stacks": grid.stacks,
    }


def _body(report: Report, grid: Grid) -> str:
    parts = [
        "<header><h1>flightrec report</h1>",
        f'<div class="meta" id="job">{escape(_job_line(report))}</div></header>',
        _verdict(report),
        _grids(grid),
        _findings(report),
        _where(report),
        _notes(report),
        "<footer>Written by <code>flightrec analyze --html</code>. Hover a cell for its entry; "
        "click to keep it in the pane.</footer>",
    ]
    return "\n".join(p for p in parts if p)


def _job_line(report: Report) -> str:
    run = report.run
    line = f"{len(run.dumps):,} dump(s) of {report.world_size:,} ranks"
    if run.missing_ranks:
        line += f"; no dump from {ranks_phrase(run.missing_ranks)}"
    if run.problems:
        line += f"; {len(run.problems)} file(s) could not be used"
    return line


def _verdict(report: Report) -> str:
    if not report.findings:
        return (
            '<section id="verdict" class="ok"><div class="title">Verdict: no problem found</div>'
            f'<div class="summary">{len(report.ranks_with_dump):,} of {report.world_size:,} '
            "ranks dumped, every collective matched and nothing is blocked.</div></section>"
        )
    f = report.findings[0]
    title = f"Verdict: {f.kind}" + (f" ({f.field})" if f.field else "")
    return (
        f'<section id="verdict" class="bad" data-kind="{escape(str(f.kind))}" '
        f'data-ranks="{escape(compress(f.ranks))}"><div class="title">{escape(title)}</div>'
        f'<div class="summary">{escape(f.summary)}</div></section>'
    )


def _grids(grid: Grid) -> str:
    if not grid.groups:
        return ""
    legend = "".join(
        f'<span style="--sw: var(--c{int(c)})">{escape(name)}</span>'
        for c, (name, _) in CELL_LOOK.items()
    )
    out = [
        '<section id="grids"><h2>Collective grid</h2>',
        '<div class="meta">Per process group: ranks (rows) by sequence number (columns), '
        "newest on the right. Ranks that are alike share a row in large groups; the "
        "culprit's row is outlined; the dashed column is the finding's collective.</div>",
        f'<div class="legend">{legend}</div>',
        '<div id="entry" class="entry">Hover or click a cell.</div>',
    ]
    for i, g in enumerate(grid.groups):
        extra = ""
        if g.hidden_rows:
            extra = (
                f" ({g.hidden_rows} more rows of {g.hidden_ranks:,} ranks not drawn: the "
                "largest rows and the blamed ranks' are)"
            )
        out.append(
            f'<div class="group" data-group="{escape(g.key)}"><h3>{escape(g.label)} '
            f'<span class="meta">{g.size:,} ranks, seq {g.seqs[0]}-{g.seqs[-1]}'
            f"{escape(extra)}</span></h3>"
            f'<div class="gridwrap" data-index="{i}"></div></div>'
        )
    if grid.hidden_groups:
        agree = grid.hidden_groups - grid.hidden_uneven
        which = (
            f"{grid.hidden_uneven:,} whose members disagree on their progress, {agree:,} "
            "whose members all agree"
            if grid.hidden_uneven
            else "whose members all agree"
        )
        out.append(
            f'<div class="meta">... and {grid.hidden_groups:,} more groups ({which}; the '
            "terminal report's progress table and --json list them).</div>"
        )
    out.append("</section>")
    return "\n".join(out)


def _findings(report: Report) -> str:
    if not report.findings:
        return ""
    compact = compact_report_to_dict(report)["findings"]
    out = ['<section id="findings"><h2>Findings</h2><ol class="findings">']
    for i, (f, data) in enumerate(zip(report.findings, compact, strict=True)):
        if i >= MAX_OTHER_FINDINGS:
            out.append(f"<li>... and {len(report.findings) - i} more (see --json)</li>")
            break
        facts = []
        if f.ranks:
            facts.append(f"ranks {compress(f.ranks)}")
        if f.process_group is not None:
            facts.append(f"group {f.process_group}")
        if f.seq is not None:
            facts.append(f"seq {f.seq}")
        if f.op:
            facts.append(f"op {f.op}")
        waits = "".join(
            f"<li>{escape(line)}</li>" for c in f.consequences[:12] for line in _blocked(c)
        )
        more = len(f.consequences) - 12
        if more > 0:
            waits += f"<li>... and {more} more</li>"
        evidence = json.dumps(data, indent=2, default=str)
        out.append(
            f'<li class="finding{" first" if i == 0 else ""}" data-kind="{escape(str(f.kind))}">'
            f'<span class="kind">{escape(str(f.kind))}</span>{escape(f.summary)}'
            f'<div class="meta">{escape(" · ".join(facts))}</div>'
            + (f"<div>Blocked because of it:<ul>{waits}</ul></div>" if waits else "")
            + f"<details><summary>evidence</summary><pre>{escape(evidence)}</pre></details></li>"
        )
    out.append("</ol></section>")
    return "\n".join(out)


def _where(report: Report) -> str:
    by_state: dict[str, list[int]] = defaultdict(list)
    for rank, state in sorted(report.states.items()):
        by_state[state.describe()].append(rank)
    if not by_state:
        return ""
    culprits = set(report.findings[0].ranks) if report.findings else set()
    ordered = sorted(
        by_state.items(), key=lambda kv: (not culprits & set(kv[1]), -len(kv[1]), kv[1][0])
    )
    out = ['<section id="where"><h2>Where every rank is</h2><ul class="where">']
    for phrase, ranks in ordered[:MAX_SITUATIONS]:
        culprit = bool(culprits & set(ranks))
        d = next((report.run.dumps[r] for r in ranks if r in report.run.dumps), None)
        stack = d.current_stack() if d is not None else ()
        body = (
            f"<details{' open' if culprit else ''}><summary>stack of rank {d.rank} at dump time"
            f" (innermost first)</summary>{_stack_html(stack)}</details>"
            if d is not None and stack
            else ""
        )
        out.append(
            f'<li class="{"culprit" if culprit else ""}" data-ranks="{escape(compress(ranks))}">'
            f'<div class="sentence">{escape(sentence(ranks, phrase))}</div>'
            f"{body}</li>"
        )
    if len(ordered) > MAX_SITUATIONS:
        out.append(f"<li>... and {len(ordered) - MAX_SITUATIONS} more situations</li>")
    out.append("</ul></section>")
    return "\n".join(out)


def _stack_html(stack: tuple[FrameInfo, ...]) -> str:
    lines = []
    frames = [f for f in stack if not f.file.startswith("<flightrec wrapper")]
    for frame in frames[:MAX_FRAMES]:
        user = not is_library_frame(frame)
        lines.append(
            f'<div class="frame {"user" if user else "lib"}">{"→" if user else "&nbsp;"} '
            f"{escape(frame.where())} in {escape(frame.function)}</div>"
        )
        if frame.code:
            lines.append(f'<div class="code">{escape(frame.code.strip())}</div>')
    if len(frames) > MAX_FRAMES:
        lines.append(f'<div class="meta">... {len(frames) - MAX_FRAMES} outer frames</div>')
    return f'<div class="mono">{"".join(lines)}</div>'


def _notes(report: Report) -> str:
    items = [f"<li>{escape(n)}</li>" for n in report.notes]
    items += [f"<li>skipped {escape(str(p))}</li>" for p in report.run.problems[:50]]
    if not items:
        return ""
    return f'<section id="notes"><h2>Notes</h2><ul>{"".join(items)}</ul></section>'
