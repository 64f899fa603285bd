"""Summaries in, the verdict panel out: the same analysis and the same renderer as
``flightrec analyze``, fed with one view per rank built from its summary.

Up to ``FULL_RANKS`` ranks, every rank's summary is analysed. Beyond, the reporter first reads
every rank's progress record (``select``: ``flightrec.live.frontier`` finds the ranks that hold
the job up), then the summaries of those ranks only, and the analysis runs on them while the
other ranks count as seen, not missing (``flightrec.analysis.loader.Run.seen``); where every
rank is comes from the progress records.

Pure (no store, no clock): ``flightrec.live.report`` gathers the bytes and prints the text.
"""

from __future__ import annotations

import io
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from flightrec.analysis import FileProblem, RankDump, Report, analyze
from flightrec.analysis.loading.loader import Run
from flightrec.errors import DumpError, printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of, set_members
from flightrec.format.progress import Decoded, ProgressRecord, read_progress, record_of
from flightrec.format.progress import progress as progress_of
from flightrec.format.summary import SummaryError, decode
from flightrec.live.frontier import Frontier, find_frontier
from flightrec.readers.summary import summary_view
from flightrec.report.terminal import TerminalRenderer
from flightrec.text import ranks_phrase

WIDTH = 100
"""Columns of the panel: a job's log is no terminal, so rich cannot ask."""
MAX_DUMP_LINES = 16
TERM_STUCK_S = 5.0
"""In a round started by SIGTERM, an operation pending this long is a hang worth reporting."""
FULL_RANKS = 96
"""Jobs of at most this many ranks have every summary analysed (well under a second)."""
UNLISTED = 1024
"""Ranks without a record in the round's list whose summary stands in for it (a rank that
died answering an earlier round; the ranks after a damaged record): read from the summary,
at most this many (a damaged list costs the reporter a bounded read)."""
MAX_LINE = 200
"""Characters in any line of the text printed into the job's log, at any scale: log pipelines
split long lines (16 KB in some), and a list of ranks grows with the job. Rank sets are
summarised (``ranks_phrase(..., max_chars)``), lists capped, and the dumps hold the rest."""
PHRASE = 120
"""Characters of a rank set within one of those lines."""
MAX_PROBLEM_LINES = 12
"""Lines naming an unreadable record (then one line counting the others)."""


@dataclass(frozen=True, slots=True)
class Selection:
    """What the first pass decided: whose summaries to read, and what it saw of the rest.

    Attributes:
        ranks: the ranks whose summaries the analysis reads, sorted.
        progress: every answering rank's checked progress record.
        problems: progress records refused (one line each, naming the rank).
        frontier: the first pass's findings; None when every summary is read.
    """

    ranks: tuple[int, ...]
    progress: Mapping[int, ProgressRecord]
    problems: tuple[FileProblem, ...]
    frontier: Frontier | None


def select(
    raw: Mapping[int, bytes],
    number: int,
    world_size: int,
    dead: AbstractSet[int] = frozenset(),
    listing_problem: str = "",
    unlisted: Mapping[int, bytes] | None = None,
    decoded: Decoded | None = None,
) -> Selection:
    """Decide whose summaries to read, from every answering rank's progress record.

    Args:
        raw: per rank, the bytes read for its progress record.
        number: the round; a record answering an older one is refused (unless the rank is in
            ``dead``: it published on its way out).
        world_size: ranks expected.
        dead: ranks that died of an exception (``load``).
        listing_problem: why the round's list of progress records was not read to its end
            (``Round.progress``; "": it was): one line among the problems.
        unlisted: summaries of ranks without a record in ``raw``: where such a rank stood is
            read from its summary (the record it would have published, made from the dump
            the summary carries).
        decoded: records decoded ahead (``format.progress.decode_many``); one whose bytes differ from
            ``raw``'s is decoded again.
    """
    progress: dict[int, ProgressRecord] = {}
    problems: list[FileProblem] = []
    if listing_problem:
        problems.append(FileProblem("the round's progress records", listing_problem))
    ahead = decoded or {}
    records = [(rank, data, False) for rank, data in raw.items()]
    records += [(rank, data, True) for rank, data in (unlisted or {}).items() if rank not in raw]
    for rank, data, summary in records:
        known = None if summary else ahead.get(rank)
        if known is None or known[0] != data:
            known = (data, _decoded(data, rank, world_size, summary))
        p = known[1]
        if isinstance(p, str):
            what = "summary" if summary else "progress"
            problems.append(FileProblem(f"rank {rank}'s {what}", p))
            continue
        if p.round < number and rank not in dead:
            problems.append(
                FileProblem(f"rank {rank}'s progress", f"answers request {p.round}, not {number}")
            )
            continue
        progress[rank] = p
    if world_size <= FULL_RANKS:
        return Selection(tuple(sorted({*raw, *(unlisted or {})})), progress, tuple(problems), None)
    frontier = find_frontier(progress)
    wanted = set(frontier.detail) | (set(dead) & {*raw, *(unlisted or {})})
    return Selection(tuple(sorted(wanted)), progress, tuple(problems), frontier)


def _decoded(data: bytes, rank: int, world_size: int, summary: bool) -> ProgressRecord | str:
    """A rank's record (from its summary when ``summary``), or why it is refused."""
    if not summary:
        return read_progress(data, rank, world_size)
    try:
        return _stood_in(data, rank, world_size)
    except SummaryError as exc:
        return str(exc).split(": ", 1)[-1]


def _stood_in(data: bytes, rank: int, world_size: int) -> ProgressRecord:
    """The progress record of a rank read from its summary (``select``'s ``unlisted``).

    Raises:
        SummaryError: the summary does not decode, or is another rank's.
    """
    s = decode(data, f"rank {rank}'s summary")
    if s.dump.header.rank != rank:
        raise SummaryError(f"rank {rank}'s summary: says it is rank {s.dump.header.rank}")
    if s.dump.header.world_size != world_size:
        raise SummaryError(
            f"rank {rank}'s summary: says the world has {s.dump.header.world_size} ranks"
        )
    return record_of(progress_of(s.dump, s.round))


def load(
    raw: Mapping[int, bytes],
    number: int,
    world_size: int,
    dead: AbstractSet[int] = frozenset(),
    exited: AbstractSet[int] = frozenset(),
    seen: AbstractSet[int] = frozenset(),
    blackbox_dir: str = "",
) -> tuple[Run, dict[int, pb.Summary]]:
    """Decode the summaries read and build the run the analysis takes.

    A summary that does not decode, or that answers an older round (the rank published nothing
    for this one in time), leaves its rank missing, with one line saying why. Ranks in
    ``dead`` listed themselves as dead of an exception: their summary, published on the way
    out, stands whatever round it names, if it says what ended the main thread. Ranks in
    ``exited`` said they ended cleanly; without a summary, that is what the verdict says.
    Ranks in ``seen`` answered but are not analysed here (the first pass found nothing of
    theirs that the verdict needs): they are not missing, and every group is restricted to
    the members analysed. A rank that published nothing and left a black box of this job in
    ``blackbox_dir`` (the reporter's host) is read from it (``local_blackboxes``).
    """
    dumps: dict[int, RankDump] = {}
    summaries: dict[int, pb.Summary] = {}
    problems: list[FileProblem] = []
    for rank, data in sorted(raw.items()):
        label = f"rank {rank}'s summary"
        try:
            s = decode(data, label)
            h = s.dump.header
            if h.rank != rank:
                raise SummaryError(f"{label}: says it is rank {h.rank}")
            died = rank in dead and any(x.is_main for x in s.dump.exceptions)
            if s.round < number and not died:
                raise SummaryError(f"{label}: answers request {s.round}, not {number}")
            summaries[rank] = s
        except SummaryError as exc:
            problems.append(FileProblem(label, printable(str(exc)).split(": ", 1)[-1]))
    if seen:
        _restrict(summaries, seen)
    for rank, s in summaries.items():
        dumps[rank] = RankDump(f"rank {rank}'s summary", summary_view(s))
    if blackbox_dir:
        jobs = {sm.dump.header.job_id for sm in summaries.values()}
        missing = set(range(world_size)) - set(dumps) - set(exited) - set(seen)
        dumps.update(local_blackboxes(blackbox_dir, missing, jobs))
    gone = frozenset(r for r in exited if r not in dumps)
    seen = frozenset(r for r in seen if r not in dumps and r not in gone)
    return Run(dumps, world_size, tuple(problems), (), exited=gone, seen=seen), summaries


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


def _restrict(summaries: Mapping[int, pb.Summary], seen: AbstractSet[int]) -> None:
    """Take the ranks in ``seen`` out of every group: they answered with their progress and
    are no culprit the first pass saw, so the analysis must not wait on them (ranks that never
    answered stay: the analysis names them)."""
    done: dict[tuple[str, bytes], list[int] | None] = {}  # (the ranks share their groups)
    for s in summaries.values():
        for g in s.dump.groups:
            key = (g.name, g.SerializeToString())
            if key not in done:
                ranks = members_of(g)
                touched = any(r in seen for r in ranks)
                done[key] = [r for r in ranks if r not in seen] if touched else None
            inside = done[key]
            if inside is None:
                continue
            g.ClearField("ranks")
            g.ClearField("rank_grid")
            set_members(g, inside)


def worth_printing(
    report: Report,
    reason: str,
    summaries: Mapping[int, pb.Summary],
    progress: Mapping[int, ProgressRecord] | None = None,
) -> bool:
    """A hang always is. A round started by SIGTERM (a job being stopped) is when a rank is
    missing, an operation failed, or one has been pending for ``TERM_STUCK_S``: a healthy job
    stopped mid-step has operations in flight that are no hang."""
    if reason != "SIGNAL_TERM":
        return True
    if not report.findings:
        return False
    if report.run.missing_ranks:
        return True
    for p in (progress or {}).values():
        if p.flags & (pb.DIED | pb.OP_FAILED) or p.waited_ms > TERM_STUCK_S * 1e3:
            return True
    for s in summaries.values():
        d = s.dump
        if any(x.is_main for x in d.exceptions):
            return True  # a rank died of an exception: why the job is being stopped
        now = d.header.mono_time_ns
        for state, enq in zip(d.entries.state, d.entries.enqueue_ns, strict=True):
            if state == pb.FAILED:
                return True
            if state != pb.COMPLETED and now - enq > TERM_STUCK_S * 1e9:
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
    selection: Selection | None = None,
) -> str:
    """The text to print for one round ("" when there is nothing worth printing).

    Args:
        raw: per rank, the bytes read from its summary key (every answering rank's, or the
            ranks ``selection`` names).
        number: the round (dump request) number.
        reason: what started the round (``WATCHDOG_TIMEOUT``, ``SIGNAL_TERM``, ``RANK_DIED``).
        world_size: ranks expected.
        gathered_s: how long gathering took.
        dead: ranks that died of an exception and published on the way out (``load``).
        exited: ranks that said they ended cleanly (``load``).
        on_panel: called with the report when the text is a verdict panel.
        blackbox_dir: the reporter's black-box folder, for ranks that answered nothing.
        selection: the first pass (``select``) when it chose whose summaries to read.
    """
    partial = selection is not None and selection.frontier is not None
    seen = frozenset(selection.progress) - set(raw) if selection and partial else frozenset()
    run, summaries = load(raw, number, world_size, dead, exited, seen, blackbox_dir)
    if selection is not None:
        run = Run(
            run.dumps, run.world_size, selection.problems + run.problems, run.notes,
            exited=run.exited, seen=run.seen,
        )  # fmt: skip
    if not run.dumps:
        return (
            f"flightrec verdict: none, no rank's summary could be read for request {number} "
            f"({len(run.problems)} unreadable of {world_size})\n"
        )
    report = analyze(run)
    progress = selection.progress if selection is not None else None
    if not worth_printing(report, reason, summaries, progress):
        answered = len(run.dumps) + len(run.seen)
        return (
            f"flightrec verdict: {answered} of {world_size} ranks answered request {number} "
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
    if partial:
        out.write(
            f"flightrec verdict: {what}; from {len(summaries) + len(run.seen)} of {world_size} "
            f"ranks' progress and the summaries of the {len(summaries)} it implicates{read}, "
            f"gathered in {gathered_s:.1f} s (request {number})\n"
        )
    else:
        out.write(
            f"flightrec verdict: {what}; from {len(summaries)} of {world_size} ranks' "
            f"summaries{read}, gathered through the job's store in {gathered_s:.1f} s "
            f"(request {number})\n"
        )
    TerminalRenderer(console).render(report)
    for p in run.problems[:MAX_PROBLEM_LINES]:
        out.write(f"flightrec verdict: {p.path}: {p.reason}\n")
    if len(run.problems) > MAX_PROBLEM_LINES:
        more = len(run.problems) - MAX_PROBLEM_LINES
        out.write(f"flightrec verdict: ... and {more} more records that could not be used\n")
    if partial and selection is not None and selection.frontier is not None:
        out.write(f"Where all {len(selection.progress)} answering ranks are (their progress)\n")
        out.write("".join(f"  {line}\n" for line in selection.frontier.where))
    lines = dump_lines(summaries, world_size, run.exited, set(summaries) | set(run.seen))
    out.write("".join(f"{line}\n" for line in lines))
    return fit(out.getvalue())


def fit(text: str) -> str:
    """``text`` with every line cut to ``MAX_LINE`` characters (ending in "…"): the last
    guard; the lines are built to fit already."""
    lines = text.split("\n")
    return "\n".join(
        line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…" for line in lines
    )


def _on(hostname: str) -> str:
    """`` on <host>`` for a dump line ("" where the dump names no host: a native dump may not);
    the name comes from the store: untrusted, never printed raw."""
    host = _clip(printable(hostname), 64)
    return f" on {host}" if host else ""


def dump_lines(
    summaries: Mapping[int, pb.Summary],
    world_size: int,
    exited: AbstractSet[int] = frozenset(),
    answered: AbstractSet[int] | None = None,
) -> list[str]:
    """Where each rank's dump went: one line per rank, or per host and folder at scale ("-":
    the rank could not write it). Ranks in ``answered`` without a summary here wrote theirs
    on their own host as well (said in one line)."""
    lines = ["Dumps (on each rank's host)"]
    answered = set(summaries) if answered is None else answered
    missing = [
        r for r in range(world_size) if r not in summaries and r not in exited and r not in answered
    ]
    if len(summaries) <= MAX_DUMP_LINES:
        for r, s in sorted(summaries.items()):
            # Host and path come from the store: untrusted, never printed raw.
            on = _on(s.dump.header.hostname)
            lines.append(f"  rank {r}{on}: {_clip(printable(s.dump_path), 120) or '-'}")
    else:
        places: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r, s in sorted(summaries.items()):
            folder = os.path.dirname(s.dump_path) if s.dump_path else "-"
            places[(_on(s.dump.header.hostname), _clip(printable(folder), 100))].append(r)
        for shown, ((on, folder), ranks) in enumerate(sorted(places.items()), start=1):
            if shown > MAX_DUMP_LINES:
                lines.append(f"  ... and {len(places) - MAX_DUMP_LINES} more hosts or folders")
                break
            lines.append(f"  {ranks_phrase(ranks, 32)}{on}: {folder}")
    rest = sorted(set(answered) - set(summaries))
    if rest:
        lines.append(f"  {ranks_phrase(rest, PHRASE)}: on each one's host, beside the above")
    if exited:
        lines.append(f"  {ranks_phrase(sorted(exited), PHRASE)} exited cleanly, no dump")
    if missing:
        lines.append(f"  no answer from {ranks_phrase(missing, PHRASE)}")
    return lines


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters (its end kept: a path's file name)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]
