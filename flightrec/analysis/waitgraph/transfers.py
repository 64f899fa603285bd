"""Blocking sends and receives that both ends entered and neither completed.

Such a rank is in no wait the graph can explain (both ends are present, neither is done: tags
that differ, or a transport that failed); where it is, is its own call. The culprit findings
say so (``not_arrived.whereabouts``), and so does every rank's state (``states``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import CollectiveRecord, user_frame
from flightrec.format import flightrec_pb2 as pb

COUNTERPART = {"send": "recv", "recv": "send", "isend": "irecv", "irecv": "isend"}
"""The operation a P2P peer owes to a rank blocked in the key."""


_PENDING = (pb.ENQUEUED, pb.STARTED)
_LOOK_BACK = 64
"""Entries of the peer's ring searched for the other end of a transfer."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """A blocking send or receive a rank sits in, and the other end where the peer entered it."""

    mine: CollectiveRecord
    theirs: CollectiveRecord | None


def stuck_transfer(m: Matched, rank: int) -> Transfer | None:
    """The blocking ``send``/``recv`` that is ``rank``'s newest entry and has not completed.

    Such a rank is in no wait the graph can explain when its peer entered the other end too
    (both ends present, neither done: tags that differ, or a transport that failed); its own
    call is still where it is. Asynchronous ``isend``/``irecv`` are left out: a rank that
    posted one goes on with its work, and where it is is its stack.
    """
    d = m.run.dumps.get(rank)
    if d is None or not len(d) or not d.tracks_completion:
        return None
    mine = d.record(len(d) - 1)
    if not mine.is_p2p or mine.flags & pb.ASYNC_OP or mine.state not in _PENDING:
        return None
    pd = m.run.dumps.get(mine.peer)
    theirs = None
    want = COUNTERPART.get(mine.op)
    if pd is not None and want is not None:
        for i in range(len(pd) - 1, max(-1, len(pd) - 1 - _LOOK_BACK), -1):
            rec = pd.record(i)
            if (rec.is_p2p and rec.op.lstrip("i") == want and rec.peer == rank
                    and rec.group == mine.group and rec.p2p_seq == mine.p2p_seq):  # fmt: skip
                theirs = rec
                break
    return Transfer(mine, theirs)


def transfer_phrase(t: Transfer) -> str:
    """``waits in send #1 to rank 1 at train.py:21, whose recv ... entered too: ...``."""
    mine = t.mine
    word = "to" if "send" in mine.op else "from"
    frame = user_frame(mine.stack)
    at = f" at {frame.where()}" if frame else ""
    phrase = f"waits in {mine.op} #{mine.p2p_seq} {word} rank {mine.peer}{at}"
    theirs = t.theirs
    if theirs is not None and theirs.state in _PENDING:
        f2 = user_frame(theirs.stack)
        at2 = f" at {f2.where()}" if f2 else ""
        phrase += (
            f", and rank {mine.peer} waits in the other end ({theirs.op} #{theirs.p2p_seq}"
            f"{at2}): both entered the transfer and neither completed (a tag that differs, "
            "or a transport that failed)"
        )
    return phrase


def stuck_pair(rank: int, transfers: Mapping[int, Transfer | None]) -> int | None:
    """The other culprit sitting in the other end of ``rank``'s stuck transfer, if any
    (``transfers``: ``stuck_transfer`` of every culprit)."""
    t = transfers.get(rank)
    if t is None or t.theirs is None or t.theirs.state not in _PENDING:
        return None
    other = transfers.get(t.mine.peer)
    return t.mine.peer if other is not None and other.mine.peer == rank else None


def transfer_pair_phrase(a: Transfer, b: Transfer) -> str:
    """Two culprits stuck in the two ends of one transfer, said once."""

    def end(t: Transfer) -> str:
        frame = user_frame(t.mine.stack)
        word = "to" if "send" in t.mine.op else "from"
        at = f" at {frame.where()}" if frame else ""
        return f"rank {t.mine.rank} in {t.mine.op} #{t.mine.p2p_seq} {word} rank {t.mine.peer}{at}"

    return (
        f"they wait in the two ends of one transfer, {end(a)} and {end(b)}: both entered it and "
        "neither completed (a tag that differs, or a transport that failed)"
    )
