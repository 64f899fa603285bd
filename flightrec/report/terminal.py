"""The terminal report: the verdict first, then the evidence a person checks it against.

Rendered with rich onto a console the caller provides; rich fits the width of the terminal,
drops colour under ``NO_COLOR`` and writes plain text when the output is not a terminal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from flightrec.analysis.facts.lateness import LatenessRow, StragglerEvidence
from flightrec.analysis.model import (
    Consequence,
    Finding,
    FrameInfo,
    ProcessGroupInfo,
    is_library_frame,
)
from flightrec.analysis.verdict.advice import advice_line
from flightrec.report.grid import groups_named
from flightrec.report.layout import code_line, hanging
from flightrec.text import compress, ranks_phrase

if TYPE_CHECKING:
    from flightrec.analysis import Report

MAX_GROUPS = 12
MAX_FRAMES = 14
# The file name flightrec/recorder/hooks/codegen.py compiles its generated wrappers under.
WRAPPER_FILE_PREFIX = "<flightrec wrapper of "
MAX_OTHER_FINDINGS = 20
MAX_LINES = 12
BAR_WIDTH = 16
STRAGGLER_ROWS = 8

_SINGULAR = {"wait": "waits", "are": "is"}


def sentence(ranks: list[int], phrase: str) -> str:
    """``ranks 0-1,3 wait in ...``; ``rank 2 waits in ...`` for one rank (one wording for
    every renderer)."""
    if len(ranks) == 1:
        head, _, rest = phrase.partition(" ")
        phrase = f"{_SINGULAR.get(head, head)} {rest}".rstrip()
    return f"{ranks_phrase(ranks)} {phrase}"


def blocked_lines(waiting: Sequence[int], ended: Sequence[int], what: str, took: str) -> list[str]:
    """``ranks 0-1,3 wait in WHAT for 2.1 s`` for the ranks still waiting, and ``ranks 0,3
    waited in WHAT for 2.1 s, then died`` for those whose process has ended since: a dead
    process waits nowhere. One wording for every renderer."""
    lines = []
    still = [r for r in waiting if r not in ended]
    if still:
        lines.append(sentence(still, f"wait in {what}") + took)
    gone = [r for r in waiting if r in ended]
    if gone:
        lines.append(f"{ranks_phrase(gone)} waited in {what}{took}, then died")
    return lines


class TerminalRenderer:
    """Renders a ``Report`` for people.

    Args:
        console: where to write; a default rich console on stdout when None.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._desc: dict[str, str] = {}
        self._members: dict[str, tuple[int, ...]] = {}

    def render(self, report: Report) -> None:
        """Write the verdict panel, then the evidence."""
        self._desc = {k: g.desc for k, g in report.matched.groups.items()}
        self._members = {k: tuple(g.ranks) for k, g in report.matched.groups.items()}
        self._print(self._verdict(report))
        if report.findings and report.findings[0].advice is not None:
            self._print(hanging("Next: ", advice_line(report.findings[0].advice), style="bold"))
        for line in report.notes:
            self._print(hanging("note: ", line, style="dim"))
        if report.findings:
            others = report.findings[1:]
            if others:
                self._print(Text("Other findings", style="bold"))
                for i, f in enumerate(others[:MAX_OTHER_FINDINGS], start=2):
                    self._print(hanging(f"  {i}. ", f"[{f.kind}] {f.summary}"))
                if len(others) > MAX_OTHER_FINDINGS:
                    self._print(
                        Text(f"  ... and {len(others) - MAX_OTHER_FINDINGS} more (see --json)")
                    )
            self._consequences(report.findings[0])
            self._stragglers(report)
        self._where(report)
        self._progress(report)
        if report.findings:
            self._culprit_stack(report, report.findings[0])
        self._footer(report)

    def _print(self, renderable: RenderableType) -> None:
        """Print ``renderable`` without the spaces rich pads table cells and wrapped lines
        with: they are invisible on a terminal but end up in logs, diffs and pastes."""
        c = self.console
        out: list[Segment] = []
        for line in c.render_lines(renderable, pad=False, new_lines=False):
            out.extend(_rstrip(line))
            out.append(Segment.line())
        c.print(Segments(out), end="")

    def _verdict(self, report: Report) -> Panel:
        if not report.findings:
            body = Text(
                f"No problem found: {len(report.ranks_with_dump)} of {report.world_size} ranks "
                "dumped, every collective matched and nothing is blocked.",
                style="bold green",
            )
            return Panel(body, title="Verdict", border_style="green", expand=True)
        first = report.findings[0]
        body = Text(first.summary, style="bold")
        title = f"Verdict: {first.kind}" + (f" ({first.field})" if first.field else "")
        return Panel(body, title=title, border_style="red", expand=True)

    def _consequences(self, f: Finding) -> None:
        # Waits of the same op and seq on groups of the same kind (eight pipeline pairs, a
        # thousand data-parallel groups) read as one line.
        # A few transfers read one line per pair ("from rank 2"); many merge like the rest.
        by_pair = len(f.consequences) <= MAX_LINES
        merged: dict[tuple[str, int, str, tuple[int, int] | None], list[Consequence]]
        merged = defaultdict(list)
        for c in f.consequences:
            if c.waiting:
                desc = self._desc.get(c.process_group, "")
                merged[(c.label or c.op, c.seq, desc, c.p2p if by_pair else None)].append(c)
        lines: list[str] = []
        for (op, seq, desc, _), cs in merged.items():
            waiting = sorted({r for c in cs for r in c.waiting})
            ended = sorted({r for c in cs for r in c.ended})
            longest = max(c.waited_s for c in cs)
            where = self._waited_where(cs, desc)
            took = f" for {longest:.1f} s" if longest >= 0.05 else ""
            lines += blocked_lines(waiting, ended, f"{op} #{seq} {where}", took)
        if lines:
            self._print(Text("Blocked because of it", style="bold"))
            for line in lines[:MAX_LINES]:
                self._print(hanging("  ", line))
            if len(lines) > MAX_LINES:
                self._print(Text(f"  ... and {len(lines) - MAX_LINES} more", style="dim"))
        if f.explains:
            self._print(Text("Explained by it (not causes of their own)", style="bold"))
            for x in f.explains[:MAX_LINES]:
                self._print(hanging("  ", f"[{x.kind}] {x.summary}", style="dim"))
            if len(f.explains) > MAX_LINES:
                self._print(Text(f"  ... and {len(f.explains) - MAX_LINES} more", style="dim"))

    def _waited_where(self, cs: list[Consequence], desc: str) -> str:
        """Where the waits ``cs`` (one op and seq) are: to or from ranks, on a group, on
        several groups of one kind."""
        pairs = [c.p2p for c in cs if c.p2p is not None]
        if len(pairs) == len(cs):
            # Sends and receives as their users wrote them: to or from a rank, not a group.
            recv = all(r == dst for (_, dst), c in zip(pairs, cs, strict=True) for r in c.waiting)
            peers = sorted({src if recv else dst for src, dst in pairs})
            return f"{'from' if recv else 'to'} {ranks_phrase(peers)}"
        if len({c.process_group for c in cs}) == 1:
            # Several waits on one group (the pairs of a P2P cycle) name that group.
            # A P2P wait's ranks are its pair; the group's members say which group it is.
            pg = cs[0].process_group
            return f"on group {pg} [ranks {compress(self._members.get(pg) or cs[0].pg_ranks)}]"
        return f"on {len(cs)} {desc + ' ' if desc else ''}groups"

    def _stragglers(self, report: Report) -> None:
        """The straggler table: per-rank lateness on aligned clocks, with bars."""
        found = [
            (f, f.evidence) for f in report.findings if isinstance(f.evidence, StragglerEvidence)
        ]
        if not found:
            return
        evidence = found[0][1]
        rows = evidence.lateness_by_rank
        if not rows:
            return
        blamed = {r for f, _ in found for r in f.ranks}
        low = {r for f, ev in found if ev.confidence == "low" for r in f.ranks}
        table = Table(
            title="Arrival lateness per rank (aligned clocks)",
            title_justify="left",
            title_style="bold",
            show_edge=False,
            expand=False,
        )
        for name, justify in (
            ("rank", "right"),
            ("host", "left"),
            ("last", "right"),
            ("behind", "right"),
            ("p90", "right"),
            ("clock", "right"),
            ("", "left"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        scale = max((r.median_behind_ms for r in rows), default=0.0)
        for row in rows[:STRAGGLER_ROWS]:
            rank = row.rank
            behind = row.median_behind_ms
            d = report.run.dumps.get(rank)
            style = "red" if rank in blamed - low else "yellow" if rank in low else ""
            table.add_row(
                str(rank),
                d.header.hostname if d else "?",
                f"{100 * row.last_share:.0f}%",
                f"{behind:.1f} ms",
                f"{row.p90_behind_ms:.1f} ms",
                _clock_cell(row),
                Text(_bar(behind, scale), style=style or "dim"),
                style=style,
            )
        self._print(table)
        clock = evidence.clock
        line = (
            f"  clocks aligned on rank {clock.reference_rank} from simultaneous "
            f"completions: offsets up to {clock.max_offset_ms} ms, uncertainty "
            f"up to {clock.max_uncertainty_ms} ms"
        )
        if clock.unaligned_ranks:
            line += f"; not aligned: ranks {compress(clock.unaligned_ranks)}"
        self._print(Text(line, style="dim"))

    def _where(self, report: Report) -> None:
        by_state: dict[str, list[int]] = defaultdict(list)
        for rank, state in sorted(report.states.items()):
            by_state[state.describe()].append(rank)
        if not by_state:
            return
        self._print(Text("Where every rank is", style="bold"))
        culprits = set(report.findings[0].ranks) if report.findings else set()
        ordered = sorted(
            by_state.items(), key=lambda kv: (not culprits & set(kv[1]), -len(kv[1]), kv[1][0])
        )
        for shown, (phrase, ranks) in enumerate(ordered, start=1):
            style = "red" if culprits & set(ranks) else ""
            if shown > MAX_LINES:
                self._print(
                    Text(f"  ... and {len(by_state) - MAX_LINES} more situations", style="dim")
                )
                break
            self._print(hanging("  ", sentence(ranks, phrase), style=style))

    def _progress(self, report: Report) -> None:
        groups = report.matched.groups
        order = _progress_order(report)
        if not order:
            return
        # The title goes on its own line: as a table title it would wrap to the table's width.
        self._print(Text("Progress per group (last issued / last completed seq)", style="bold"))
        seen = report.run.seen
        if seen:  # the verdict in a large job's log: the ranks read in detail only
            read = len(report.run.dumps)
            self._print(
                Text(
                    f"  members shown: only the {read} ranks analysed of the "
                    f"{read + len(seen)} that answered (where every rank is: below)",
                    style="dim",
                )
            )
        table = Table(show_edge=False, expand=False)
        table.add_column("group", no_wrap=True)
        table.add_column("ranks")
        table.add_column("progress")
        for key in order[:MAX_GROUPS]:
            info = groups[key]
            # (the members are the next column)
            name = info.label() if info.desc else f"group {info.key}"
            table.add_row(name, compress(info.ranks), " · ".join(_progress_cells(report, info)))
        self._print(table)
        if len(order) > MAX_GROUPS:
            self._print(Text(f"  ... and {len(order) - MAX_GROUPS} more groups", style="dim"))

    def _culprit_stack(self, report: Report, f: Finding) -> None:
        exc = f.exception
        if exc is not None:  # what the rank died of, as Python would have printed it
            head = (f"{exc.type}: {exc.message}".splitlines() or [""])[0][:200]
            title = f"Traceback of rank {exc.rank} (raising frame first): {head}"
            self._print(hanging("", title, style="bold"))
            self._print(_stack_text(exc.traceback))
        for rank in f.ranks[:2]:
            d = report.run.dumps.get(rank)
            if d is None:
                continue
            stack = d.current_stack()
            if not stack:
                continue
            self._print(Text(f"Stack of rank {rank} at dump time (innermost first)", style="bold"))
            self._print(_stack_text(stack))

    def _footer(self, report: Report) -> None:
        run = report.run
        missing = run.missing_ranks
        line = f"{len(run.dumps)} dump(s) of {report.world_size} ranks"
        if missing:
            line += f"; no dump from {ranks_phrase(missing)}"
        if run.problems:
            line += f"; {len(run.problems)} file(s) could not be used (listed on stderr)"
        self._print(Text(line, style="dim"))


def _progress_order(report: Report) -> list[str]:
    """The groups of the progress table: those the findings name first, then the others;
    groups used only for P2P have no collective counters to compare."""
    groups = report.matched.groups
    mentioned = groups_named(report)
    order = mentioned + [k for k in groups if k not in mentioned]
    return [k for k in order if any(p.last_seq for p in groups[k].progress.values())]


def _progress_cells(report: Report, info: ProcessGroupInfo) -> list[str]:
    """``issued/completed: ranks``, newest first, then the members with no progress here."""
    by_progress: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r, p in info.progress.items():
        if r not in info.ranks:  # every rank creates every group; members only here
            continue
        by_progress[(p.last_seq, p.last_completed)].append(r)
    cells = [
        f"{issued}/{'?' if done < 0 else done}: {ranks_phrase(rs)}"
        for (issued, done), rs in sorted(by_progress.items(), reverse=True)
    ]
    # A rank absent here left no dump, or its dump (a summary in the job's log, which
    # keeps the groups with something pending first) does not hold the group; ranks
    # the verdict in the log read the progress of only are not listed.
    run = report.run
    absent = [r for r in info.ranks if r not in info.progress and r not in run.seen]
    no_dump = [r for r in absent if r not in run.dumps]
    if no_dump:
        cells.append(f"no dump: {ranks_phrase(no_dump)}")
    unrecorded = [r for r in absent if r in run.dumps]
    if unrecorded:
        cells.append(f"not in the dump: {ranks_phrase(unrecorded)}")
    return cells


def _rstrip(line: list[Segment]) -> list[Segment]:
    """``line`` without trailing spaces (styles kept)."""
    line = list(line)
    while line:
        last = line[-1]
        if last.control:
            break
        text = last.text.rstrip(" ")
        if text:
            line[-1] = Segment(text, last.style)
            break
        line.pop()
    return line


def _clock_cell(row: LatenessRow) -> str:
    """``+5.73±0.01 ms``: the rank's clock offset against the reference, or ``?``."""
    offset, unc = row.clock_offset_ms, row.clock_uncertainty_ms
    if offset is None or unc is None:
        return "?"
    return f"{offset:+.2f}±{unc:.2f} ms"


def _bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A bar of ``value`` against ``scale`` in eighth-blocks; empty for values at or below 0."""
    if value <= 0 or scale <= 0:
        return ""
    eighths = round(width * 8 * min(1.0, value / scale))
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def _stack_text(stack: tuple[FrameInfo, ...]) -> Group:
    # flightrec's generated wrapper sits between the user's call and torch's function on
    # every traced stack; it says nothing the next frame does not.
    stack = tuple(f for f in stack if not f.file.startswith(WRAPPER_FILE_PREFIX))
    lines: list[Text | Table] = []
    for frame in stack[:MAX_FRAMES]:
        user = not is_library_frame(frame)
        lines.append(
            Text(
                f"  {'→' if user else ' '} {frame.where()} in {frame.function}",
                style="bold" if user else "dim",
            )
        )
        # Only the dump's own copy of the line (what the job ran). A path named by a dump is
        # never opened here: the file may differ from the code that ran, and a crafted dump
        # could name any file on the analyst's machine, or /dev/zero.
        if frame.code:
            lines.append(code_line(8, frame.code, style="" if user else "dim"))
    if len(stack) > MAX_FRAMES:
        lines.append(Text(f"    ... {len(stack) - MAX_FRAMES} outer frames", style="dim"))
    return Group(*lines)
