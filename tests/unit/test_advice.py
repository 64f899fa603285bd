"""What to do next: every finding says restart or fix the code, and how sure it is."""

from __future__ import annotations

import io
import json

from rich.console import Console

from flightrec.analysis import analyze
from flightrec.analysis.model import Action, FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import rendered
from flightrec.report.terminal import TerminalRenderer
from tests.unit.factories import Job, healthy


def _stalled(world: int = 4) -> Job:
    job = healthy(Job(world_size=world))
    job.collective(ranks=[r for r in range(world) if r != 2], complete=False)
    job.stall(2, "load_batch", 18)
    return job


def test_a_stalled_rank_is_a_restart_with_high_confidence() -> None:
    report = analyze(_stalled().run())
    (first,) = report.findings
    assert first.kind == FindingKind.NOT_ARRIVED and first.advice is not None
    assert (first.advice.action, first.advice.confidence) == (Action.RESTART, "high")
    assert first.advice.why.startswith("rank 2 stopped outside the collective")
    out = io.StringIO()
    TerminalRenderer(Console(file=out, width=100, color_system=None)).render(report)
    text = out.getvalue()
    assert "Next: restart the job: rank 2 stopped outside" in text
    assert "Confidence: high" in text
    data = json.loads(rendered(JsonRenderer, report))["findings"][0]["recommendation"]
    assert data["action"] == "restart" and data["confidence"] == "high"
    assert "lowered_by" not in data


def test_a_mismatch_is_fixed_in_the_code() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={3: {"shape": (2,)}})
    (first,) = analyze(job.run()).findings
    assert first.kind == FindingKind.MISMATCH and first.advice is not None
    assert first.advice.action is Action.FIX_CODE


def test_missing_dumps_lower_the_confidence() -> None:
    # Rank 2 stalls; rank 3 left no dump.
    run = _stalled(5).run(ranks=[0, 1, 2, 4])
    first = analyze(run).findings[0]
    assert first.kind == FindingKind.NOT_ARRIVED and first.advice is not None
    assert first.advice.confidence == "medium"
    assert first.advice.lowered_by == ("no dump from rank 3",)


def test_a_ring_that_wrapped_past_the_collective_lowers_the_confidence() -> None:
    # Rank 3 passed a tensor of another shape to all_reduce #2; rank 0's ring no longer holds
    # #1 and #2 (it wrapped): what rank 0 passed there is not known.
    job = Job()
    job.collective()
    job.collective(override={3: {"shape": (2,)}})
    job.collective()
    job.collective()
    job.ranks[0].entries = job.ranks[0].entries[2:]
    first = analyze(job.run()).findings[0]
    assert (first.kind, first.ranks, first.seq) == (FindingKind.MISMATCH, (3,), 2)
    assert first.advice is not None and first.advice.action is Action.FIX_CODE
    assert first.advice.lowered_by == ("the ring of rank 0 wrapped past all_reduce #2",)
    assert first.advice.confidence == "medium"


def test_a_snapshot_before_the_timeout_is_low_confidence() -> None:
    run = _stalled().run()
    for d in run.dumps.values():
        d.header.reason = pb.CLI_TRIGGER
        d.header.timeout_s = 600.0
    (first,) = analyze(run).findings
    assert first.advice is not None and first.advice.confidence == "low"
    assert "shorter than the 600 s timeout" in first.advice.lowered_by[-1]
