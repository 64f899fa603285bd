"""One hang, one verdict: when a later round's report may print a panel of its own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from flightrec.analysis.model import Finding, FindingKind
from flightrec.live.rounds import Verdict, decode, from_finding, same_hang, standing_line

HANG = Finding(
    FindingKind.NOT_ARRIVED, (2,), "Rank 2 never entered all_reduce #5 on group 0 | line 3",
    process_group="0", seq=5,
)  # fmt: skip


def report(*findings: Finding, missing: tuple[int, ...] = ()) -> Any:
    """What ``same_hang`` reads of a Report: its findings and the ranks without a dump."""
    return SimpleNamespace(findings=list(findings), run=SimpleNamespace(missing_ranks=missing))


def test_the_verdict_kept_in_the_store_reads_back_and_refuses_garbage() -> None:
    kept = from_finding(1, HANG)
    assert decode(kept.encode().encode()) == kept
    assert "|" not in kept.summary  # the separator never leaks from a summary
    for raw in (b"", b"x|not_arrived|2|0|5|s", b"1|no_such_kind|2|0|5|s", b"1|stuck|a|0|5|s"):
        assert decode(raw) is None, raw


def test_a_later_round_never_contradicts_the_hang_with_a_missing_dump() -> None:
    before = from_finding(1, HANG)
    missing = Finding(FindingKind.MISSING_DUMP, (3,), "Rank 3 left no dump")
    assert same_hang(report(missing), before)
    assert same_hang(report(HANG), before)
    assert same_hang(report(), before)
    other = Finding(FindingKind.NOT_ARRIVED, (1,), "Rank 1 ...", process_group="0", seq=9)
    assert same_hang(report(other, missing=(3,)), before)  # incomplete: cannot overrule
    assert not same_hang(report(other), before)  # another hang, every rank answered


def test_the_standing_line_says_what_happened_since() -> None:
    before = Verdict(1, "not_arrived", (2,), "0", 5, "Rank 2 never entered all_reduce #5")
    line = standing_line(2, "stopped by SIGTERM", 3, 4, before, frozenset({0}), frozenset())
    assert line == (
        "flightrec verdict: request 2 (stopped by SIGTERM, 3 of 4 ranks answered): the verdict "
        "of request 1 stands: not_arrived: Rank 2 never entered all_reduce #5; rank 0 died "
        "since\n"
    )
