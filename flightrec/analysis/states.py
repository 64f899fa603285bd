"""Where every rank was at dump time, in one line each, for grouping ranks by what they do."""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.analysis.facts.deaths import died_of, process_ended
from flightrec.analysis.facts.places import attached_line, stack_place
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import FrameInfo, Status, op_label, user_frame
from flightrec.analysis.waitgraph.transfers import stuck_transfer
from flightrec.analysis.waitgraph.waits import Wait
from flightrec.format.ending import is_gone
from flightrec.readers.blackbox import died


@dataclass(frozen=True, slots=True)
class RankState:
    """One rank's situation at dump time."""

    rank: int
    status: Status
    op: str | None = None
    group: str | None = None
    seq: int | None = None
    location: FrameInfo | None = None
    how: str = ""
    """For an exited rank: "died of ValueError", "returned from main", or "" when unknown; for
    a waiting rank whose process ended since (a later dump, a black box): "died" or "died of
    RuntimeError"."""

    def describe(self) -> str:
        """``wait in all_reduce #7 on group 0 at train.py:22`` (no rank: used to group ranks)."""
        at = f" in {self.location.function} at {self.location.where()}" if self.location else ""
        if self.status is Status.WAITING:
            # No group or seq here: ranks blocked at the same line group together however many
            # groups they are spread over (the progress table has the numbers).
            where = f" at {self.location.where()}" if self.location else f" on group {self.group}"
            if self.how:  # its process ended since: it waits no more
                return f"waited in {self.op}{where}, then {self.how}"
            return f"wait in {self.op}{where}"
        if self.status is Status.EXITED:
            if self.how.startswith("died"):  # "died of ValueError in compute_loss at ..."
                return self.how + at
            if self.how:
                return f"exited ({self.how})"
            return "exited" + (f" (last{at})" if at else "")
        if self.status is Status.NO_DUMP:
            return self.how or "left no dump"
        return ("are" + at) if at else "are outside any collective"


def rank_states(m: Matched, waits: list[Wait]) -> dict[int, RankState]:
    """Every rank's state, the newest blocking operation for a waiting rank.

    Args:
        m: the lined-up histories.
        waits: the blocked entries from the wait-for graph.

    Returns:
        One state per rank of the world (but the ranks in ``run.seen``, not analysed here).
    """
    newest: dict[int, Wait] = {}
    for w in waits:
        if w.rank not in newest or w.position > newest[w.rank].position:
            newest[w.rank] = w
    states: dict[int, RankState] = {}
    for rank in range(m.run.world_size):
        d = m.run.dumps.get(rank)
        if d is None and rank in m.run.seen:
            continue  # not analysed here: where it is was said from its progress
        if d is None:
            how = "exited cleanly, no dump" if rank in m.run.exited else ""
            states[rank] = RankState(rank, Status.NO_DUMP, how=how)
            continue
        blocked = newest.get(rank)
        if blocked is not None:
            rec = d.record(blocked.position)
            number = rec.p2p_seq if rec.is_p2p else rec.seq
            gone = ""
            if process_ended(m, rank):
                x = died_of(m, rank)
                gone = f"died of {x.type}" if x is not None else "died"
            states[rank] = RankState(
                rank,
                Status.WAITING,
                op_label(rec.op, rec.flags),
                rec.group,
                number,
                user_frame(rec.stack) or attached_line(d),
                how=gone,
            )
            continue
        exited = is_gone(d.header)
        transfer = None if exited else stuck_transfer(m, rank)
        if transfer is not None:  # both ends entered: no wait edge, but it waits all the same
            rec = transfer.mine
            states[rank] = RankState(
                rank, Status.WAITING, op_label(rec.op, rec.flags), rec.group, rec.p2p_seq,
                user_frame(rec.stack),
            )  # fmt: skip
            continue
        place = stack_place(d)
        if place is not None and place.collective is not None:  # a snapshot from outside
            states[rank] = RankState(
                rank, Status.WAITING, place.collective, location=place.location
            )
            continue
        status = Status.EXITED if exited else Status.OUTSIDE
        stack = d.current_stack()
        location, how = user_frame(stack), ""
        x = died_of(m, rank) if exited else None
        if x is not None:  # at exit, where the training code was: the raising frame
            location, how = x.location, f"died of {x.type}"
        elif exited and not stack and d.dump.threads:
            how = "returned from main"
        elif died(d.header):  # a black box: no Python ran at the end
            how = "died without running any exit code"
        states[rank] = RankState(rank, status, location=location, how=how)
    return states
