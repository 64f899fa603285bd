"""The slow check's parts without a job: the digest, its making from a ring, the judge."""

from __future__ import annotations

import logging
import random
import re
import time
from types import SimpleNamespace

import pytest

from flightrec.format.activity import RingActivity
from flightrec.format.digest import MAX_BYTES, Digest, DigestError, GroupDigest, decode, encode
from flightrec.format.slot import COMPLETED, ENQUEUED, SLOT
from flightrec.live.slow import SlowJudge, SlowOptions
from flightrec.recorder.config import DEFAULT_SLOW_CHECK_S, from_env
from flightrec.recorder.exchange.keys import Keys
from flightrec.recorder.exchange.slowcheck import SlowCheck, make_digest
from flightrec.recorder.hotpath.ring import Ring
from flightrec.simulate import Fault, SimConfig, parse_layout
from flightrec.simulate.digests import checked_digests
from tests.unit.test_live_exchange import MemoryStore

MS = 1_000_000
T0 = 1_790_000_000 * 10**9


def test_digest_round_trip_keeps_times_to_the_microsecond() -> None:
    g = GroupDigest(
        "0",
        4,
        (7, 8, 9),
        (T0, T0 + 5 * MS + 123_456, T0 + 9 * MS),
        (T0 + MS, T0 + 6 * MS, T0 + 10 * MS),
    )
    d = Digest(3, 4, T0, "node-a", "cuda:1", (g,))
    data = encode(d)
    back = decode(data, "rank 3")
    assert back.rank == 3 and back.host == "node-a" and back.device == "cuda:1"
    (bg,) = back.groups
    assert bg.seqs == (7, 8, 9) and bg.members == 4
    assert [abs(a - b) < 1000 for a, b in zip(bg.enqueue_ns, g.enqueue_ns, strict=True)] == [
        True
    ] * 3
    assert [abs(a - b) < 2000 for a, b in zip(bg.complete_ns, g.complete_ns, strict=True)] == [
        True
    ] * 3


def test_digest_is_bounded_and_bad_bytes_are_refused_with_one_reason() -> None:
    rows = tuple(range(1, 1001))
    big = GroupDigest(
        "g" * 500, 8, rows, tuple(T0 + i * MS for i in rows), tuple(T0 + i * MS + 1 for i in rows)
    )
    d = Digest(0, 8, T0, "h" * 500, "d" * 500, (big,) * 20)
    data = encode(d)
    assert len(data) <= MAX_BYTES
    back = decode(data, "x")
    assert len(back.groups) == 8 and all(len(g.seqs) == 64 for g in back.groups)
    assert back.groups[0].seqs[-1] == 1000  # the newest kept
    for bad in (b"", b"nonsense", data[:-3], b"FRDG\x09" + data[5:], data + b"x" * MAX_BYTES):
        with pytest.raises(DigestError) as e:
            decode(bad, "rank 5's digest")
        assert str(e.value).startswith("rank 5's digest: ") and "\n" not in str(e.value)


def test_digest_from_a_ring_snapshot_keeps_completed_collectives_of_real_groups() -> None:
    buf = bytearray()
    rid = 0
    for i in range(100):
        for group, state in ((0, COMPLETED), (1, COMPLETED), (2, COMPLETED)):
            rid += 1
            st = ENQUEUED if (group == 0 and i == 99) else state
            comp = 0 if st != COMPLETED else i * MS + MS // 2
            buf += SLOT.pack(
                rid, i * MS + 1, comp, st, i + 1, 0, group, 0, 0, -1, 0, 0, 0, 0, 0, 0, rid
            )
    d = make_digest(bytes(buf), [("0", 4), ("1", 2), ("solo", 1)], 1, 4, "h", "cpu", T0, T0)
    keys = [g.key for g in d.groups]
    assert sorted(keys) == ["0", "1"]  # a group of one member is no comparison
    g0 = next(g for g in d.groups if g.key == "0")
    assert len(g0.seqs) == 64 and g0.seqs[-1] == 99  # the pending one left out
    assert g0.enqueue_ns[-1] == T0 + 98 * MS + 1


def _digests(
    late: dict[int, float],
    checks: int,
    every: int = 1,
    seed: int = 0,
    world: int = 4,
    onset: int = 0,
):  # type: ignore[no-untyped-def]
    """Digests of a ``world``-rank job, one dict per check of 64 new collectives."""
    rng = random.Random(seed)
    offsets = [rng.uniform(-5, 5) * MS for _ in range(world)]
    out = []
    seq = 0
    t = T0
    for c in range(checks):
        rows: dict[int, list[tuple[int, int, int]]] = {r: [] for r in range(world)}
        for _ in range(64):
            seq += 1
            arrive = [t + rng.uniform(0, 2) * MS for _ in range(world)]
            if c >= onset and seq % every == 0:
                for r, ms in late.items():
                    arrive[r] += ms * MS
            done = max(arrive) + 0.3 * MS
            for r in range(world):
                rows[r].append((seq, int(arrive[r] + offsets[r]), int(done + offsets[r])))
            t = int(done) + 50 * MS
        out.append(
            {
                r: encode(
                    Digest(
                        r,
                        world,
                        t,
                        f"h{r}",
                        "cpu",
                        (GroupDigest("0", world, *map(tuple, zip(*rows[r], strict=True))),),
                    )
                )
                for r in range(world)
            }
        )
    return out


def test_a_late_rank_is_named_after_two_checks_then_once_more_when_over() -> None:
    judge = SlowJudge()
    checks = _digests({2: 40.0}, 4, onset=1)
    said = [judge.check(raw) for raw in checks]
    assert said[0] is None and said[1] is None  # healthy, then late once: not yet
    assert said[2] is not None and said[3] is None  # named once, not repeated
    line = said[2]
    assert line.startswith(
        "flightrec: slow rank: rank 2 (h2, cpu) is persistently late in group 0 (4 ranks)"
    )
    assert "steady" in line and "Nothing hangs." in line and "% of their time waiting" in line
    assert line.endswith("\n") and line.count("\n") == 1
    healthy = _digests({}, 3, seed=1)
    assert judge.check(healthy[0]) is None
    assert (
        judge.check(healthy[1])
        == "flightrec: slow rank: rank 2 (h2, cpu) is no longer late in group 0.\n"
    )
    assert judge.check(healthy[2]) is None


def test_a_rank_slow_every_fourth_step_is_named_as_intermittent() -> None:
    judge = SlowJudge()
    said = [judge.check(raw) for raw in _digests({1: 40.0}, 4, every=4, onset=1)]
    lines = [s for s in said if s]
    assert len(lines) == 1 and "rank 1 (" in lines[0] and "intermittent" in lines[0]


def test_healthy_jobs_and_garbage_print_nothing() -> None:
    for seed in range(10):
        judge = SlowJudge()
        assert [judge.check(raw) for raw in _digests({}, 4, seed=seed)] == [None] * 4
    judge = SlowJudge()
    assert judge.check({0: b"junk", 1: b"", 2: encode(Digest(5, 4, T0, "", "", ()))}) is None


def test_a_rank_that_only_waited_for_a_late_peer_is_not_named() -> None:
    # Rank 1 is late in group "tp" (ranks 0, 1); rank 0 waits for it there and so arrives
    # late at "dp" (ranks 0, 2, 3, 4): only rank 1 is the cause.
    rng = random.Random(3)
    judge = SlowJudge(SlowOptions(confirm=1, min_persist_s=0.0))
    t = T0
    rows: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
    for seq in range(1, 65):
        a_tp = {0: t + rng.uniform(0, 2) * MS, 1: t + 40 * MS + rng.uniform(0, 2) * MS}
        d_tp = max(a_tp.values()) + 0.3 * MS
        a_dp = {r: t + rng.uniform(0, 2) * MS for r in (2, 3, 4)}
        a_dp[0] = d_tp + rng.uniform(0, 1) * MS
        d_dp = max(a_dp.values()) + 0.3 * MS
        for r, a in a_tp.items():
            rows.setdefault((r, "tp"), []).append((seq, int(a), int(d_tp)))
        for r, a in a_dp.items():
            rows.setdefault((r, "dp"), []).append((seq, int(a), int(d_dp)))
        t = int(d_dp) + 50 * MS
    raw = {}
    for r in range(5):
        groups = tuple(
            GroupDigest(k, 2 if k == "tp" else 4, *map(tuple, zip(*rows[(r, k)], strict=True)))
            for k in ("tp", "dp")
            if (r, k) in rows
        )
        raw[r] = encode(Digest(r, 5, t, "", "", groups))
    line = judge.check(raw)
    assert line is not None and "rank 1 is persistently late in group tp" in line


def test_slow_check_setting() -> None:
    assert from_env({}).slow_check_s == DEFAULT_SLOW_CHECK_S
    assert from_env({"FLIGHTREC_SLOW_CHECK": "0"}).slow_check_s == 0.0
    assert from_env({"FLIGHTREC_SLOW_CHECK": "5"}).slow_check_s == 5.0
    assert from_env({"FLIGHTREC_SLOW_CHECK": "0.01"}).slow_check_s == 0.5
    assert from_env({"FLIGHTREC_SLOW_CHECK": "soon"}).slow_check_s == DEFAULT_SLOW_CHECK_S


def _recorder() -> SimpleNamespace:
    ring = Ring(256)
    t = time.monotonic_ns() - 200 * 30 * MS
    for seq in range(1, 101):
        rid = ring.append(t, ENQUEUED, seq, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0)
        ring.finish(rid, COMPLETED, t + MS)
        t += 30 * MS
    return SimpleNamespace(
        ring=ring, groups=SimpleNamespace(groups=[SimpleNamespace(name="0", ranks=(0, 1))])
    )


def test_each_rank_publishes_and_rank_0_hands_every_digest_to_the_judge() -> None:
    store = MemoryStore()
    seen: list[dict[int, bytes]] = []
    checks = [
        SlowCheck(store, _recorder(), 0, 2, "job", 0.5, lambda: seen.append, lambda: "cpu"),
        SlowCheck(store, _recorder(), 1, 2, "job", 0.5, None, lambda: "cuda:1"),
    ]
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    for c in checks:
        c.stop()
    assert seen and sorted(seen[0]) == [0, 1]
    d = decode(seen[0][1], "rank 1")
    assert d.rank == 1 and d.device == "cuda:1" and d.groups[0].seqs[-1] == 100
    assert Keys("job").slow(1) in store.data
    assert all(c.checks >= 1 and c.cost_s > 0 for c in checks)


def test_a_store_that_stops_answering_ends_the_check_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Silent(MemoryStore):
        def _check(self) -> None:
            raise TimeoutError("Socket Timeout")

    check = SlowCheck(Silent(), _recorder(), 1, 2, "job", 0.5, None)
    check._thread.join(10)  # three failed checks, half a second apart
    assert not check._thread.is_alive()
    warned = [r.getMessage() for r in caplog.records if "slow check" in r.getMessage()]
    assert warned == ["flightrec: the slow check stopped: Socket Timeout"]


def test_a_store_whose_host_is_gone_ends_the_check_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reset or refused: the job is ending (rank 0's process hosts the store under mp.spawn and
    may leave first), or that host died, which the hang path reports."""
    caplog.set_level(logging.DEBUG, logger="flightrec")
    check = SlowCheck(MemoryStore(broken=True), _recorder(), 1, 2, "job", 0.5, None)
    check._thread.join(10)
    assert not check._thread.is_alive()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "slow check" in r.getMessage()]
    assert said == [(logging.DEBUG, "flightrec: the slow check stopped: Connection reset by peer")]


def test_digest_carries_the_rank_s_own_time_and_pipeline_peers() -> None:
    activity = RingActivity(700 * MS, 1000 * MS, 900, 38, (3, 11))
    d = Digest(7, 16, T0, "h", "cpu", (), activity)
    assert decode(encode(d), "rank 7").activity == activity
    # Made from a ring: a stage that receives from rank 3 and sends to rank 11.
    buf = bytearray()
    for i in range(60):
        peer, flags = (3, 8) if i % 2 == 0 else (11, 8 | 16)
        t = T0 + i * 10 * MS
        buf += SLOT.pack(i + 1, t, t + 4 * MS, COMPLETED, 0, i // 2 + 1, 0, 0, 0, peer,
                         0, 0, 0, 0, 0, flags, i + 1)  # fmt: skip
    made = make_digest(bytes(buf), [("0", 16)], 7, 16, "h", "cpu", 0, T0).activity
    assert made.peers == (3, 11) and made.period == 2 and made.entries == 60
    assert made.own_ns == 59 * 6 * MS and made.span_ns == 59 * 10 * MS


def _live(fault: Fault, layout: str = "tp=2,pp=2", rank: int = 5) -> list[str]:
    config = SimConfig(parse_layout(layout, 16), 2000, fault, rank)
    judge = SlowJudge(SlowOptions(min_persist_s=0))
    return [line for raw in checked_digests(config, 4) if (line := judge.check(raw))]


def test_a_slow_worker_is_named_as_such_and_the_ranks_it_held_up_are_not() -> None:
    (line,) = _live(Fault.SLOW_WORKER)
    assert line.startswith("flightrec: slow rank: rank 5 (node00000, cuda:5) is persistently")
    assert "a slow worker (stage 0 of 2): it spends" in line
    assert "rank 4" not in line and "rank 6" not in line


def test_a_slow_stage_gets_a_line_of_its_own() -> None:
    (line,) = _live(Fault.SLOW_STAGE, "tp=2,pp=4", rank=6)
    assert line.startswith("flightrec: slow stage: stage 3 of 4 (ranks 6-7,14-15) spends")
    assert "stage imbalance, no single rank" in line


def test_spread_imbalance_gets_a_line_that_names_no_rank() -> None:
    (line,) = _live(Fault.SPREAD_IMBALANCE)
    assert line.startswith("flightrec: spread imbalance: ranks doing the same work spend")
    assert "no culprit" in line and not re.search(r"rank \d", line)


def test_a_healthy_pipeline_prints_nothing() -> None:
    assert _live(Fault.NONE) == []
