"""How a rank's process ended: the exceptions its dumps record (``exceptions_of``), the one
it died of (``died_of``), and whether it is gone (``process_ended``).

A dump (or black box) carries every exception that ended one of its process's threads. An
exception that ended the main thread is what the rank died of. Read from the rank's chosen
dump and from the dumps its process wrote after it (``Run.later``): a rank that raised after
the hang snapshot still says what it died of.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import ExceptionEvidence, FrameInfo, RankDump, user_frame
from flightrec.format.ending import is_gone

SUMMARY_MESSAGE_CHARS = 160
"""An exception's message in a verdict line is cut here; the evidence has it whole."""
_COLLECTIVE_FRAME = re.compile(r"(/|^)torch/distributed/|^<flightrec ")
# Not a crash of the program: an interrupt (Ctrl-C, or the SIGINT torch.multiprocessing's
# children get when their parent goes) is how a stuck rank is ended, not why it was stuck.
_NOT_A_CRASH = frozenset({"KeyboardInterrupt", "SystemExit", "GeneratorExit"})
HANG_SLACK_NS = 2_000_000_000
"""Clocks of ranks on other hosts disagree by this much at most (as in the loader)."""


@dataclass(frozen=True, slots=True)
class RecordedException:
    """An exception that ended a thread of a rank's process, as a dump of it records it
    (``exceptions_of``)."""

    rank: int
    type: str
    message: str
    thread: str
    is_main: bool
    traceback: tuple[FrameInfo, ...]
    """Raising frame first."""
    wall_time_ns: int
    via: str
    dump: str

    @property
    def location(self) -> FrameInfo | None:
        """The innermost frame of the program's own code (else the raising frame)."""
        return user_frame(self.traceback)

    @property
    def in_collective(self) -> bool:
        """Raised from inside torch.distributed (a collective that failed or timed out)."""
        return any(_COLLECTIVE_FRAME.search(f.file.replace("\\", "/")) for f in self.traceback)

    def headline(self) -> str:
        """``ValueError: loss is NaN at train.py:57 in compute_loss``."""
        message = self.message.strip()
        if len(message) > SUMMARY_MESSAGE_CHARS:
            message = message[: SUMMARY_MESSAGE_CHARS - 1] + "…"
        text = f"{self.type}: {message}" if message else self.type
        loc = self.location
        return text + (f" at {loc.where()} in {loc.function}" if loc else "")

    def to_evidence(self) -> ExceptionEvidence:
        """The exception and its traceback, as a finding carries them."""
        return ExceptionEvidence(
            rank=self.rank,
            type=self.type,
            message=self.message,
            thread=self.thread,
            main_thread=self.is_main,
            seen_by=self.via,
            dump=self.dump,
            traceback=self.traceback,
            location=self.location,
        )


def exceptions_of(d: RankDump) -> list[RecordedException]:
    """Every exception a dump records, oldest first."""
    return [
        RecordedException(
            rank=d.rank,
            type=x.type,
            message=x.message,
            thread=x.thread,
            is_main=x.is_main,
            traceback=d.stack(x.stack),
            wall_time_ns=x.wall_time_ns,
            via=x.via,
            dump=d.path,
        )
        for x in d.dump.meta.exceptions
    ]


def died_of(m: Matched, rank: int) -> RecordedException | None:
    """The exception that ended ``rank``'s main thread, from any dump of its process."""
    run = m.run
    chosen = run.dumps.get(rank)
    if chosen is None:
        return None
    for d in (chosen, *run.later.get(rank, ())):
        for x in exceptions_of(d):
            if x.is_main and x.type not in _NOT_A_CRASH:
                return x
    return None


def process_ended(m: Matched, rank: int) -> bool:
    """Whether ``rank``'s process is gone: it died of an exception, wrote its exit dump (the
    chosen dump or one after it), or left a black box of a process that ended."""
    if rank in m.run.exited:
        return True
    chosen = m.run.dumps.get(rank)
    if chosen is None:
        return False
    for d in (chosen, *m.run.later.get(rank, ())):
        if is_gone(d.header):
            return True
    return died_of(m, rank) is not None


def thread_deaths(m: Matched, rank: int) -> list[RecordedException]:
    """Exceptions that ended other threads of ``rank``'s process (a data loader, a
    checkpoint writer): the main thread may wait for them forever."""
    d = m.run.dumps.get(rank)
    return [x for x in exceptions_of(d) if not x.is_main] if d is not None else []
