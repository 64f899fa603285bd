"""Summaries in, the verdict panel out: the same analysis and the same renderer as
``flightrec analyze``, fed with one view per rank built from its summary.

Pure (no store, no clock): ``flightrec.live.report`` gathers the bytes and prints the text.
"""

from __future__ import annotations

import io
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from rich.console import Console

from flightrec.analysis import FileProblem, RankDump, Report, analyze
from flightrec.analysis.loading.loader import Run
from flightrec.errors import DumpError, printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.summary import Summary, SummaryError, decode
from flightrec.readers.summary import summary_view
from flightrec.report.terminal import TerminalRenderer
from flightrec.text import ranks_phrase

WIDTH = 100
"""Columns of the panel: a job's log is no terminal, so rich cannot ask."""
MAX_DUMP_LINES = 16
TERM_STUCK_S = 5.0
"""In a round started by SIGTERM, an operation pending this long is a hang worth reporting."""


def load(
    raw: Mapping[int, bytes],
    number: int,
    world_size: int,
    dead: AbstractSet[int] = frozenset(),
    exited: AbstractSet[int] = frozenset(),
    blackbox_dir: str = "",
) -> tuple[Run, dict[int, Summary]]:
    """Decode every rank's summary and build the run the analysis takes.

    A summary that does not decode, or that answers an older round (the rank published nothing
    for this one in time), leaves its rank missing, with one line saying why. Ranks in
    ``dead`` listed themselves as dead of an exception: their summary, published on the way
    out, stands whatever round it names, if it says what ended the main thread. Ranks in
    ``exited`` said they ended cleanly; without a summary, that is what the verdict says.
    A rank that published nothing and left a black box of this job in ``blackbox_dir`` (the
    reporter's host) is read from it (``local_blackboxes``).
    """
    dumps: dict[int, RankDump] = {}
    summaries: dict[int, Summary] = {}
    problems: list[FileProblem] = []
    for rank, data in sorted(raw.items()):
        label = f"rank {rank}'s summary"
        try:
            s = decode(data, label)
            if s.rank != rank:
                raise SummaryError(f"{label}: says it is rank {s.rank}")
            died = rank in dead and any(x.is_main for x in s.exceptions)
            if s.round < number and not died:
                raise SummaryError(f"{label}: answers request {s.round}, not {number}")
            dumps[rank] = RankDump(label, summary_view(s, label))
            summaries[rank] = s
        except (SummaryError, DumpError) as exc:
            problems.append(FileProblem(label, printable(str(exc)).split(": ", 1)[-1]))
    if blackbox_dir:
        jobs = {sm.job_id for sm in summaries.values()}
        missing = set(range(world_size)) - set(dumps) - set(exited)
        dumps.update(local_blackboxes(blackbox_dir, missing, jobs))
    gone = frozenset(r for r in exited if r not in dumps)
    return Run(dumps, world_size, tuple(problems), (), exited=gone), summaries


def local_blackboxes(
    directory: str, ranks: AbstractSet[int], jobs: AbstractSet[str]
) -> dict[int, RankDump]:
    """The black boxes in ``directory`` of ``ranks`` of the job (``jobs``: the job ids the
    summaries name), the newest file per rank: what a rank aborted inside the backend (gloo's
    size check, an NCCL abort) leaves on its host, read as ``flightrec analyze`` reads it, so
    that the verdict in the log and the analysis of the folder agree. Unreadable files and
    other jobs' files are passed over."""
    from flightrec.format.blackbox import RING_SUFFIX
    from flightrec.readers import read_views

    found: dict[int, tuple[float, RankDump]] = {}
    if not ranks or not jobs:
        return {}
    for rank in sorted(ranks):
        for path in Path(directory).glob(f"flightrec-rank{rank:05d}-*{RING_SUFFIX}"):
            try:
                mtime = path.stat().st_mtime
                if rank in found and found[rank][0] >= mtime:
                    continue
                views = read_views(path)
            except (DumpError, OSError):
                continue
            h = views[0].meta.header if views else None
            if h is not None and h.rank == rank and h.job_id in jobs:
                found[rank] = (mtime, RankDump(str(path), views[0]))
    return {rank: dump for rank, (_, dump) in found.items()}


def worth_printing(report: Report, reason: str, summaries: Mapping[int, Summary]) -> bool:
    """A hang always is. A round started by SIGTERM (a job being stopped) is when a rank is
    missing, an operation failed, or one has been pending for ``TERM_STUCK_S``: a healthy job
    stopped mid-step has operations in flight that are no hang."""
    if reason != "SIGNAL_TERM":
        return True
    if not report.findings:
        return False
    if report.run.missing_ranks:
        return True
    if any(x.is_main for s in summaries.values() for x in s.exceptions):
        return True  # a rank died of an exception: why the job is being stopped
    for s in summaries.values():
        for g in s.groups:
            for e in g.entries:
                if e.state == pb.FAILED:
                    return True
                if e.state != pb.COMPLETED and s.mono_ns - e.enqueue_ns > TERM_STUCK_S * 1e9:
                    return True
    return False


def render(
    raw: Mapping[int, bytes],
    number: int,
    reason: str,
    world_size: int,
    gathered_s: float,
    dead: AbstractSet[int] = frozenset(),
    exited: AbstractSet[int] = frozenset(),
    on_panel: Callable[[Report], None] | None = None,
    blackbox_dir: str = "",
) -> str:
    """The text to print for one round ("" when there is nothing worth printing).

    Args:
        raw: per rank, the bytes read from its summary key.
        number: the round (dump request) number.
        reason: what started the round (``WATCHDOG_TIMEOUT``, ``SIGNAL_TERM``, ``RANK_DIED``).
        world_size: ranks expected.
        gathered_s: how long gathering took.
        dead: ranks that died of an exception and published on the way out (``load``).
        exited: ranks that said they ended cleanly (``load``).
        on_panel: called with the report when the text is a verdict panel.
        blackbox_dir: the reporter's black-box folder, for ranks that answered nothing.
    """
    run, summaries = load(raw, number, world_size, dead, exited, blackbox_dir)
    if not run.dumps:
        return (
            f"flightrec verdict: none, no rank's summary could be read for request {number} "
            f"({len(run.problems)} unreadable of {world_size})\n"
        )
    report = analyze(run)
    if not worth_printing(report, reason, summaries):
        return (
            f"flightrec verdict: {len(run.dumps)} of {world_size} ranks answered request {number} "
            "(SIGTERM); none was stuck\n"
        )
    if on_panel is not None:
        on_panel(report)
    out = io.StringIO()
    console = Console(file=out, width=WIDTH, color_system=None, soft_wrap=False)
    what = {"WATCHDOG_TIMEOUT": "hang declared", "RANK_DIED": "a rank died"}.get(
        reason, "stopped by SIGTERM"
    )
    # Plain lines around the panel: rich would wrap them at the console's width.
    boxes = len(run.dumps) - len(summaries)  # ranks read from black boxes on this host
    read = f" and {boxes} black box{'es' if boxes > 1 else ''} on this host" if boxes else ""
    out.write(
        f"flightrec verdict: {what}; from {len(summaries)} of {world_size} ranks' summaries"
        f"{read}, gathered through the job's store in {gathered_s:.1f} s (request {number})\n"
    )
    TerminalRenderer(console).render(report)
    for p in run.problems:
        out.write(f"flightrec verdict: {p.path}: {p.reason}\n")
    lines = dump_lines(summaries, world_size, run.exited)
    out.write("".join(f"{line}\n" for line in lines))
    return out.getvalue()


def dump_lines(
    summaries: Mapping[int, Summary], world_size: int, exited: AbstractSet[int] = frozenset()
) -> list[str]:
    """Where each rank's dump went: one line per rank, or per host and folder at scale ("-":
    the rank could not write it)."""
    lines = ["Dumps (on each rank's host)"]
    missing = [r for r in range(world_size) if r not in summaries and r not in exited]
    if len(summaries) <= MAX_DUMP_LINES:
        for r, s in sorted(summaries.items()):
            # Host and path come from the store: untrusted, never printed raw.
            lines.append(f"  rank {r} on {printable(s.host)}: {printable(s.dump_path) or '-'}")
    else:
        places: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r, s in sorted(summaries.items()):
            folder = os.path.dirname(s.dump_path) if s.dump_path else "-"
            places[(printable(s.host), printable(folder))].append(r)
        for shown, ((host, folder), ranks) in enumerate(sorted(places.items()), start=1):
            if shown > MAX_DUMP_LINES:
                lines.append(f"  ... and {len(places) - MAX_DUMP_LINES} more hosts or folders")
                break
            lines.append(f"  {ranks_phrase(ranks)} on {host}: {folder}")
    if exited:
        lines.append(f"  {ranks_phrase(sorted(exited))} exited cleanly, no dump")
    if missing:
        lines.append(f"  no answer from {ranks_phrase(missing)}")
    return lines
