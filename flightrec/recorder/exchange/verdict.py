"""The recorder's half of the verdict in the job's log: publish summaries, pick one reporter.

When a hang is declared (or SIGTERM arrives), every rank answers one dump request ``n``: it
dumps, then publishes the summary of that dump (``flightrec.format.summary``) through the
job's store and offers to report. The lowest rank that answered reports: rank 0, or the
lowest live rank when rank 0 cannot answer. The reporting itself (gathering, analysing,
printing) is not the recorder's business: it is a callback handed in at enable time
(``flightrec.live``), run here on a flightrec thread with a ``Round`` to work from.

Keys (``keys.Keys``, under ``flightrec/<namespace>/``):

- ``summary/<rank>``: the rank's latest summary (at most ``summary.MAX_BYTES``, 3 KiB;
  typically 1.8 KB), overwritten by the next, so the store never holds more than one per rank
  (at most 384 MiB at 131,072 ranks);
- ``round/<n>/progress``: each rank's progress record for request ``n`` (at most
  ``progress.MAX_BYTES``, 1 KiB; typically about 90 bytes) appended, framed (``frame``): the
  reporter reads every rank's in one ``get`` (12 MB at 131,072 ranks);
- ``round/<n>/ranks``: ``"<rank>,"`` appended by each rank that published for request ``n``
  (what the reporter polls while it waits: it counts the commas, 0.9 MB at 131,072 ranks
  where the records would be 12 MB);
- ``round/<n>/reporter``: the lowest rank that offered to report (a ``compare_set`` loop);
  ``"<rank>!"`` once that rank has gathered and prints the round's verdict (``Round.close``):
  a rank that answers later, lower or not, reports nothing, and the round gets one verdict.
  Only ranks that may report offer: the first ``CLAIMANTS`` ranks, and the rank that posted
  the request (alive when it posted, whatever its rank: a round always has one);
- ``died/<restart>``: ``"<rank>,"`` appended by each rank whose main thread died of an
  exception, after publishing its summary on the way out (``<restart>``: torchrun's restart
  count, so a crash of an earlier attempt is never read as this one's). A dead rank answers
  no later round; the reporter reads its summary (and where it stood, from it), and the
  verdict names the crash.
- ``left/<restart>``: ``"<rank>,"`` appended by each rank that ends cleanly (destroys its
  default group, or exits): one short store call. A rank whose data ran out early and whose
  loop ended is then named as having exited, not as a process killed hard.

A rank's answer is three requests that get no answer (summary, record, list), sent in one
write where the store speaks our protocol (``wire``: the server reads them with one system
call), plus, from the ranks that may report, the claim in the same write (one answer).

Nothing here blocks the job: store calls run on flightrec's threads, on a connection of the
exchange's own, and any failure costs one warning for the whole process.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flightrec.errors import first_line
from flightrec.format.progress import MAX_BYTES as MAX_PROGRESS_BYTES
from flightrec.format.progress import encode_progress, progress
from flightrec.format.slot import ENQUEUED, STARTED
from flightrec.format.summary import MAX_BYTES, encode, summarize
from flightrec.recorder.exchange.keys import Keys, restart_count
from flightrec.recorder.exchange.store import CONNECT_TIMEOUT_S, RANK_DIED, ROUND_REASONS
from flightrec.recorder.exchange.wire import WireStore, encode_append, encode_set

if TYPE_CHECKING:
    from flightrec.format import flightrec_pb2 as pb
    from flightrec.recorder.exchange.slowcheck import Judge
    from flightrec.recorder.exchange.store import Poller
    from flightrec.recorder.hotpath.ring import Ring

log = logging.getLogger("flightrec")
GATHER_S = 3.0
"""How long the reporter waits for the other ranks' summaries (less when all have answered):
with the watchdog's tick and the dumps, the verdict is out within FLIGHTREC_TIMEOUT + 5 s."""
REUSE_S = 30.0
"""A SIGTERM this soon after a round this rank took part in joins that round instead of a new
one: torchrun stopping a job whose hang was just reported, or the other ranks' SIGTERM round,
whose request reached this rank's request thread just before its own SIGTERM did."""
MAX_CLAIM_TRIES = 16
CLAIMANTS = 64
"""Ranks below this offer to report every round they answer (the lowest that answers
reports: rank 0 when it can); the others only a round they posted. At 131,072 ranks, a claim
from every rank was 131,072 answers the store's server wrote for nothing."""
CLOSED = "!"
"""Appended to the reporter's rank once it prints: the round takes no further reporter."""
EXIT_CONNECT_S = 2.0
"""Longest the exit path waits to open this exchange's connection (``after_exit``)."""
LOOK_EVERY_NS = 1_000_000_000
"""How often ``tick`` looks for an operation pending long enough to load the reporter."""


def _holder(raw: bytes) -> tuple[int | None, bool]:
    """(the rank a reporter key names, whether the round is closed) (None: no rank)."""
    closed = raw.endswith(CLOSED.encode())
    digits = raw[:-1] if closed else raw
    return (int(digits) if digits.isdigit() and len(digits) < 9 else None), closed


_FRAME = struct.Struct("<IH")
"""A framed progress record's head: the rank, the record's length."""


def frame(rank: int, record: bytes) -> bytes:
    """A progress record as appended to ``round/<n>/progress``."""
    return _FRAME.pack(rank, len(record)) + record


def unframe(raw: bytes, world_size: int, start: int = 0) -> tuple[dict[int, bytes], str]:
    """The records of ``round/<n>/progress`` from byte ``start`` on, by rank (the last one of a
    rank wins), and why reading stopped early ("" when it did not): the value is untrusted,
    and a frame out of range ends it."""
    out: dict[int, bytes] = {}
    view = memoryview(raw)
    at, size, head = start, len(raw), _FRAME.size
    while at < size:
        if size - at < head:
            return out, f"a cut record at byte {at}"
        rank, length = _FRAME.unpack_from(view, at)
        at += head
        if rank >= world_size or length > MAX_PROGRESS_BYTES or at + length > size:
            return out, f"a record of rank {rank} and {length} bytes at byte {at - head}"
        out[rank] = bytes(view[at : at + length])
        at += length
    return out, ""


Quiet = tuple[str, str, bytes]
"""A store call that gets no answer: (``"set"`` or ``"append"``, key, value)."""
_ENCODE = {"set": encode_set, "append": encode_append}


def encoded(requests: list[Quiet]) -> list[bytes]:
    """``requests`` as they go on the wire (``wire.encode_set``, ``wire.encode_append``)."""
    return [_ENCODE[call](key, value) for call, key, value in requests]


def send(store: Any, requests: list[Quiet]) -> None:
    """``requests``: in one write on our own connection (``wire``); on any other store
    (torch's client, a ``FileStore``), one call each."""
    if isinstance(store, WireStore):
        store.send(encoded(requests))
        return
    for call, key, value in requests:
        getattr(store, call)(key, value)


def answer_requests(
    keys: Keys, rank: int, n: int, summary: bytes, record: bytes | None
) -> list[Quiet]:
    """What rank ``rank`` writes to answer round ``n``, in order: its summary, then (the first
    time it answers the round: ``record`` is not None) its framed progress record and its
    place in the round's list. The summary first: a rank listed as having answered has its
    summary and record in the store (a server that reads the write in pieces acts on the
    requests in their order)."""
    requests: list[Quiet] = [("set", keys.summary(rank), summary)]
    if record is not None:
        requests += [
            ("append", keys.round(n, "progress"), frame(rank, record)),
            ("append", keys.round(n, "ranks"), f"{rank},".encode()),
        ]
    return requests


def may_claim(rank: int, posted: bool) -> bool:
    """Whether a rank offers to report a round: one of the first ``CLAIMANTS``, or the rank
    that posted the round's request."""
    return rank < CLAIMANTS or posted


def claim(store: Any, key: str, rank: int, first: list[Quiet]) -> int:
    """Send ``first`` (requests that get no answer) and make ``key`` hold the lowest rank that
    offered, in the same write where the store is ours; returns the holder (-1: none known)."""
    if isinstance(store, WireStore):
        current = bytes(store.compare_set(key, "", str(rank), first=encoded(first)))
    else:
        send(store, first)
        current = bytes(store.compare_set(key, "", str(rank)))
    for _ in range(MAX_CLAIM_TRIES):
        holder, closed = _holder(current)
        if closed:  # the round's verdict is out: this late answer starts no second one
            return -1 if holder is None else holder
        if holder is not None and holder <= rank:
            return holder
        current = bytes(store.compare_set(key, current, str(rank)))
    return -1


def _ranks_in(raw: bytes, world_size: int) -> list[int]:
    """The ranks of a ``"<rank>,"`` list (in range, each once, sorted)."""
    ranks = {int(t) for t in raw[: 10 * world_size + 16].split(b",") if t.isdigit() and len(t) < 9}
    return sorted(r for r in ranks if r < world_size)


@dataclass(frozen=True, slots=True)
class Round:
    """One exchange, as the reporter sees it.

    Attributes:
        number: the dump request every answering rank names.
        reason: why it was posted (``WATCHDOG_TIMEOUT``, ``SIGNAL_TERM``, ``RANK_DIED``).
        rank: this process's rank, the reporter while ``reporter()`` says so.
        world_size: ranks expected to answer.
        namespace: the job's key namespace.
        deadline: monotonic time by which gathering must end.
        store: a connection of the reporter's own, for the keys above.
        restart: torchrun's restart count of this attempt (``Keys.died``).
    """

    number: int
    reason: str
    rank: int
    world_size: int
    namespace: str
    deadline: float
    store: Any
    restart: str = "0"
    blackbox_dir: str = ""
    """The reporter's FLIGHTREC_DIR where it keeps a black box: the rings of ranks on its host
    that answer nothing (aborted inside the backend) are read from there ("": none)."""

    @property
    def keys(self) -> Keys:
        """The job's store keys."""
        return Keys(self.namespace)

    def reporter(self) -> int:
        """The lowest rank that answered so far (-1 when the key is unreadable)."""
        key = self.keys.round(self.number, "reporter")
        holder, _ = _holder(bytes(self.store.get(key)))
        return -1 if holder is None else holder

    def close(self) -> bool:
        """Whether this rank still reports, and if so, close the round to later reporters
        (one ``compare_set``). Called once gathering ends, just before the verdict is made:
        a rank answering after that (it was busy, or slow to connect) would otherwise start
        a report of its own and print the round's verdict a second time, seconds later.
        False when a lower rank answered meanwhile: it reports instead."""
        mine = str(self.rank)
        key = self.keys.round(self.number, "reporter")
        return bytes(self.store.compare_set(key, mine, mine + CLOSED)) == (mine + CLOSED).encode()

    def answered(self) -> list[int]:
        """Ranks that published for this round (in range, each once, sorted)."""
        key = self.keys.round(self.number, "ranks")
        if not self.store.check([key]):
            return []
        return _ranks_in(bytes(self.store.get(key)), self.world_size)

    def answered_count(self) -> int:
        """How many answers were published for this round so far (one read, no parsing: what
        the reporter polls; a rank listed twice counts twice)."""
        key = self.keys.round(self.number, "ranks")
        return bytes(self.store.get(key)).count(b",") if self.store.check([key]) else 0

    def died(self) -> list[int]:
        """Ranks of this attempt that died of an exception and published on the way out."""
        return self._listed(self.keys.died(self.restart))

    def left(self) -> list[int]:
        """Ranks of this attempt that ended cleanly (destroyed their group, or exited)."""
        return self._listed(self.keys.left(self.restart))

    def _listed(self, key: str) -> list[int]:
        if not self.store.check([key]):
            return []
        return _ranks_in(bytes(self.store.get(key)), self.world_size)

    def summaries(self, ranks: list[int]) -> dict[int, bytes]:
        """The published summaries of ``ranks`` (which all answered), as raw bytes."""
        return self._gather(self.keys.summary, ranks)

    def progress(
        self, ranks: list[int], listing: Listing | None = None
    ) -> tuple[dict[int, bytes], str]:
        """The progress records of ``ranks`` in the round's list, as raw bytes (one read):
        what the reporter reads from every rank before it reads any summary. A rank not in
        it (one that died answering an earlier round; the ranks after a damaged record) has
        its summary to tell where it stood. Also returns why the list could not be read to its
        end ("" when it could). ``listing``: the list as read so far (only what was appended
        since is unframed)."""
        listing = listing or Listing(self)
        listing.read()
        wanted = set(ranks)
        return {r: data for r, data in listing.records.items() if r in wanted}, listing.why

    def _gather(self, key: Callable[[int], str], ranks: list[int]) -> dict[int, bytes]:
        """One value per rank, in store calls of 4,096 keys (a rank whose key is absent,
        listed by someone else, is left out: ``get`` would block on it)."""
        out: dict[int, bytes] = {}
        for i in range(0, len(ranks), 4096):
            chunk = ranks[i : i + 4096]
            keys = [key(r) for r in chunk]
            if not self.store.check(keys):
                chunk = [r for r, k in zip(chunk, keys, strict=True) if self.store.check([k])]
                keys = [key(r) for r in chunk]
            values = self.store.multi_get(keys)
            out.update(zip(chunk, (bytes(v) for v in values), strict=True))
        return out


class Listing:
    """The round's progress records as they arrive (``round/<n>/progress``). Ranks only
    append to it, so each read unframes only what came since the one before (at 131,072
    ranks the list is 12 MB, and the reporter reads it while the ranks answer as well as
    once they have); a value that does not start with what was read before (rewritten by
    something else) is read from its start."""

    def __init__(self, rnd: Round) -> None:
        self._rnd = rnd
        self._raw = b""
        self.records: dict[int, bytes] = {}
        """Rank -> its record (raw bytes), as read so far."""
        self.why = ""
        """Why the list could not be read to its end ("": it could)."""

    def read(self) -> dict[int, bytes]:
        """Read the list again; returns the records that are new since the last read."""
        rnd = self._rnd
        key = rnd.keys.round(rnd.number, "progress")
        raw = bytes(rnd.store.get(key)) if rnd.store.check([key]) else b""
        start = len(self._raw)
        if self.why or not raw.startswith(self._raw):
            start, self.records, self.why = 0, {}, ""
        new, self.why = unframe(raw, rnd.world_size, start)
        self._raw = raw
        self.records.update(new)
        return new


class Reporter(Protocol):
    """What prints the verdict into the job's log (``flightrec.live.REPORTER``, handed in by
    ``flightrec.enable``); none of its methods may raise."""

    def __call__(self, rnd: Round) -> None:
        """Gather round ``rnd``'s answers, analyse them and print the verdict."""

    def prepare(self) -> None:
        """Load what reporting needs, on a thread of its own, once an operation has been
        pending for half the timeout (the analysis takes seconds to import on a busy machine:
        not after the hang is declared)."""

    def slow_judge(self) -> Judge:
        """What judges the slow check's digests on the reporting rank (docs/slow-ranks.md)."""


class Exchange:
    """This process's part in every round."""

    def __init__(
        self,
        poller: Poller,
        rank: int,
        world_size: int,
        namespace: str,
        reporter: Reporter,
        blackbox_dir: str = "",
    ) -> None:
        self._poller = poller
        self.rank = rank
        self.world_size = world_size
        self.namespace = namespace
        self.keys = Keys(namespace)
        self._reporter = reporter
        self._lock = threading.Lock()  # one exchange at a time, on the one connection
        self._publishing = threading.Lock()
        """Held from taking the latest dump to starting the report: the signal thread and the
        request thread may both answer one round, and whichever finds the dump taken waits
        until the other has published it (and started the report, if this rank reports)."""
        self._store: Any = None
        self._latest: tuple[pb.Dump, Path | None] | None = None
        self._last: tuple[pb.Dump, Path | None] | None = None
        """The dump published last (``rejoin`` answers another round with it)."""
        self._answered: dict[int, float] = {}
        """Rounds this process published into -> monotonic time."""
        self._reasons: dict[int, str] = {}
        self._reported: set[int] = set()
        """Rounds this process started reporting (once each)."""
        self._reporting: threading.Thread | None = None
        self._warned = False
        self._lost = False
        """A store operation failed: the store is gone (its host exited or was killed). Exit
        and death then skip theirs, each of which would wait out the connect timeout."""
        self._prepared = False
        self._next_look_ns = 0
        self.restart = restart_count()
        self.blackbox_dir = blackbox_dir
        """Where this process's black box lives ("": none); told to the verdict (``Round``)."""
        self._left = False

    def on_dump(self, dump: pb.Dump, path: Path | None) -> None:
        """The dumper's hook: remember the dump just built (written to ``path``, or not)."""
        self._latest = (dump, path)

    def after_hang(self, n: int) -> None:
        """This rank declared the hang; request ``n`` stands for it (posted here or not)."""
        self._answer(n, "WATCHDOG_TIMEOUT", wait=False)

    def after_request(self, n: int, reason: str) -> None:
        """This rank dumped for request ``n``, posted for ``reason``."""
        if reason in ROUND_REASONS:
            self._answer(n, reason, wait=False)

    def rejoin(self, n: int, reason: str) -> None:
        """Another rank's request ``n`` is for the hang this rank declared moments ago (its
        dump stands for both): answer round ``n`` with that dump's summary. Left out, the
        round's verdict would blame this live rank for leaving no dump."""
        with self._publishing:
            if self._latest is None:
                self._latest = self._last
        self._answer(n, reason, wait=False)

    def after_term(self) -> None:
        """SIGTERM was dumped: answer (or start) a round and, if reporting, finish the report
        before returning (the process ends right after).

        Under torchrun every surviving rank gets SIGTERM at once, and the first to post asks
        the others to dump: a rank's request thread may have taken that request a moment
        before its own SIGTERM came. Then the SIGTERM joins that round; starting a second one
        would split the ranks' answers between two rounds and leave each report short.
        """
        poller = self._poller
        n, reason, at_ns = poller.latest
        if n and time.monotonic_ns() - at_ns < REUSE_S * 1e9 and reason in (*ROUND_REASONS, ""):
            self._answer(n, reason or "SIGNAL_TERM", wait=True)
            return
        try:
            _, n = poller.start_round(self.rank, "SIGNAL_TERM", poller.seen)
        except Exception as exc:
            self._warn(exc)
            return
        self._answer(n, "SIGNAL_TERM", wait=True)

    def after_death(self) -> None:
        """This process is dying of an exception and just dumped: list this rank as dead
        (rounds it can no longer answer read its summary from there), and start a round, or
        join the one under way, so that a verdict is printed even when no rank survives to be
        stopped by SIGTERM (gloo fails every peer of a dead rank at once). If this rank is the
        reporter, the report finishes before the process ends.

        A process that already answered a round (a hang was reported) starts none: dying of
        the collective timeout minutes after the hang's verdict, it would only repeat it. It
        still lists itself as dead, with its summary, for whoever reports next."""
        if self.store_gone:
            return
        poller = self._poller
        n, reason, at_ns = poller.latest
        if self._answered:
            n = max(self._answered)
            reason = self._reasons.get(n, RANK_DIED)
        elif not (n and time.monotonic_ns() - at_ns < REUSE_S * 1e9 and reason in ROUND_REASONS):
            try:
                _, n = poller.start_round(self.rank, RANK_DIED, poller.seen)
            except Exception as exc:
                self._warn(exc)
                return
            reason = RANK_DIED
        self._publish(n, reason or RANK_DIED)  # the summary first: it carries the exception
        if self.store_gone:
            return
        try:
            with self._lock:
                self._connection().append(self.keys.died(self.restart), f"{self.rank},")
        except Exception as exc:
            self._warn(exc)
        running = self._reporting
        if running is not None:  # this rank reports: before the process ends
            running.join(GATHER_S + 5.0)

    def after_exit(self) -> None:
        """This process ends cleanly (its default group is being destroyed, or it exits): say
        so, once, so that a hang among the ranks still running names it as exited. On the
        job's own exit path: a store whose host is gone costs ``EXIT_CONNECT_S`` at most."""
        if self._left or self.store_gone:
            return
        self._left = True
        try:
            with self._lock:
                store = self._connection(EXIT_CONNECT_S)
                store.append(self.keys.left(self.restart), f"{self.rank},")
        except Exception as exc:
            self._warn(exc)

    def close(self, wait_s: float) -> None:
        """At exit: let a report under way finish (a daemon thread inside a store call when
        the interpreter finalizes can abort the process), for at most ``wait_s``."""
        running = self._reporting
        if running is not None and running is not threading.current_thread():
            running.join(wait_s)

    def connect(self) -> None:
        """Open this exchange's store connection now rather than at the first answer (its
        set-up takes about 0.2 s, far longer on a loaded host, and every rank would pay it
        after the hang is declared). Never raises: a failure costs the one warning."""
        if self.store_gone:
            return
        try:
            with self._lock:
                self._connection()
        except Exception as exc:
            self._warn(exc)

    def tick(self, now_ns: int, ring: Ring, timeout_s: float) -> None:
        """From the watchdog's tick: once something is half-way to a hang, open the store
        connection and prepare the reporter (at most one look per second, at the first
        pending slots)."""
        if self._prepared or now_ns < self._next_look_ns:
            return
        self._next_look_ns = now_ns + LOOK_EVERY_NS
        for index in ring.pending_slots()[:64]:
            slot = ring.read(index)
            if slot.state in (ENQUEUED, STARTED) and now_ns - slot.enqueue_ns > timeout_s * 5e8:
                self._prepared = True
                prepare = threading.Thread(target=self._prepare, name="flightrec-prepare")
                prepare.daemon = True
                prepare.start()
                return

    def _prepare(self) -> None:
        self.connect()
        try:
            self._reporter.prepare()
        except Exception as exc:  # its own failure: the verdict itself may still come
            log.warning("flightrec: could not prepare the verdict: %s", exc)

    # -----------------------------------------------------------------------------------------
    def _answer(self, n: int, reason: str, wait: bool) -> None:
        # Through the host's relay only where this process lives on (not on its way out).
        self._publish(n, reason, relayed=not wait)
        running = self._reporting
        if wait and running is not None:
            # The process ends when this returns (SIGTERM): a report under way, started
            # here or by the request thread, finishes first.
            running.join(GATHER_S + 5.0)

    def _publish(self, n: int, reason: str, relayed: bool = False) -> None:
        """Answer round ``n`` with the latest dump; ``relayed``: where this process follows
        its host's relay and may not report, the answer goes through the relay."""
        if self.store_gone:
            return
        with self._publishing:
            self._reasons.setdefault(n, reason)
            latest, self._latest = self._latest, None
            if latest is None:
                return  # the dump could not be built, or another thread published it already
            self._last = latest
            dump, path = latest
            try:
                data = encode(summarize(dump, n, str(path) if path else ""))
                brief = None if n in self._answered else encode_progress(progress(dump, n))
                requests = answer_requests(self.keys, self.rank, n, data, brief)
                posted = n in getattr(self._poller, "posted", ())
                link = getattr(self._poller, "forwarder", None) if relayed else None
                with self._lock:
                    holder = -1
                    if may_claim(self.rank, posted):
                        key = self.keys.round(n, "reporter")
                        holder = claim(self._connection(), key, self.rank, requests)
                    elif link is None or not link.forward(encoded(requests)):
                        send(self._connection(), requests)
                    self._answered[n] = time.monotonic()
            except Exception as exc:
                self._warn(exc)
                return
            if holder == self.rank and n not in self._reported:
                self._reported.add(n)
                self._start_report(n, self._reasons[n])

    def _start_report(self, n: int, reason: str) -> None:
        # The exchange's own connection, open already (a new one now would cost the store's
        # server a name lookup of this host in the middle of every rank's answer; calls on it
        # are one at a time whichever thread makes them).
        try:
            store = self._connection()
        except Exception as exc:
            self._warn(exc)
            return
        rnd = Round(
            n, reason, self.rank, self.world_size, self.namespace,
            time.monotonic() + GATHER_S, store, self.restart, self.blackbox_dir,
        )  # fmt: skip
        t = threading.Thread(target=self._report, args=(rnd,), name="flightrec-verdict")
        t.daemon = True
        self._reporting = t
        t.start()

    def _report(self, rnd: Round) -> None:
        try:
            self._reporter(rnd)
        except Exception as exc:  # the reporter must not raise; if it does, one line
            log.warning("flightrec: could not print the verdict: %s", exc)

    def _connection(self, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
        if self._store is None:
            self._store = self._poller.new_connection(timeout_s)
        return self._store

    @property
    def store_gone(self) -> bool:
        """A store call failed here, or the request thread finds the store failing."""
        return self._lost or bool(getattr(self._poller, "failing", False))

    def store_lost(self) -> None:
        """Someone else found the store gone, and said so in the log: this exchange neither
        says it again nor waits on the store at exit."""
        self._lost = self._warned = True

    def _warn(self, exc: BaseException) -> None:
        self._lost = True
        if not self._warned:
            self._warned = True
            log.warning(
                "flightrec: no verdict in the log from this rank: the job's store does not "
                "answer (%s)",
                first_line(exc),
            )


__all__ = [
    "MAX_BYTES", "Exchange", "Listing", "Reporter", "Round", "answer_requests", "claim",
    "encoded", "frame", "may_claim", "send", "unframe",
]  # fmt: skip
