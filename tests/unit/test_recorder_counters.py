"""The counters and the reentrancy guard both hot paths share (``hotpath.counters``): the C
types behave as their pure-Python twins do, so the Python path, the dumper and the C path can
use either."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightrec.recorder.hotpath import counters
from flightrec.recorder.hotpath.groups import GroupInfo

try:
    from flightrec.recorder.hotpath import _fast
except ImportError:  # not built: only the pure-Python twins are checked
    _fast = None  # type: ignore[assignment]

COUNTERS: list[Any] = [counters.Counter] + ([_fast.Counter] if _fast is not None else [])
GUARDS: list[Any] = [dict] + ([_fast.Active] if _fast is not None else [])


@pytest.mark.parametrize("make", COUNTERS)
def test_a_counter_counts_from_one_and_keeps_the_last_number(make: Any) -> None:
    c = make()
    assert c.value == 0
    assert iter(c) is c
    assert [next(c) for _ in range(3)] == [1, 2, 3]
    assert c.value == 3


@pytest.mark.parametrize("make", COUNTERS)
def test_threads_never_share_a_number(make: Any) -> None:
    c = make()
    got: list[list[int]] = [[] for _ in range(4)]

    def take(out: list[int]) -> None:
        for _ in range(5000):
            out.append(next(c))

    threads = [threading.Thread(target=take, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    issued = [n for g in got for n in g]
    assert sorted(issued) == list(range(1, 20001))
    assert c.value == 20000


@pytest.mark.parametrize("make", GUARDS)
def test_the_guard_is_a_dict_of_thread_idents(make: Any) -> None:
    a = make()
    assert not a and len(a) == 0 and 5 not in a and "x" not in a
    a[5] = 11
    a[2**63 + 7] = 12  # idents are unsigned longs
    assert 5 in a and 2**63 + 7 in a and len(a) == 2 and a
    assert a[5] == 11 and dict(a) == {5: 11, 2**63 + 7: 12}
    assert sorted(a.keys()) == [5, 2**63 + 7] and sorted(a) == [5, 2**63 + 7]
    assert sorted(a.items()) == [(5, 11), (2**63 + 7, 12)]
    a[5] = 13  # a thread's newest call replaces its entry
    assert a[5] == 13 and len(a) == 2
    assert a.pop(5, None) == 13 and a.pop(5, None) is None
    with pytest.raises(KeyError):
        a.pop(5)
    with pytest.raises(KeyError):
        a[5]
    del a[2**63 + 7]
    with pytest.raises(KeyError):
        del a[2**63 + 7]
    assert not a


@pytest.mark.parametrize("make", GUARDS)
def test_the_guard_holds_many_threads(make: Any) -> None:
    a = make()
    for ident in range(1, 101):
        a[ident] = ident * 10
    for ident in range(1, 101, 2):
        del a[ident]
    assert dict(a) == {i: i * 10 for i in range(2, 101, 2)}


def test_a_group_s_seq_is_its_counter_s_last_number() -> None:
    info = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
    assert info.seq == 0 and info.recorded == 0
    assert [info.next_seq(), next(info.counter), info.next_seq()] == [1, 2, 3]
    assert info.seq == 3 and info.recorded == 3


def test_split_sizes_make_one_chunk_per_peer_without_views() -> None:
    torch = pytest.importorskip("torch")
    from flightrec.recorder.hotpath.python import split
    from flightrec.recorder.recording.tables import tensor_sig

    t = torch.ones(10, 3, dtype=torch.float16)
    chunks = split(t, [1, 0, 9])
    assert tensor_sig(chunks) == (((1, 3), "float16"), ((0, 3), "float16"), ((9, 3), "float16"))
    assert all(c.device == t.device for c in chunks)
    assert split(t, None) is t and split(t, []) is t
    assert split("not a tensor", [1, 2]) == "not a tensor"  # torch raises its own error


class FakePG:
    """A ProcessGroup's own counter, as ``_get_sequence_number_for_group`` reads it."""

    def __init__(self) -> None:
        self.n = 0

    def _get_sequence_number_for_group(self) -> int:
        return self.n


@pytest.mark.parametrize("make", COUNTERS)
def test_a_counter_with_a_source_takes_its_numbers_from_it(make: Any) -> None:
    c = make()
    assert c.source is None
    c.raise_to(5)
    assert c.value == 5 and next(c) == 6
    c.raise_to(3)  # never back
    assert c.value == 6
    c.source = lambda: 41
    assert c.source() == 41


def test_a_group_follows_the_process_groups_numbers_once_they_part() -> None:
    """torch numbers calls flightrec never sees (DDP's reducer): from the first time the two
    counters differ, each call takes the ProcessGroup's next number; not before."""
    pg = FakePG()
    info = GroupInfo(0, "0", "default_pg", (0, 1), "nccl", pg._get_sequence_number_for_group)
    for _ in range(2):
        pg.n += 1
        assert info.next_seq() == pg.n  # in step: flightrec's own counter, nothing read
    info.follow_native()
    assert info.counter.source is None
    pg.n += 3  # three bucket all-reduces from C++
    info.follow_native()
    assert info.counter.source is not None
    assert info.next_seq() == 6 and info.seq == 6  # the ProcessGroup's next number


def test_calls_of_other_threads_under_way_are_no_parting_and_no_number_goes_out_twice() -> None:
    """flightrec numbers a call before torch does: torch's count behind ours is threads'
    calls under way, not calls flightrec missed. Once following torch's count, threads that
    read it alike before either call reaches torch still get numbers of their own."""
    pg = FakePG()
    info = GroupInfo(0, "0", "default_pg", (0, 1), "nccl", pg._get_sequence_number_for_group)
    assert [info.next_seq() for _ in range(3)] == [1, 2, 3]
    pg.n = 1  # two of those calls not yet in torch
    info.follow_native()
    assert info.counter.source is None
    pg.n = 10  # torch ran calls flightrec never saw: parted
    info.follow_native()
    assert info.counter.source is not None
    assert [info.next_seq() for _ in range(3)] == [11, 12, 13]  # torch's count read as 10 each
    pg.n = 20
    assert info.next_seq() == 21 and info.seq == 21


def test_gloo_numbers_leave_out_sends_and_receives() -> None:
    """gloo's counter also counts point-to-point calls, which torch's recorder does not
    number: those this rank issued are taken off."""
    pg = FakePG()
    info = GroupInfo(0, "0", "default_pg", (0, 1), "gloo", pg._get_sequence_number_for_group)
    pg.n = 4
    info.next_p2p(1, True)
    info.next_p2p(1, False)
    assert info.native_seq() == 2


def test_a_group_without_a_counter_of_its_own_keeps_flightrecs() -> None:
    info = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
    info.follow_native()
    assert info.counter.source is None and info.next_seq() == 1
