"""The verdict in the job's own log, seconds after a hang, with no shared filesystem.

The recorder publishes each rank's progress record and summary through the job's store and
runs ``report`` on a flightrec thread of the one rank that reports
(``flightrec.recorder.exchange.verdict``). ``report`` waits, time-boxed, for the other ranks to
answer, reads every rank's progress record, then the summaries of the ranks those implicate
(every rank's in a small job), runs the analysis on them and prints the verdict panel to
stderr (``flightrec.live.verdict``; the design and its figures: docs/inlog.md). Nothing is imported from the analysis
or the renderer until a hang is declared (then while the summaries arrive).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from flightrec.errors import first_line

if TYPE_CHECKING:
    from flightrec.analysis import Report
    from flightrec.live.rounds import Verdict
    from flightrec.recorder.exchange.verdict import Round

log = logging.getLogger("flightrec")
POLL_S = 0.1
"""How often the reporter looks at who has answered (only while a round is being gathered)."""
READ_AHEAD = 0.2
"""The share of the world whose answers make the reporter read the progress records while it
waits (five reads of the growing list at most; each unframes only what is new)."""

__all__ = ["REPORTER", "LiveReporter", "report"]


class LiveReporter:
    """What ``flightrec.enable`` hands the recorder: ``report``, and ``prepare`` to load the
    analysis and the renderer ahead of time (seconds of imports on a busy machine)."""

    def __call__(self, rnd: Round) -> None:
        report(rnd)

    def prepare(self) -> None:
        """Import what ``report`` needs; never raises."""
        try:
            import flightrec.live.verdict  # noqa: F401
        except Exception as exc:
            log.warning("flightrec: could not load the analysis for the verdict: %s", exc)

    def slow_judge(self) -> Callable[[Mapping[int, bytes]], None]:
        """What judges the slow check's digests on the reporting rank (docs/slow-ranks.md);
        called at the first check, on the check's thread (it loads the analysis)."""
        from flightrec.live.slow import SlowReporter

        return SlowReporter(_write_stderr)


REPORTER = LiveReporter()
"""The reporter ``flightrec.enable`` and the start-up hook hand to the recorder."""


def report(rnd: Round) -> None:
    """Gather the round's summaries until all ranks answered or the deadline, then print.

    Steps aside as soon as a lower rank has answered (it reports instead). Never raises: any
    failure is one warning line.
    """
    started = time.monotonic()
    try:
        # The analysis and the renderer load while the other ranks answer, not after.
        from flightrec.format.progress import Decoded, decode_many
        from flightrec.live.rounds import earlier
        from flightrec.live.verdict import UNLISTED, render, select
        from flightrec.recorder.exchange.verdict import Listing

        listing = Listing(rnd)
        decoded: Decoded = {}

        def read_ahead() -> None:
            decode_many(listing.read(), rnd.world_size, decoded)

        answered = _gather_answers(rnd, read_ahead)
        if answered is None:
            return  # a lower rank answered: it reports
        died, left = rnd.died(), rnd.left()
        if not rnd.close():  # (closed: a rank answering from now on starts no second verdict)
            return
        dead = sorted(set(died) - set(answered))
        exited = frozenset(left) - set(answered) - set(dead)
        # Every rank's progress first; then the summaries of the ranks it implicates (all of
        # them in a small job). A rank without a record in the round's list (dead since an
        # earlier round) is read from its summary.
        wanted = sorted({*answered, *dead})
        progress, why = rnd.progress(wanted, listing)
        unlisted = rnd.summaries([r for r in wanted if r not in progress][:UNLISTED])
        chosen = select(
            progress, rnd.number, rnd.world_size, frozenset(dead), listing_problem=why,
            unlisted=unlisted, decoded=decoded,
        )  # fmt: skip
        raw = {r: unlisted[r] for r in chosen.ranks if r in unlisted}
        raw.update(rnd.summaries([r for r in chosen.ranks if r not in raw]))
        gathered = time.monotonic() - started
        before = earlier(rnd.store, rnd.namespace, rnd.restart)
        panels: list[Report] = []
        text = render(
            raw, rnd.number, rnd.reason, rnd.world_size, gathered, frozenset(dead), exited,
            on_panel=panels.append, blackbox_dir=getattr(rnd, "blackbox_dir", ""),
            selection=chosen,
        )  # fmt: skip
        if panels:
            text = _one_verdict(rnd, text, panels[0], before, len(answered), dead, exited)
    except Exception as exc:
        log.warning("flightrec: no verdict in the log: %s", first_line(exc))
        return
    if text:
        _write_stderr(text)


def _gather_answers(rnd: Round, read_ahead: Callable[[], None]) -> list[int] | None:
    """Wait, time-boxed, until every rank answered, died or left; the ranks that answered
    (None: a lower rank answered, and reports instead).

    What is polled is the count of answers (one read, no parsing: at 131,072 ranks the list
    is 0.9 MB); the list itself is parsed once the count says everyone may be in. Each time
    ``READ_AHEAD`` of the world's ranks more have answered, ``read_ahead`` reads and decodes
    their progress records, so that little is left to do once the last one is in."""
    ahead = 0
    step = max(1024, int(rnd.world_size * READ_AHEAD))
    while True:
        count, died, left = rnd.answered_count(), rnd.died(), rnd.left()
        if count - ahead >= step and count < rnd.world_size:
            read_ahead()
            ahead = count
        if count + len({*died, *left}) >= rnd.world_size:
            answered = rnd.answered()
            if len({*answered, *died, *left}) >= rnd.world_size:
                return answered
        if time.monotonic() >= rnd.deadline:
            return rnd.answered()
        time.sleep(POLL_S)
        if rnd.reporter() != rnd.rank:
            return None


def _one_verdict(
    rnd: Round,
    text: str,
    report: Report,
    before: Verdict | None,
    answered: int,
    dead: list[int],
    exited: frozenset[int],
) -> str:
    """The panel of the hang's first verdict (kept in the store), or for a later round of the
    same hang, one line saying that verdict stands (``flightrec.live.rounds``)."""
    from flightrec.live.rounds import from_finding, remember, same_hang, standing_line

    if before is None or before.round == rnd.number:
        if report.findings:
            remember(
                rnd.store, rnd.namespace, rnd.restart, from_finding(rnd.number, report.findings[0])
            )
        return text
    if not same_hang(report, before):
        return text  # another hang (every rank answered): a verdict of its own
    what = {"WATCHDOG_TIMEOUT": "hang declared again", "RANK_DIED": "a rank died"}.get(
        rnd.reason, "stopped by SIGTERM"
    )
    return standing_line(
        rnd.number, what, answered, rnd.world_size, before, frozenset(dead), exited
    )


def _write_stderr(text: str) -> None:
    """Write to file descriptor 2 directly, never through ``sys.stderr``'s buffer.

    A log that cannot take the text (a full disk, a size limit) must cost the verdict, not the
    job: a failed write through Python's buffered stream leaves its bytes pending, and the job's
    own next write to stderr would then fail trying to flush them.
    """
    with contextlib.suppress(Exception):
        sys.stderr.flush()  # the job's own lines first, in order
    try:
        fd = sys.stderr.fileno()
    except Exception:  # stderr replaced by a stream without a file (a notebook, a test)
        with contextlib.suppress(Exception):
            sys.stderr.write(text)
            sys.stderr.flush()
        return
    data = text.encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass
