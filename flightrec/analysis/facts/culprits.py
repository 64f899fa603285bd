"""Culprits at the end of a wait chain: where each was at dump time (``doing``,
``whereabouts``), what it owed to whom (``chain_end``), and the fields every finding about
such culprits shares (``ChainEnd.blame``), whatever its kind: ``not_arrived`` and
``missing_dump`` (``findings.not_arrived``), ``dead_rank`` (``findings.crashes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import (
    Consequence,
    Evidence,
    FrameInfo,
    Status,
    user_frame,
)
from flightrec.analysis.waitgraph.routine import Departure
from flightrec.analysis.waitgraph.transfers import (
    COUNTERPART,
    stuck_pair,
    stuck_transfer,
    transfer_pair_phrase,
    transfer_phrase,
)
from flightrec.analysis.waitgraph.waits import Node
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.ending import is_gone
from flightrec.readers.blackbox import died, ended
from flightrec.text import compress, ranks_phrase


@dataclass(frozen=True, slots=True)
class LastCall:
    """A culprit's last completed (or, without completion tracking, issued) call."""

    op: str
    process_group: str
    seq: int
    location: FrameInfo | None
    """The user code that issued it; None when its stack has none."""
    seconds_before_dump: float


@dataclass(frozen=True, slots=True)
class CulpritEvidence:
    """Where one culprit with a dump was, from its dump."""

    host: str
    pid: int
    device: str
    dump: str
    """The dump file it was read from."""
    dump_reason: str
    """``HANG_DETECTED``, ``PROCESS_EXIT``, ``BLACKBOX``...: why (or how) the dump was taken."""
    stack: tuple[FrameInfo, ...]
    """Where it was at dump time, innermost frame first."""
    reason_detail: str = ""
    location: FrameInfo | None = None
    """The innermost user frame of ``stack``."""
    last_completed: LastCall | None = None
    """Its last completed call, where its dump tracks completion."""
    last_issued: LastCall | None = None
    """Its last issued call, where its dump does not track completion."""


@dataclass(frozen=True, slots=True)
class RankEvidence(Evidence):
    """Evidence of ``not_arrived``, ``dead_rank`` and ``missing_dump`` findings."""

    waiting_ranks: tuple[int, ...]
    """Every rank whose wait leads to the culprits."""
    waited_s: float | None = None
    """The longest of those waits; None when nobody waits."""
    culprits: Mapping[int, CulpritEvidence] | None = None
    """Per culprit with a dump, where it was (None for ``missing_dump``)."""
    routine: Mapping[int, Departure] | None = None
    """Per culprit, the call that left its routine, where that closed a wait cycle."""
    cycle: tuple[Node, ...] | None = None
    """The wait cycle that departure closed (rank and operation nodes, in order)."""
    cycle_summary: str | None = None
    """The cycle in words."""


def culprit_state(m: Matched, rank: int) -> Status:
    """Why nothing else explains this rank: alive elsewhere, exited, or no dump."""
    d = m.run.dumps.get(rank)
    if d is None:
        return Status.NO_DUMP
    if is_gone(d.header):
        return Status.EXITED
    return Status.OUTSIDE


def doing(m: Matched, rank: int) -> tuple[str, CulpritEvidence]:
    """One phrase saying where ``rank`` was at dump time, and the evidence behind it."""
    d = m.dump(rank)
    last = m.last_completed_entry(rank)
    stack = d.current_stack()
    # An exit dump whose main thread has no frame left: the program had returned from main.
    returned = not stack and bool(d.dump.threads) and d.header.reason == pb.PROCESS_EXIT
    # A dump without thread stacks (a native one) shows no place the rank is now; its last
    # call's stack says where that call was made, and the verdict says no more than that.
    frame = user_frame(stack)
    last_call = None
    if last is not None:
        last_call = LastCall(
            op=last.op,
            process_group=last.group,
            seq=last.seq,
            location=user_frame(last.stack),
            seconds_before_dump=round(d.age_s(last.complete_ns), 3),
        )
    evidence = CulpritEvidence(
        host=d.header.hostname,
        pid=d.header.pid,
        device=d.header.device,
        dump=d.path,
        dump_reason=pb.DumpReason.Name(d.header.reason),
        stack=tuple(stack),
        reason_detail=d.header.reason_detail,
        location=frame or (user_frame(last.stack) if last is not None and not returned else None),
        last_completed=last_call if d.tracks_completion else None,
        last_issued=None if d.tracks_completion else last_call,
    )
    if d.header.reason == pb.BLACKBOX and last is not None:
        # Read back from its black box: no stacks at death, only its last recorded calls.
        lf = user_frame(last.stack)
        at = f"; its last call was at {lf.where()}" if lf else ""
        if ended(d.header):
            verb = "died" if died(d.header) else "exited"
            phrase = f"it {verb} after completing {last.call}{at}"
        else:  # alive but it never dumped: its ring, read from the file, is all there is
            phrase = f"it wrote no dump; its black box shows {last.call} done{at}"
    elif returned:
        phrase = "it had returned from main" + (f" after {last.call}" if last else "")
    elif (transfer := stuck_transfer(m, rank)) is not None:
        phrase = f"it {transfer_phrase(transfer)}"
    elif frame is not None:
        phrase = f"it was in {frame.function} at {frame.where()}"
    elif last is not None:
        # Where the last call was made, never "it was in": the rank may have left that line.
        lf = user_frame(last.stack)
        at = f" at {lf.where()}" if lf else ""
        word = "completed call" if d.tracks_completion else "call"
        phrase = f"its last {word} was {last.call} on group {last.group}{at}"
    else:
        phrase = "it recorded no completed call"
    return phrase, evidence


class ChainEnd(NamedTuple):
    """Culprits at the end of a wait chain and the waits that lead to them: what a finding
    about them says besides its verdict, whatever its kind (``not_arrived`` and
    ``missing_dump`` here, ``dead_rank`` in ``crashes``)."""

    ranks: tuple[int, ...]
    who: str
    """``Rank 2``, ``Ranks 2 and 3``: how the verdict starts."""
    what: str
    """The operation they owe, in words; empty when nobody waits."""
    primary: Consequence | None
    """The operation their peers wait in most directly; None when nobody waits."""
    consequences: tuple[Consequence, ...]
    """Every wait that leads to them, the most direct first."""
    waiting: tuple[int, ...]
    waited_s: float | None

    @property
    def process_group(self) -> str | None:
        return self.primary.process_group if self.primary else None

    @property
    def pg_ranks(self) -> tuple[int, ...]:
        return self.primary.pg_ranks if self.primary else ()

    @property
    def seq(self) -> int | None:
        return self.primary.seq if self.primary else None

    @property
    def op(self) -> str | None:
        return self.primary.op if self.primary else None

    def evidence(self, culprits: Mapping[int, CulpritEvidence] | None) -> RankEvidence:
        """The finding's evidence, with ``culprits`` (None where they left no dump)."""
        return RankEvidence(self.waiting, self.waited_s, culprits)

    def blame(self, culprits: Mapping[int, CulpritEvidence] | None) -> Blame:
        """What a finding about these culprits says besides its kind and verdict, with
        ``culprits`` (None where they left no dump): ``Finding(kind=..., summary=...,
        **end.blame(culprits))``."""
        return Blame(
            ranks=self.ranks,
            process_group=self.process_group,
            pg_ranks=self.pg_ranks,
            seq=self.seq,
            op=self.op,
            consequences=self.consequences,
            evidence=self.evidence(culprits),
        )


class Blame(TypedDict):
    """The fields of a finding about culprits at the end of a wait chain (``ChainEnd.blame``)."""

    ranks: tuple[int, ...]
    process_group: str | None
    pg_ranks: tuple[int, ...]
    seq: int | None
    op: str | None
    consequences: tuple[Consequence, ...]
    evidence: RankEvidence


def chain_end(
    ranks: Sequence[int], primary: Consequence | None, consequences: Sequence[Consequence]
) -> ChainEnd:
    """What culprit ``ranks`` that share one primary wait owe, and to whom.

    Args:
        ranks: the culprits (global ranks).
        primary: the operation their peers wait in most directly; None when nobody waits.
        consequences: every wait that leads to them.

    Returns:
        The facts a finding about them is made of.
    """
    ranks = tuple(sorted(ranks))
    # The most direct wait first, then the longest-standing ones.
    consequences = sorted(
        consequences, key=lambda c: (c != primary, -c.waited_s, c.process_group, c.seq)
    )
    who = ranks_phrase(ranks)
    who = who[0].upper() + who[1:]
    waiting = sorted({r for c in consequences for r in c.waiting})
    what = ""
    if primary is not None and primary.op in COUNTERPART and primary.waiting:
        # A P2P wait: the culprit owes the other side of it, not the same operation.
        what = (
            f"the {COUNTERPART[primary.op]} matching {ranks_phrase(primary.waiting)}'s "
            f"{primary.op} #{primary.seq} on group {primary.process_group}"
        )
    elif primary is not None:
        what = (
            f"{primary.label or primary.op} #{primary.seq} on group {primary.process_group} "
            f"[ranks {compress(primary.pg_ranks)}]"
        )
    waited_s = round(max(c.waited_s for c in consequences), 3) if primary is not None else None
    return ChainEnd(ranks, who, what, primary, tuple(consequences), tuple(waiting), waited_s)


class Whereabouts(NamedTuple):
    """Where culprits with a dump were at dump time (``whereabouts``)."""

    named: str
    """``Rank 2 (host, pid ...)``: the culprits, and where there is one, its identity."""
    phrases: list[str]
    """Per culprit (or pair of culprits in the two ends of one transfer), where it was."""
    culprits: dict[int, CulpritEvidence]

    def verdict(self, did: str, end: ChainEnd) -> str:
        """``Rank 2 (host, pid ...) never entered all_reduce #5 ...; it was in ...``."""
        return f"{self.named} {did} {end.what or 'the operation its peers wait in'}; " + "; ".join(
            self.phrases
        )


def named(m: Matched, ranks: Sequence[int]) -> str:
    """``Rank 2 (host, pid ...)``, ``Ranks 2 and 3``: culprits as a verdict starts with them,
    a single one with its identity."""
    who = ranks_phrase(ranks)
    ident = f" ({m.dump(ranks[0]).describe()})" if len(ranks) == 1 else ""
    return f"{who[0].upper()}{who[1:]}{ident}"


def whereabouts(m: Matched, end: ChainEnd) -> Whereabouts:
    """Where each culprit of ``end`` was, in words and as evidence (each has a dump)."""
    ranks = end.ranks
    phrases: list[str] = []
    culprits: dict[int, CulpritEvidence] = {}
    transfers = {r: stuck_transfer(m, r) for r in ranks} if len(ranks) > 1 else {}
    told: set[int] = set()  # ranks already named as the other end of a transfer
    for r in ranks:
        phrase, ev = doing(m, r)
        culprits[r] = ev
        if r in told:
            continue
        pair = stuck_pair(r, transfers)
        if pair is not None:
            told.add(pair)
            a, b = transfers[r], transfers[pair]
            assert a is not None and b is not None
            phrases.append(transfer_pair_phrase(a, b))
        elif len(ranks) == 1:
            phrases.append(phrase)
        else:
            phrases.append(f"rank {r}: {phrase.removeprefix('it ')}")
    return Whereabouts(named(m, ranks), phrases, culprits)
