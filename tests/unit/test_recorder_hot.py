"""The hot path over its own narrow state: no Recorder, only a ring, caches and the slow paths
handed in as callables; each slow path runs on a miss only, and the entry it writes is the
ring's own (``Ring.append``/``finish``, the one definition of a slot write)."""

from __future__ import annotations

from typing import Any

from flightrec.format.builder import IS_P2P, SEND
from flightrec.format.slot import COMPLETED, ENQUEUED, decode
from flightrec.recorder.hotpath.counters import new_active
from flightrec.recorder.hotpath.groups import GroupInfo
from flightrec.recorder.hotpath.python import PyPath
from flightrec.recorder.hotpath.ring import Ring
from flightrec.recorder.hotpath.state import HotState


class Tensor:
    """A stand-in tensor: what the hot path reads of one."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape, self.dtype, self.device = shape, "float32", "cpu"


class Misses:
    """Slow paths that count their calls and fill the caches as the recorder's do."""

    def __init__(self, group: GroupInfo) -> None:
        self.info = group
        self.calls: list[str] = []
        self.settled: list[tuple[int, bool]] = []
        self.failed: list[int] = []

    def state(self, ring: Ring) -> HotState:
        by_pg: dict[Any, GroupInfo] = {}
        threads: dict[int, int] = {}
        reds: dict[Any, int] = {}

        def group(pg: Any) -> GroupInfo | None:
            self.calls.append("group")
            by_pg[pg] = self.info
            return self.info

        def spec(info: GroupInfo, tensor: Any) -> tuple[int, int]:
            self.calls.append("spec")
            info.specs[(tensor.shape, tensor.dtype)] = (7, 8)
            return 7, 8

        def red(op: Any) -> int:
            self.calls.append("red")
            reds[op] = 9
            return 9

        def thread(ident: int) -> int:
            self.calls.append("thread")
            threads[ident] = 3
            return 3

        return HotState(
            ring=ring, active=new_active(), depth=0, by_pg=by_pg, threads=threads, tcaches={},
            reds=reds, group=group, spec=spec, sig=lambda value: 5, device=lambda value: 6,
            red=red, thread=thread, stack=lambda frame, ident: 0,
            settle=lambda rid, result, is_async, info: self.settled.append((rid, is_async)),
            fail=lambda rid, exc: self.failed.append(rid),
        )  # fmt: skip


def make() -> tuple[Ring, Misses, PyPath]:
    ring = Ring(8)
    misses = Misses(GroupInfo(0, "0", "default_pg", (0, 1), "gloo"))
    return ring, misses, PyPath(misses.state(ring), Tensor)


def test_a_call_is_written_through_the_ring_and_misses_fill_the_caches() -> None:
    ring, misses, path = make()
    t = Tensor((4,))
    for _ in range(2):
        rid = path.enter(1, 0, "pg", t, t, "SUM", None, None, False, None)
        assert rid > 0 and path.active[next(iter(path.active))] == rid
        path.leave(rid, None, False, "pg")
        assert not path.active
    # The first call missed every cache once; the second hit them all.
    assert misses.calls == ["group", "spec", "red", "thread"]
    first, second = decode(ring.snapshot())
    assert (first.seq, second.seq) == (1, 2)
    assert (first.op, first.reduce_op, first.thread, first.inputs, first.device) == (1, 9, 3, 7, 8)
    assert first.state == second.state == COMPLETED and first.record_id == 1
    assert ring.ids.value == 2


def test_lists_take_the_signature_slow_path_and_p2p_the_peer_counter() -> None:
    ring, misses, path = make()
    rid = path.enter(2, IS_P2P | SEND, "pg", [Tensor((2,))], 0, 0, 1, None, True, None)
    (row,) = decode(ring.snapshot())
    assert (row.seq, row.p2p_seq, row.peer, row.inputs, row.device) == (0, 1, 1, 5, 6)
    assert row.state == ENQUEUED and row.flags & IS_P2P
    path.leave(rid, "work", True, "pg")  # async: the state's settle decides
    assert misses.settled == [(rid, True)]
    assert decode(ring.snapshot())[0].state == ENQUEUED


def test_nothing_is_recorded_when_off_or_inside_a_recorded_call() -> None:
    ring, _misses, path = make()
    path.state.enabled = False
    assert path.enter(1, 0, "pg", 0, 0, 0, None, None, False, None) == 0
    path.state.enabled = True
    outer = path.enter(1, 0, "pg", 0, 0, 0, None, None, False, None)
    assert path.enter(1, 0, "pg", 0, 0, 0, None, None, False, None) == 0  # inside
    path.leave(outer, None, False, "pg")
    assert [r.record_id for r in decode(ring.snapshot())] == [outer]
