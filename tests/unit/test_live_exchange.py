"""The verdict in the job's log, without a job: summaries in, text out; the exchange over a
store held in memory (one that works, and one that is gone)."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightrec import live
from flightrec.errors import CONTROL
from flightrec.format import flightrec_pb2 as pb
from flightrec.format import summary as fs
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.read import read_dump
from flightrec.format.slot import STARTED
from flightrec.live.verdict import render
from flightrec.recorder.exchange import verdict as exchange
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.verdict import Exchange, Round

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "stalled_rank"


def hang_dumps() -> dict[int, tuple[str, pb.Dump]]:
    out: dict[int, tuple[str, pb.Dump]] = {}
    for f in sorted(SAMPLE.glob("*.frdump")):
        d = read_dump(f)
        out.setdefault(d.header.rank, (str(f), d))
    return out


def published(n: int = 7) -> dict[int, bytes]:
    return {r: fs.encode(fs.summarize(d, n, p)) for r, (p, d) in hang_dumps().items()}


def test_the_panel_names_the_culprit_and_where_every_dump_went() -> None:
    text = render(published(), 7, "WATCHDOG_TIMEOUT", 4, 0.4)
    lines = text.splitlines()
    assert lines[0].startswith("flightrec verdict: hang declared; from 4 of 4 ranks' summaries")
    assert "Verdict: not_arrived" in text
    assert "Rank 2 (vm, pid 12474, cpu) never entered all_reduce #4" in text
    assert "save_checkpoint_shard at samples/train_job.py:52" in text
    assert "Dumps (on each rank's host)" in lines
    assert any(line.startswith("  rank 2 on vm: ") and line.endswith(".frdump") for line in lines)


def test_a_hostile_or_stale_summary_costs_its_rank_and_one_line() -> None:
    raw = published()
    raw[1] = b"\x1b[2J" + b"A" * 5000
    raw[3] = fs.encode(fs.summarize(hang_dumps()[3][1], 6, "old"))  # an older round
    (p, d) = hang_dumps()[0]
    d.header.hostname = "evil\x1b]0;pwned\x07"
    raw[0] = fs.encode(fs.summarize(d, 7, p))
    text = render(raw, 7, "WATCHDOG_TIMEOUT", 4, 0.1)
    assert "from 2 of 4 ranks' summaries" in text
    assert "flightrec verdict: rank 1's summary: 5004 bytes, more than the 3072" in text
    assert "flightrec verdict: rank 3's summary: answers request 6, not 7" in text
    assert "no answer from ranks 1,3" in text
    assert not CONTROL.search(text.replace("\n", ""))


def test_a_rank_that_died_stands_in_a_later_round_only_with_its_exception() -> None:
    from tests.unit.test_summary import died_rank

    raw = published(7)
    raw[1] = fs.encode(fs.summarize(died_rank(), 2, "/dumps/rank1.frdump"))  # before the round
    text = render(raw, 7, "SIGNAL_TERM", 4, 0.1, frozenset({1}))
    assert "from 4 of 4 ranks' summaries" in text, text
    assert "Rank 1 (host not recorded, pid not recorded) died of ValueError: bad batch" in text, (
        text
    )
    # Not listed as dead: a stale summary, as before.
    assert "answers request 2, not 7" in render(raw, 7, "SIGNAL_TERM", 4, 0.1)
    # Listed, but nothing ended its main thread: no reason to take an older round's summary.
    raw[1] = fs.encode(fs.summarize(hang_dumps()[1][1], 2, "old"))
    assert "answers request 2, not 7" in render(raw, 7, "SIGNAL_TERM", 4, 0.1, frozenset({1}))


def test_a_rank_that_ended_cleanly_is_named_as_exited() -> None:
    # Rank 3's data ran out: it destroyed its group and exited after all_reduce #3, and said
    # so through the store; the others wait in all_reduce #4.
    raw = {}
    for rank in (0, 1, 2):
        b = DumpBuilder()
        b.header.rank, b.header.world_size, b.header.reason = rank, 4, pb.WATCHDOG_TIMEOUT
        g = b.group("0", [0, 1, 2, 3], last_seq=4)
        for seq in (1, 2, 3, 4):
            state = pb.COMPLETED if seq < 4 else pb.STARTED
            b.entry(EntryValues(seq, g, "all_reduce", seq=seq, enqueue_ns=seq * 100,
                                state=state, stack=[("/job/train.py", "main", 31)]))  # fmt: skip
        b.thread(1, "MainThread", [("/job/train.py", "main", 31)], is_main=True)
        raw[rank] = fs.encode(fs.summarize(b.build(), 2, ""))
    text = render(raw, 2, "WATCHDOG_TIMEOUT", 4, 0.1, exited=frozenset({3}))
    assert "Rank 3 exited cleanly without entering all_reduce #4" in text, text
    assert "rank 3 exited cleanly, no dump" in text and "no answer from" not in text, text
    # Not said: a rank that left nothing may be dead or stuck holding the GIL.
    text = render(raw, 2, "WATCHDOG_TIMEOUT", 4, 0.1)
    assert "Rank 3 left no dump" in text and "(no summary" in text, text
    assert "killed hard" in text and "GIL" in text, text


def test_the_exchange_lists_dead_and_departed_ranks_for_the_reporter() -> None:
    store = MemoryStore()
    rnd = Round(1, "WATCHDOG_TIMEOUT", 0, 4, "", time.monotonic() + 1, store, "0")
    assert rnd.died() == [] and rnd.left() == []
    store.append(Keys().died("0"), "2,")
    store.append(Keys().left("0"), "3,")
    store.append(Keys().left("0"), "3,")  # said twice: listed once
    store.append(Keys().left("1"), "1,")  # another attempt's: not this one's
    assert rnd.died() == [2] and rnd.left() == [3]


def test_a_healthy_job_stopped_by_sigterm_gets_one_line() -> None:
    folder = SAMPLE.parent / "healthy"
    raw = {}
    for f in sorted(folder.glob("*.frdump")):
        d = read_dump(f)
        raw.setdefault(d.header.rank, fs.encode(fs.summarize(d, 3, str(f))))
    text = render(raw, 3, "SIGNAL_TERM", 4, 0.1)
    assert text == "flightrec verdict: 4 of 4 ranks answered request 3 (SIGTERM); none was stuck\n"


class MemoryStore:
    """The TCPStore calls the exchange makes, in memory; ``broken`` makes every call fail."""

    def __init__(self, broken: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.broken = broken

    def _check(self) -> None:
        if self.broken:
            raise ConnectionError("Connection reset by peer")

    def clone(self) -> MemoryStore:
        self._check()
        return self

    def set(self, key: str, value: str | bytes) -> None:
        self._check()
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else value

    def append(self, key: str, value: str | bytes) -> None:
        with self.lock:
            raw = value.encode() if isinstance(value, str) else value
            self.data[key] = self.data.get(key, b"") + raw

    def compare_set(self, key: str, expected: str | bytes, desired: str) -> bytes:
        self._check()
        expected = expected.encode() if isinstance(expected, str) else expected
        with self.lock:
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = desired.encode()
            return self.data[key]

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


class FakePoller:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def connection_source(self) -> MemoryStore:
        return self.store

    def new_connection(self, timeout_s: float = 10.0) -> MemoryStore:
        return self.store.clone()


def test_the_lowest_rank_that_answers_reports_once(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    rounds: list[Round] = []

    def reporter(rnd: Round) -> None:
        rounds.append(rnd)
        live.report(rnd)

    exchanges = {r: Exchange(FakePoller(store), r, 4, "job", reporter) for r in range(4)}  # type: ignore[arg-type]
    for r in (3, 2, 1, 0):  # rank 0 answers last: rank 3 offers first, then steps aside
        path, dump = hang_dumps()[r]
        exchanges[r].on_dump(dump, Path(path))
        exchanges[r].after_request(5, "WATCHDOG_TIMEOUT")
    deadline = time.monotonic() + 10
    while "Dumps (on each rank's host)" not in err.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    for ex in exchanges.values():
        if ex._reporting is not None:
            ex._reporting.join(5)
    text = err.getvalue()
    assert text.count("Verdict: not_arrived") == 1, text
    assert "from 4 of 4 ranks' summaries" in text
    assert store.get("flightrec/job/round/5/reporter") == b"0!"  # closed as it printed
    assert sorted(int(r) for r in store.get("flightrec/job/round/5/ranks").split(b",")[:-1]) == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert {rnd.rank for rnd in rounds} >= {0}


def test_only_ranks_that_may_report_offer_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # At scale a claim from every rank is one answer each that the store's server writes for
    # nothing: the first ranks offer, and the rank that posted the request (it was alive to
    # post it), so that a round whose low ranks all stay silent still has its reporter.
    monkeypatch.setattr(exchange, "CLAIMANTS", 2)
    store = MemoryStore()
    rounds: list[tuple[int, int]] = []
    posters = {3: {5}}

    class Poller(FakePoller):
        def __init__(self, rank: int) -> None:
            super().__init__(store)
            self.posted = posters.get(rank, set())

    exchanges = {
        r: Exchange(Poller(r), r, 6, "job", lambda rnd: rounds.append((rnd.number, rnd.rank)))  # type: ignore[arg-type]
        for r in range(6)
    }

    def answer(rank: int) -> None:
        path, dump = hang_dumps()[rank % 4]
        exchanges[rank].on_dump(dump, Path(path))
        exchanges[rank].after_request(5, "WATCHDOG_TIMEOUT")
        running = exchanges[rank]._reporting
        if running is not None:
            running.join(5)

    reporter = "flightrec/job/round/5/reporter"
    answer(4)  # neither low nor the poster: its summary, record and listing; no offer
    assert reporter not in store.data
    assert store.get("flightrec/job/round/5/ranks") == b"4,"
    assert (
        "flightrec/job/summary/4" in store.data and "flightrec/job/round/5/progress" in store.data
    )
    answer(3)  # the poster
    assert store.get(reporter) == b"3" and rounds == [(5, 3)]
    answer(1)  # a low rank: takes over
    assert store.get(reporter) == b"1" and rounds == [(5, 3), (5, 1)]


def test_a_rank_answering_after_the_verdict_is_out_prints_no_second_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rank 0 answers after rank 1 gathered and printed (its request thread was busy, or its
    # connection slow to open): it is the lowest rank, but the round has had its verdict.
    monkeypatch.setattr(exchange, "GATHER_S", 1.0)
    store = MemoryStore()
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    exchanges = {r: Exchange(FakePoller(store), r, 4, "job", live.report) for r in range(4)}  # type: ignore[arg-type]

    def answer(*ranks: int) -> None:
        for r in ranks:
            path, dump = hang_dumps()[r]
            exchanges[r].on_dump(dump, Path(path))
            exchanges[r].after_request(5, "WATCHDOG_TIMEOUT")
        for r in ranks:
            running = exchanges[r]._reporting
            if running is not None:
                running.join(20)

    answer(3, 2, 1)
    first = err.getvalue()
    assert "flightrec verdict" in first and "from 3 of 4 ranks" in first, first
    answer(0)
    assert err.getvalue() == first
    assert store.get("flightrec/job/round/5/reporter") == b"1!"
    assert b"0," in store.get("flightrec/job/round/5/ranks")  # still listed as having answered


def test_the_store_connection_opens_once_an_operation_is_half_way_to_a_hang() -> None:
    # Opened after the hang is declared, every rank's connection set-up would delay its answer.
    class Source(MemoryStore):
        clones = 0

        def clone(self) -> MemoryStore:
            Source.clones += 1
            return self

    prepared = threading.Event()

    class Reporter:
        def __call__(self, rnd: Round) -> None:
            pass

        def prepare(self) -> None:
            prepared.set()

    ex = Exchange(FakePoller(Source()), 0, 4, "job", Reporter())  # type: ignore[arg-type]
    slot = SimpleNamespace(state=STARTED, enqueue_ns=0)
    ring = SimpleNamespace(pending_slots=lambda: [0], read=lambda index: slot)
    ex.tick(1_000_000_000, ring, 10.0)  # type: ignore[arg-type]  # 1 s into a 10 s timeout
    assert Source.clones == 0
    ex.tick(6_000_000_000, ring, 10.0)  # type: ignore[arg-type]
    assert prepared.wait(10)
    assert Source.clones == 1


def test_a_store_that_is_gone_costs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    ex = Exchange(FakePoller(MemoryStore(broken=True)), 1, 4, "job", lambda rnd: None)  # type: ignore[arg-type]
    path, dump = hang_dumps()[1]
    with caplog.at_level(logging.WARNING, logger="flightrec"):
        for n in (1, 2, 3):
            ex.on_dump(dump, Path(path))
            ex.after_request(n, "WATCHDOG_TIMEOUT")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "no verdict in the log from this rank: the job's store does not answer" in warnings[0]
    assert "Connection reset by peer" in warnings[0]


def test_once_the_store_is_gone_exit_and_death_neither_wait_on_it_nor_warn_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each store call on a vanished store waits out the connect timeout (seconds): at exit
    # and at death, a store already known gone is left alone.
    class Counting(MemoryStore):
        calls = 0

        def _check(self) -> None:
            Counting.calls += 1
            super()._check()

        def append(self, key: str, value: str | bytes) -> None:
            self._check()
            super().append(key, value)

    path, dump = hang_dumps()[1]
    with caplog.at_level(logging.WARNING, logger="flightrec"):
        failed = Exchange(FakePoller(Counting(broken=True)), 1, 4, "job", lambda rnd: None)  # type: ignore[arg-type]
        failed.on_dump(dump, Path(path))
        failed.after_request(1, "WATCHDOG_TIMEOUT")  # fails: one warning
        told = Exchange(FakePoller(Counting(broken=True)), 2, 4, "job", lambda rnd: None)  # type: ignore[arg-type]
        told.store_lost()  # the request poster already warned
        calls = Counting.calls
        for ex in (failed, told):
            ex.after_exit()
            ex.on_dump(dump, Path(path))
            ex.after_request(2, "WATCHDOG_TIMEOUT")
    assert Counting.calls == calls
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]


def test_other_requests_start_no_exchange() -> None:
    store = MemoryStore()
    ex = Exchange(FakePoller(store), 0, 4, "job", lambda rnd: None)  # type: ignore[arg-type]
    path, dump = hang_dumps()[0]
    ex.on_dump(dump, Path(path))
    ex.after_request(1, "CLI_TRIGGER")
    ex.after_request(2, "")
    assert store.data == {}


class TermPoller(FakePoller):
    """The request counter of ``Poller``, shared by the ranks through ``counter``."""

    def __init__(self, store: MemoryStore, counter: list[int]) -> None:
        super().__init__(store)
        self.counter = counter
        self.seen = 0
        self.latest: tuple[int, str, int] = (0, "", 0)

    def start_round(self, rank: int, reason: str, seen: int) -> tuple[bool, int]:
        if self.counter[0] > seen:
            self.latest = (self.counter[0], "", time.monotonic_ns())
            return False, self.counter[0]
        self.counter[0] = seen + 1
        self.latest = (self.counter[0], reason, time.monotonic_ns())
        return True, self.counter[0]

    def take(self, n: int, reason: str) -> None:
        """The request thread sees request ``n`` (before it dumps for it)."""
        self.latest = (n, reason, time.monotonic_ns())
        self.seen = n


def test_a_sigterm_just_after_the_others_round_reached_this_rank_joins_that_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun sends SIGTERM to every rank at once. Rank 0 posts round 1 first; on ranks 2
    and 3 the request thread takes request 1 a moment before their own SIGTERM dump is
    published. All three answer round 1, and one report names them all (once, a round 2
    would leave both short)."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    store, counter = MemoryStore(), [0]
    rounds: list[Round] = []
    pollers = {r: TermPoller(store, counter) for r in (0, 2, 3)}
    exchanges = {r: Exchange(p, r, 4, "job", rounds.append) for r, p in pollers.items()}  # type: ignore[arg-type]
    dumps = hang_dumps()
    exchanges[0].on_dump(dumps[0][1], Path(dumps[0][0]))
    exchanges[0].after_term()  # rank 0: posts round 1, reports
    for r in (2, 3):
        path, dump = dumps[r]
        exchanges[r].on_dump(dump, Path(path))  # its SIGTERM dump
        pollers[r].take(1, "SIGNAL_TERM")
        exchanges[r].on_dump(dump, Path(path))  # the request thread's dump for request 1
        exchanges[r].after_term()  # the signal thread, which took the request thread's dump
        exchanges[r].after_request(1, "SIGNAL_TERM")  # finds it taken: nothing left to do
    for ex in exchanges.values():
        if ex._reporting is not None:
            ex._reporting.join(5)
    assert counter == [1]
    assert sorted(store.get("flightrec/job/round/1/ranks").decode().split(",")[:-1]) == [
        "0", "2", "3",
    ]  # fmt: skip
    assert [(rnd.number, rnd.rank, rnd.reason) for rnd in rounds] == [(1, 0, "SIGNAL_TERM")]


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b"3 WATCHDOG_TIMEOUT", (3, "WATCHDOG_TIMEOUT")),
        (b"1 RANK_DIED", (1, "RANK_DIED")),  # a dying rank's round: its peers answer it
        (b"-1 CLI_TRIGGER", (-1, "CLI_TRIGGER")),
        (b"2 rm -rf /", (2, "")),
        (b"x" * 100, (-1, "")),
    ],
)
def test_a_request_names_a_rank_and_a_reason_from_the_vocabulary(
    raw: bytes, parsed: tuple[int, str]
) -> None:
    from flightrec.recorder.exchange.store import parse_request

    assert parse_request(raw) == parsed


def test_the_reporter_reads_the_records_as_they_arrive_and_decodes_them_once() -> None:
    # Each read of the growing list unframes only what was appended since; a list rewritten
    # by something else, or damaged, is read from its start; records decoded ahead give the
    # selection decoding them at the end gives, and bytes that changed are decoded again.
    from flightrec.format.progress import Decoded, decode_many, encode_progress
    from flightrec.live.verdict import select

    store = MemoryStore()
    rnd = Round(1, "WATCHDOG_TIMEOUT", 0, 8, "", time.monotonic() + 1, store, "0")
    key = Keys().round(1, "progress")

    def record(rank: int, seq: int = 3) -> bytes:
        return encode_progress(
            pb.Progress(round=1, rank=rank, world_size=8, group=["0"], issued=[seq],
                        pending=[seq], size=[8], wait_group=1, wait_op="all_reduce",
                        wait_seq=seq, wait_peer=-1)
        )  # fmt: skip

    listing = exchange.Listing(rnd)
    assert listing.read() == {} and listing.why == ""
    for r in (0, 1, 2):
        store.append(key, exchange.frame(r, record(r)))
    assert set(listing.read()) == {0, 1, 2}
    decoded: Decoded = {}
    decode_many(listing.records, 8, decoded)
    for r in (3, 4):
        store.append(key, exchange.frame(r, record(r, 2)))
    assert set(listing.read()) == {3, 4} and set(listing.records) == {0, 1, 2, 3, 4}
    store.set(key, exchange.frame(5, record(5)))  # rewritten: read again from its start
    assert set(listing.read()) == {5} and set(listing.records) == {5}
    store.append(key, b"\x07\x00")  # a cut record: the list is read as far as it goes
    assert listing.read() == {} and set(listing.records) == {5} and "cut record" in listing.why
    store.set(key, b"".join(exchange.frame(r, record(r, 2 + (r == 1))) for r in range(5)))
    assert set(listing.read()) == set(range(5)) and listing.why == ""
    raw, why = rnd.progress(list(range(5)), listing)
    assert set(raw) == set(range(5)) and why == ""
    ahead, fresh = select(raw, 1, 8, decoded=decoded), select(raw, 1, 8)
    assert ahead.progress == fresh.progress and ahead.ranks == fresh.ranks
    assert ahead.progress[1].wait_seq == 3 and ahead.progress[0].wait_seq == 2  # changed bytes
