"""One hang, one verdict: what a later round prints once a round has printed the verdict.

A hang can start more than one round: ranks whose waits began seconds apart declare it
seconds apart, and torchrun stopping the job starts one more. The first round whose panel
names a finding leaves that finding in the job's store (``Keys.verdict``, per torchrun attempt).
A later round reads it. Its own first finding may be the same hang seen again, or a worse
reading of it (a rank busy elsewhere, or covered by its earlier dump, answered late and reads
as having left no dump). The user reads the last verdict in the log, so such a round prints
one line: the verdict stands, plus what happened since (ranks that died or exited). Only a
different hang, with every rank answering (another group, or a later operation), gets a
panel of its own.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple

from flightrec.analysis.model import FindingKind
from flightrec.errors import printable
from flightrec.recorder.exchange.keys import Keys
from flightrec.text import ranks_phrase

if TYPE_CHECKING:
    from flightrec.analysis import Report
    from flightrec.analysis.model import Finding

MAX_LINE = 200
"""Characters of the one line a later round prints (as every line of the verdict)."""
MAX_SUMMARY = 400
"""Characters of the verdict's summary kept in the store (it is read back as untrusted)."""
NO_ANSWER_KINDS = frozenset({FindingKind.MISSING_DUMP})
"""Findings that only say a rank did not answer: never evidence against an earlier verdict."""


class Verdict(NamedTuple):
    """The finding a round printed first, as kept in the store."""

    round: int
    kind: str
    ranks: tuple[int, ...]
    group: str
    seq: int
    summary: str

    def encode(self) -> str:
        ranks = ",".join(map(str, self.ranks))
        return f"{self.round}|{self.kind}|{ranks}|{self.group}|{self.seq}|{self.summary}"


def from_finding(number: int, f: Finding) -> Verdict:
    """The verdict round ``number`` printed, from its first finding."""
    summary = " ".join(f.summary.split())[:MAX_SUMMARY]
    group = (f.process_group or "").replace("|", "/")
    seq = f.seq if f.seq is not None else -1
    return Verdict(number, str(f.kind), tuple(f.ranks), group, seq, summary.replace("|", "/"))


def decode(raw: bytes) -> Verdict | None:
    """The verdict kept in the store; None when the value is not one (it is untrusted)."""
    parts = raw[: MAX_SUMMARY + 512].decode("utf-8", "replace").split("|", 5)
    if len(parts) != 6 or not parts[0].isdigit() or len(parts[0]) > 9:
        return None
    number, kind, ranks, group, seq, summary = parts
    if kind not in {k.value for k in FindingKind}:
        return None
    try:
        ranked = tuple(int(r) for r in ranks.split(",") if r)
        at = int(seq)
    except ValueError:
        return None
    return Verdict(int(number), kind, ranked, printable(group), at, printable(summary))


def earlier(store: Any, namespace: str, restart: str) -> Verdict | None:
    """The verdict an earlier round of this attempt printed, if any."""
    key = Keys(namespace).verdict(restart)
    if not store.check([key]):
        return None
    return decode(bytes(store.get(key)))


def remember(store: Any, namespace: str, restart: str, verdict: Verdict) -> None:
    """Keep ``verdict`` unless a round already kept one (the first verdict stands)."""
    store.compare_set(Keys(namespace).verdict(restart), "", verdict.encode())


def same_hang(report: Report, before: Verdict) -> bool:
    """Whether ``report`` says nothing that outranks ``before``: its first finding is the same
    (kind and ranks, or the same operation), only says ranks did not answer, or is missing."""
    if not report.findings:
        return True
    f = report.findings[0]
    if f.kind in NO_ANSWER_KINDS or report.run.missing_ranks:
        return True  # an incomplete round: it cannot overrule a round every rank answered
    if (str(f.kind), tuple(f.ranks)) == (before.kind, before.ranks):
        return True
    return (f.process_group or "") == before.group and (f.seq if f.seq is not None else -1) == (
        before.seq
    )


def standing_line(
    number: int,
    what: str,
    answered: int,
    world_size: int,
    before: Verdict,
    dead: AbstractSet[int],
    exited: AbstractSet[int],
) -> str:
    """The one line a later round prints instead of a panel."""
    since = []
    if dead:
        since.append(f"{ranks_phrase(sorted(dead), 40)} died since")
    if exited:
        since.append(f"{ranks_phrase(sorted(exited), 40)} exited since")
    tail = f"; {'; '.join(since)}" if since else ""
    head = (
        f"flightrec verdict: request {number} ({what}, {answered} of {world_size} ranks "
        f"answered): the verdict of request {before.round} stands: {before.kind}: "
    )
    room = MAX_LINE - len(head) - len(tail)
    summary = before.summary
    if len(summary) > room:
        summary = summary[: max(room - 1, 0)] + "…"
    line = f"{head}{summary}{tail}"
    return (line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…") + "\n"
