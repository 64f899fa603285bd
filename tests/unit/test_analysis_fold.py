"""What the root cause explains is folded into it, never a finding that blames its victims
(issue 31): hand-built histories, one rule each."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from flightrec.analysis import analyze, analyze_dir
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.write import write_dump
from flightrec.report.json import report_to_dict
from flightrec.report.terminal import TerminalRenderer
from tests.unit.factories import Job, healthy
from tests.unit.test_analysis_outputs import _AGREED, _splits


def died_in_collective(dump: pb.Dump, message: str, at_s: float) -> pb.Dump:
    """``dump`` with a RuntimeError raised inside torch.distributed's all_reduce."""
    frames = []
    for file, name, line in [
        ("/site-packages/torch/distributed/distributed_c10d.py", "all_reduce", 2801),
        ("/job/train.py", "step", 22),
    ]:
        dump.strings.extend([file, name])
        frames.append(len(dump.frames))
        dump.frames.add(file=len(dump.strings) - 2, name=len(dump.strings) - 1, line=line)
    dump.stacks.add(frames=frames)
    dump.exceptions.add(
        type="RuntimeError", message=message, thread="MainThread", is_main=True,
        stack=len(dump.stacks) - 1, wall_time_ns=dump.header.wall_time_ns + int(at_s * 1e9),
        via="sys.excepthook",
    )  # fmt: skip
    return dump


def _text(report: object) -> str:
    out = StringIO()
    TerminalRenderer(Console(file=out, width=200, no_color=True)).render(report)  # type: ignore[arg-type]
    return out.getvalue()


def test_split_pairs_name_the_rank_in_every_pair_when_the_totals_do_not_add_up() -> None:
    # Rank 1 reuses last step's routing table: it sends and expects sizes its peers do not
    # (4 elements too many received in all): the totals cannot add up, but every pair that
    # disagrees has rank 1 in it.
    job = healthy(Job())
    job.collective("all_to_all_single", shape=(8, 2), complete=False)
    chunks = dict(_AGREED)
    chunks[1] = ([3, 1, 2, 2], [1, 2, 4, 4])
    _splits(job, chunks)
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (1,), "split_sizes")
    assert "cannot tell" not in first.summary
    assert {p.src for p in first.evidence.pairs} | {p.dst for p in first.evidence.pairs} >= {1}
    assert all(1 in (p.src, p.dst) for p in first.evidence.pairs)


def test_a_victim_of_the_mismatch_and_the_culprits_death_are_said_with_it(tmp_path: Path) -> None:
    # Rank 3 all-reduces float64; every rank then dies of a reset connection inside the
    # collective (gloo aborted one, the others lost their connections).
    job = healthy(Job())
    job.collective(complete=False, override={3: {"dtype": "float64"}})
    for r in range(4):
        write_dump(job.build(r), tmp_path, f"r{r}-0.frdump")
    for r in (0, 1, 2, 3):
        late = job.build(r, dump_index=1, reason=pb.PROCESS_EXIT, wall_offset_s=1)
        reset = died_in_collective(late, "Connection reset by peer", at_s=1)
        write_dump(reset, tmp_path, f"r{r}-1.frdump")
    report = analyze_dir(str(tmp_path))
    (first,) = report.findings
    assert (first.kind, first.ranks, first.field) == (FindingKind.MISMATCH, (3,), "dtype")
    assert first.summary.endswith("; rank 3 then died of RuntimeError"), first.summary
    folded = {r for x in first.explains for r in x.ranks}
    assert folded == {0, 1, 2, 3}
    data = report_to_dict(report)["findings"][0]
    assert {r for x in data["explains"] for r in x["ranks"]} == {0, 1, 2, 3}
    text = _text(report)
    assert "Explained by it" in text
    assert " wait in " not in text.split("Where every rank is")[1], text


def test_unmatched_transfers_and_desyncs_of_ranks_held_up_are_folded() -> None:
    # Rank 1 stalls; ranks 0, 2 and 3 wait in the world all_reduce. Before it, rank 2 sent
    # rank 3 a microbatch that rank 3 never received (it was held up first), and on group
    # [1, 3] rank 3 ran one collective ahead of the culprit.
    job = Job()
    side = job.group("5", [1, 3])
    healthy(job)
    job.collective(group=side)
    job.p2p(2, None, peer_of=(2, 3))
    job.collective(group=side, ranks=[3])
    job.collective(ranks=[0, 2, 3], complete=False)
    job.stall(1)
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.NOT_ARRIVED, (1,))]
    kinds = sorted(x.kind for x in findings[0].explains)
    assert kinds == [FindingKind.DESYNC, FindingKind.P2P_UNMATCHED], findings[0].explains


def test_an_unmatched_transfer_of_ranks_nothing_holds_stays_a_finding() -> None:
    # Group [0, 1] hangs on rank 1; ranks 2 and 3 are free, and rank 3 never received what
    # rank 2 sent it: that is nothing the hang explains.
    job = Job()
    low = job.group("1", [0, 1])
    healthy(job)
    job.p2p(2, None, peer_of=(2, 3))
    job.collective(group=low, ranks=[0], complete=False)
    job.stall(1)
    findings = analyze(job.run()).findings
    assert findings[0].kind == FindingKind.NOT_ARRIVED and findings[0].ranks == (1,)
    assert (FindingKind.P2P_UNMATCHED, (3,)) in [(f.kind, f.ranks) for f in findings[1:]]
    assert findings[0].explains == ()


def test_groups_without_a_description_are_named_by_their_members() -> None:
    job = Job()
    pair = job.group("4", [2, 3], desc="undefined")  # torch's word for "none given"
    healthy(job)
    job.collective(group=pair, ranks=[2], complete=False)
    job.stall(3)
    report = analyze(job.run())
    assert report.matched.groups["4"].label() == "group 4 [ranks 2-3]"
    assert "undefined" not in _text(report)


def test_a_transfer_wait_names_the_peer_not_the_group() -> None:
    job = healthy(Job())
    job.p2p(None, 3, peer_of=(2, 3), complete=False)
    job.stall(2)
    report = analyze(job.run())
    first = report.findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.ranks == (2,)
    assert "rank 3 waits in recv #1 from rank 2" in _text(report)
    (c,) = report_to_dict(report)["findings"][0]["consequences"]
    assert (c["sender"], c["receiver"], c["pg_ranks"]) == (2, 3, [2, 3])


def test_a_group_the_culprit_left_behind_is_folded_even_where_its_peer_is_free() -> None:
    # Group [0, 1] hangs on rank 1; on group [1, 2], rank 2 (free, waiting nowhere) ran one
    # collective further than rank 1 ever did: the culprit left that group behind.
    job = Job()
    low, side = job.group("1", [0, 1]), job.group("5", [1, 2])
    healthy(job)
    job.collective(group=side)
    job.collective(group=side, ranks=[2])
    job.collective(group=low, ranks=[0], complete=False)
    job.stall(1)
    findings = analyze(job.run()).findings
    assert [(f.kind, f.ranks) for f in findings] == [(FindingKind.NOT_ARRIVED, (1,))]
    assert [x.kind for x in findings[0].explains] == [FindingKind.DESYNC]


@pytest.mark.parametrize("blackbox", [False, True])
def test_the_deaths_an_extra_call_caused_are_folded_under_it(blackbox: bool) -> None:
    """DDP: rank 3 all-reduces one metric more than its peers (#11, where their gradient
    bucket is); gloo aborts rank 3 after it, and the connection it leaves resets its peers
    inside their next bucket all-reduce (#12), retired by PyTorch's recorder. Rank 1 still
    waits. The mismatch is the verdict, whatever waits more ranks hold at the death it led to;
    the deaths and the waits behind them are its own. ``blackbox``: rank 0 is read from its
    black box, which holds only what flightrec's hooks saw (none of the buckets: flightrec's
    DDP hook off) and torch's counter (12 issued)."""
    from flightrec.format.blackbox import DIED, SOURCE
    from tests.unit.factories import retired
    from tests.unit.test_analysis_failed import BACKWARD, ddp_job

    job = ddp_job(steps=10)
    job.collective(line=BACKWARD, function="main", flags=pb.DDP_BUCKET,
                   override={3: {"shape": (1,), "line": 43, "function": "log_metric"}},
                   complete=[0, 2, 3])  # fmt: skip
    job.collective(ranks=[0, 1, 2], line=BACKWARD, function="main", flags=pb.DDP_BUCKET,
                   complete=False)  # fmt: skip
    for r in (0, 2):
        retired(job, r, 2)
        job.died_of(r, message="Connection closed by peer", function="main", line=BACKWARD)
    if blackbox:
        job.ranks[0].entries.clear()
    dumps = {r: job.build(r) for r in range(4)}
    dumps[3].header.source, dumps[3].header.reason = SOURCE, pb.BLACKBOX
    dumps[3].header.reason_detail = DIED
    if blackbox:
        dumps[0].header.source, dumps[0].header.reason = SOURCE, pb.BLACKBOX
    from flightrec.analysis.loading.loader import Run
    from flightrec.analysis.model import RankDump

    run = Run({r: RankDump(f"<rank {r}>", d) for r, d in dumps.items()}, 4, (), ())
    report = analyze(run)
    first = report.findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.MISMATCH, (3,), 11), report.findings
    assert first.summary.endswith("; rank 3 then died"), first.summary
    assert len(report.findings) == 1, report.findings
    folded = {r for x in first.explains if x.kind == FindingKind.DEAD_RANK for r in x.ranks}
    assert folded == {0, 2, 3}, first.explains
    waits = {(c.seq, c.waiting) for c in first.consequences}
    # Rank 1 is held in #11, the mismatched call itself (its #12 is queued behind it); the
    # ranks that died in #12 waited there.
    assert (12, (2,) if blackbox else (0, 2)) in waits, first.consequences
