"""Rank lists compressed for people."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightrec.text import compress, ranks_phrase


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 3], "0-3"),
        ([3, 1, 0], "0-1,3"),
        ([0, 2, 4], "0,2,4"),
        ([0, 1, 1, 2], "0-2"),
        ([r for r in range(16384) if r != 4711], "0-16383 except 4711"),
        ([r for r in range(100) if r not in (10, 20)], "0-99 except 10,20"),
        (list(range(25, 4090, 32)), "25-4089 step 32"),
        ([r for r in range(25, 4090, 32) if r != 3001], "25-4089 step 32 except 3001"),
        ([0, 2, 4], "0,2,4"),
        ([0, 4, 8, 12], "0-12 step 4"),
    ],
)
def test_compress(ranks: list[int], text: str) -> None:
    assert compress(ranks) == text


def test_ranks_phrase_agrees_in_number() -> None:
    assert ranks_phrase([2]) == "rank 2"
    assert ranks_phrase([0, 1, 3]) == "ranks 0-1,3"


def _expand(text: str) -> set[int]:
    if not text:
        return set()
    main, _, holes = text.partition(" except ")
    out: set[int] = set()
    if " step " in main:
        span, _, step = main.partition(" step ")
        a, _, b = span.partition("-")
        return set(range(int(a), int(b) + 1, int(step))) - _expand(holes)
    for part in main.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out - _expand(holes)


@given(st.sets(st.integers(min_value=0, max_value=300), max_size=60))
def test_compress_is_exact(ranks: set[int]) -> None:
    assert _expand(compress(ranks)) == ranks
