"""Every line of the verdict in the job's log stays under ``verdict.MAX_LINE`` characters,
however large the job and however scattered its rank sets: log pipelines split long lines."""

from __future__ import annotations

import random

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.progress import encode_progress, progress, record_of
from flightrec.format.summary import encode, summarize
from flightrec.live import verdict
from flightrec.live.frontier import find_frontier
from flightrec.live.rounds import Verdict, standing_line
from flightrec.simulate.faults import Fault
from flightrec.simulate.job import SimConfig, build_rank_dump, plan
from flightrec.simulate.layout import parse_layout
from flightrec.text import ranks_phrase

WORLD = 1024


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_large_jobs_verdict_has_no_line_over_the_limit() -> None:
    """A simulated 1,024-rank stall where a random quarter of the ranks answered with their
    progress only and a few never answered: every rank set in the text is scattered."""
    sim = plan(SimConfig(parse_layout("tp=8,pp=8", WORLD), entries=64, fault=Fault.STALL,
                         fault_rank=341))  # fmt: skip
    pick = random.Random(7)
    silent = set(pick.sample(range(WORLD), 40)) - {341}
    records, summaries = {}, {}
    for rank in range(WORLD):
        if rank in silent:
            continue
        dump = build_rank_dump(sim, rank)
        records[rank] = encode_progress(progress(dump, 2))
        if pick.random() < 0.75:
            path = f"/scratch/{'deep/' * 40}{dump.header.hostname}/rank{rank:06d}.frdump"
            summaries[rank] = encode(summarize(dump, 2, path))
    chosen = verdict.select(records, 2, WORLD)
    assert chosen.frontier is not None
    raw = {r: summaries[r] for r in chosen.ranks if r in summaries}
    text = verdict.render(raw, 2, "WATCHDOG_TIMEOUT", WORLD, 1.7, selection=chosen)
    assert "Rank 341" in text, text
    assert "members shown: only the" in text, text  # the group table says what it shows
    assert widest(text) <= verdict.MAX_LINE, max(text.splitlines(), key=len)
    # Every answering rank not read in detail is still accounted for, in a summarised line.
    assert "more of" in text, text


def test_where_every_rank_is_stays_short_for_scattered_classes() -> None:
    """131,072 ranks whose wait classes interleave: each class is thousands of runs."""
    pick = random.Random(3)
    records = {}
    for rank in range(131_072):
        p = pb.Progress(rank=rank, round=1, world_size=131_072)
        where = pick.randrange(3)
        if where:
            p.group.append("0")
            p.issued.append(10 + where)
            p.size.append(131_072)
            p.wait_group, p.wait_seq, p.wait_op = 1, 10 + where, "all_reduce"
        records[rank] = record_of(p)
    where = find_frontier(records).where
    assert where and all(len(f"  {line}") <= verdict.MAX_LINE for line in where), where


def test_the_dump_lines_and_a_standing_verdict_stay_short() -> None:
    scattered = list(range(0, 131_072, 3)) + list(range(1, 131_072, 7))
    lines = verdict.dump_lines({}, 131_072, exited=frozenset(range(2, 131_072, 5)))
    assert max(len(line) for line in lines) <= verdict.MAX_LINE, lines
    before = Verdict(1, "not_arrived", (5,), "0", 12, "Rank 5 (node0001) never entered " * 20)
    line = standing_line(
        2, "hang declared again", 131_000, 131_072, before, frozenset(scattered),
        frozenset(range(5, 131_072, 11)),
    )  # fmt: skip
    assert len(line.rstrip("\n")) <= verdict.MAX_LINE, line


def test_a_capped_rank_phrase_says_how_many_it_leaves_out() -> None:
    ranks = [r for r in range(10_000) if r % 4]
    text = ranks_phrase(ranks, 60)
    assert len(text) <= 60 and text.startswith("ranks 1-3,5-7") and text.endswith("of 7,500")
    assert ranks_phrase([1, 2, 3], 60) == "ranks 1-3"
