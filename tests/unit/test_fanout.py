"""The loader's forked workers: results in task order, a worker's exception re-raised."""

from __future__ import annotations

import os
import time

import pytest

from flightrec.analysis.fanout import Background, can_fork, ordered_map
from flightrec.errors import WorkerLostError

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs fork")


def _square_with_pid(n: int) -> tuple[int, int]:
    return n * n, os.getpid()


def _fail_on_five(n: int) -> int:
    if n == 5:
        raise ValueError("task 5 is bad")
    return n


def test_results_come_back_in_task_order_from_several_processes() -> None:
    results = list(ordered_map(_square_with_pid, list(range(200)), workers=3))
    assert [square for square, _ in results] == [n * n for n in range(200)]
    # Whichever process is free takes the next task: at most three, never this one.
    assert 1 <= len({pid for _, pid in results}) <= 3
    assert os.getpid() not in {pid for _, pid in results}


def test_an_exception_in_a_worker_is_raised_in_the_caller() -> None:
    seen: list[int] = []
    with pytest.raises(ValueError, match="task 5 is bad"):
        seen.extend(ordered_map(_fail_on_five, list(range(10)), workers=2))
    assert seen == [0, 1, 2, 3, 4]


def test_more_workers_than_tasks_and_no_tasks() -> None:
    assert [r for r, _ in ordered_map(_square_with_pid, [3], workers=4)] == [9]
    assert list(ordered_map(_square_with_pid, [], workers=2)) == []


def _slow_on_even(n: int) -> int:
    time.sleep(0.02 if n % 2 == 0 else 0)
    return n


def test_answers_that_come_early_wait_for_their_turn() -> None:
    assert list(ordered_map(_slow_on_even, list(range(30)), workers=2)) == list(range(30))


def _die_on_three(n: int) -> int:
    if n == 3:
        os._exit(9)  # (as the kernel's OOM killer would end it)
    return n


def test_a_process_that_dies_ends_the_iteration_with_an_error() -> None:
    with pytest.raises(WorkerLostError, match="ended without answering"):
        list(ordered_map(_die_on_three, list(range(10)), workers=2))


def _after(pause_s: float) -> int:
    time.sleep(pause_s)
    return os.getpid()


def test_calls_running_beside_each_other_each_answer() -> None:
    # Each start shares a task counter with its processes. One freed while its processes
    # ran was handed to the next start, whose process then found its one task taken.
    for _ in range(5):
        with Background(_after, 0.05) as first, Background(_after, 0.0) as second:
            assert second.result() != first.result()
