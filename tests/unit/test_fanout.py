"""The loader's forked workers: results in task order, a worker's exception re-raised."""

from __future__ import annotations

import os

import pytest

from flightrec.analysis.fanout import can_fork, ordered_map

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs fork")


def _square_with_pid(n: int) -> tuple[int, int]:
    return n * n, os.getpid()


def _fail_on_five(n: int) -> int:
    if n == 5:
        raise ValueError("task 5 is bad")
    return n


def test_results_come_back_in_task_order_from_several_processes() -> None:
    results = list(ordered_map(_square_with_pid, list(range(20)), workers=3))
    assert [square for square, _ in results] == [n * n for n in range(20)]
    assert len({pid for _, pid in results}) == 3
    assert os.getpid() not in {pid for _, pid in results}


def test_an_exception_in_a_worker_is_raised_in_the_caller() -> None:
    seen: list[int] = []
    with pytest.raises(ValueError, match="task 5 is bad"):
        seen.extend(ordered_map(_fail_on_five, list(range(10)), workers=2))
    assert seen == [0, 1, 2, 3, 4]


def test_more_workers_than_tasks_and_no_tasks() -> None:
    assert [r for r, _ in ordered_map(_square_with_pid, [3], workers=4)] == [9]
    assert list(ordered_map(_square_with_pid, [], workers=2)) == []
