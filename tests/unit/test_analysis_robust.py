"""Odd but valid dumps never crash the analysis: it reports what it can."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from flightrec.analysis import analyze
from flightrec.analysis.loading.loader import Run
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import IS_P2P, SEND, DumpBuilder, EntryValues
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer

OPS = ["all_reduce", "broadcast", "send", "recv", "scatter", "all_to_all", ""]
STATES = [pb.STATE_UNKNOWN, pb.ENQUEUED, pb.STARTED, pb.COMPLETED, pb.FAILED]

entry = st.fixed_dictionaries(
    {
        "group": st.integers(0, 2),
        "op": st.sampled_from(OPS),
        "seq": st.integers(0, 6),
        "p2p_seq": st.integers(0, 3),
        "peer": st.integers(-1, 5),
        "state": st.sampled_from(STATES),
        "flags": st.sampled_from([0, IS_P2P, IS_P2P | SEND, pb.OBJECT_API, pb.COALESCED]),
        "shape": st.lists(st.integers(0, 4), max_size=3),
        "dtype": st.sampled_from(["float32", "float16", ""]),
        "enqueue_ns": st.integers(0, 10**10),
        "complete_ns": st.integers(0, 10**10),
    }
)
group = st.tuples(
    st.sampled_from(["0", "1", "x"]),
    st.lists(st.integers(0, 5), max_size=5),
    st.integers(0, 8),
    st.lists(st.tuples(st.integers(-1, 5), st.integers(0, 4), st.integers(0, 4)), max_size=2),
)
rank_dump = st.tuples(
    st.integers(0, 4),  # rank
    st.integers(0, 6),  # world size claimed
    st.lists(group, min_size=1, max_size=3),
    st.lists(entry, max_size=8),
    st.sampled_from([pb.WATCHDOG_TIMEOUT, pb.PROCESS_EXIT, pb.SIGNAL_TERM]),
    st.booleans(),  # has threads
)


def build(
    rank: int, world: int, groups: list, entries: list, reason: int, threads: bool
) -> pb.Dump:  # type: ignore[type-arg]
    b = DumpBuilder()
    b.header.rank, b.header.world_size, b.header.reason = rank, max(world, rank + 1), reason
    for name, ranks, last, p2p in groups:
        b.group(name, ranks, last_seq=last, p2p=p2p)
    for i, e in enumerate(entries):
        b.entry(
            EntryValues(
                record_id=i,
                group=min(e["group"], len(groups) - 1),
                op=e["op"],
                seq=e["seq"],
                p2p_seq=e["p2p_seq"],
                peer=e["peer"],
                state=e["state"],
                flags=e["flags"],
                enqueue_ns=e["enqueue_ns"],
                complete_ns=e["complete_ns"],
                stack=[("/x/train.py", "f", 3)] if i % 2 else [],
                inputs=[(tuple(e["shape"]), e["dtype"])],
            )
        )
    if threads:
        b.thread(1, "MainThread", [("/x/train.py", "main", 9)], is_main=True)
    return b.build()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rank_dump, min_size=1, max_size=5))
def test_analysis_never_raises(ranks: list) -> None:  # type: ignore[type-arg]
    dumps = {}
    for r, world, groups, entries, reason, threads in ranks:
        dumps[r] = RankDump(f"<{r}>", build(r, world, groups, entries, reason, threads))
    world = max(max(d.header.world_size for d in dumps.values()), max(dumps) + 1)
    report = analyze(Run(dumps, world, (), ()))
    rendered(JsonRenderer, report)
    TerminalRenderer(Console(file=io.StringIO(), width=80)).render(report)
    for f in report.findings:
        assert f.kind and isinstance(f.summary, str)
