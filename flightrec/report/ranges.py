"""Compress rank lists for people: ``0-3,8``, ``0-16383 except 4711``."""

from __future__ import annotations

from collections.abc import Iterable


def _runs(ranks: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        elif not runs or r != runs[-1][1]:
            runs.append((r, r))
    return runs


def _fmt(runs: list[tuple[int, int]]) -> str:
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def compress(ranks: Iterable[int]) -> str:
    """A short, exact spelling of a set of ranks.

    Consecutive ranks become ``a-b``; a long range with at most three holes is spelled as the
    range and its holes (``0-16383 except 4711``).

    Args:
        ranks: global ranks, in any order, duplicates allowed.

    Returns:
        ``""`` for no ranks, else e.g. ``0-2,5``.
    """
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    plain = _fmt(_runs(ordered))
    lo, hi = ordered[0], ordered[-1]
    present = set(ordered)
    holes = [r for r in range(lo, hi + 1) if r not in present]
    # A few holes in a long range read better as exceptions: "0-16383 except 4711".
    if holes and len(holes) <= 3 and len(holes) * 10 <= hi - lo + 1:
        return f"{lo}-{hi} except {_fmt(_runs(holes))}"
    return plain


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``rank 2`` or ``ranks 0-1,3``."""
    ordered = sorted(set(ranks))
    word = "rank" if len(ordered) == 1 else "ranks"
    return f"{word} {compress(ordered)}"
