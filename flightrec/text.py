"""Compress rank lists for people: ``0-3,8``, ``0-16383 except 4711``."""

from __future__ import annotations

import itertools
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
    range and its holes (``0-16383 except 4711``); a strided set as a progression
    (``25-4089 step 32``, with ``except`` for up to three holes).

    Args:
        ranks: global ranks, in any order, duplicates allowed.

    Returns:
        ``""`` for no ranks, else e.g. ``0-2,5``.
    """
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    lo, hi = ordered[0], ordered[-1]
    present = set(ordered)
    # Strided sets (a data-parallel group: every 32nd rank) read as one progression.
    step = min((b - a for a, b in itertools.pairwise(ordered)), default=1)
    if step > 1 and len(ordered) >= 4 and all((r - lo) % step == 0 for r in ordered):
        full = range(lo, hi + 1, step)
        holes = [r for r in full if r not in present]
        if len(holes) <= 3 and len(holes) * 10 <= len(full):
            text = f"{lo}-{hi} step {step}"
            return f"{text} except {','.join(map(str, holes))}" if holes else text
    plain = _fmt(_runs(ordered))
    holes = [r for r in range(lo, hi + 1) if r not in present]
    # A few holes in a long range read better as exceptions: "0-16383 except 4711".
    if holes and len(holes) <= 3 and len(holes) * 10 <= hi - lo + 1:
        return f"{lo}-{hi} except {_fmt(_runs(holes))}"
    return plain


def ranks_phrase(ranks: Iterable[int], max_chars: int = 0) -> str:
    """``rank 2`` or ``ranks 0-1,3``.

    Args:
        max_chars: when above 0, the phrase is at most this long (unless that leaves no room
            for one run): the first runs, then how many more there are
            (``ranks 0-5,9,12 and 1,021 more of 1,031``).
    """
    ordered = sorted(set(ranks))
    word = "rank" if len(ordered) == 1 else "ranks"
    text = f"{word} {compress(ordered)}"
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    total = len(ordered)
    budget = max_chars - len(f"{word}  and {total:,} more of {total:,}")
    shown: list[str] = []
    used = count = 0
    for a, b in _runs(ordered):
        piece = str(a) if a == b else f"{a}-{b}"
        if shown and used + 1 + len(piece) > budget:
            break
        shown.append(piece)
        used += len(piece) + (1 if len(shown) > 1 else 0)
        count += b - a + 1
    return f"{word} {','.join(shown)} and {total - count:,} more of {total:,}"
