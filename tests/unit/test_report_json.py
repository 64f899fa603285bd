"""The JSON report follows docs/design.md's contract."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from flightrec.analysis import analyze
from flightrec.analysis.model import CallShift, Evidence, Finding, FindingKind, FrameInfo
from flightrec.report.json import SCHEMA, JsonRenderer, finding_to_dict
from flightrec.report.renderer import rendered
from tests.unit.factories import Job, healthy


def test_healthy_report_has_empty_findings() -> None:
    data = json.loads(rendered(JsonRenderer, analyze(healthy(Job()).run())))
    assert data["schema"] == SCHEMA == "flightrec.report/1"
    assert data["world_size"] == 4 and data["ranks_with_dump"] == [0, 1, 2, 3]
    assert data["findings"] == []


def test_finding_carries_every_contract_field() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    data = json.loads(rendered(JsonRenderer, analyze(job.run(ranks=[0, 1, 2])), indent=2))
    first = data["findings"][0]
    assert {k: first[k] for k in ("kind", "ranks", "process_group", "pg_ranks", "seq", "op")} == {
        "kind": "not_arrived",
        "ranks": [2],
        "process_group": "0",
        "pg_ranks": [0, 1, 2, 3],
        "seq": 4,
        "op": "all_reduce",
    }
    assert isinstance(first["summary"], str) and "\n" not in first["summary"]
    assert first["consequences"][0]["waiting_ranks"] == [0, 1]
    assert first["evidence"]["culprits"]["2"]["location"]["function"] == "load_batch"
    assert data["missing_ranks"] == [3]
    # Rank 3 has no dump; it is in the wait too (waited on by ranks 0,1) but rank 2 is first.
    assert [f["kind"] for f in data["findings"]] == ["not_arrived", "missing_dump"]


def test_mismatch_has_field() -> None:
    job = healthy(Job())
    job.collective(complete=False, override={2: {"dtype": "float64"}})
    first = json.loads(rendered(JsonRenderer, analyze(job.run())))["findings"][0]
    assert (first["kind"], first["field"], first["ranks"]) == ("mismatch", "dtype", [2])


@dataclass(frozen=True, slots=True)
class _NewEvidence(Evidence):
    """What a new kind's pass would define: the renderer is told nothing about it."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("score",)

    score: float
    where: FrameInfo | None
    per_rank: Mapping[int, tuple[int, ...]]
    note: str | None = None
    extra: str | None = None


def test_any_evidence_is_written_field_by_field() -> None:
    evidence = _NewEvidence(score=0.5, where=None, per_rank={3: (1, 2)}, extra="set", note=None)
    shift = CallShift(7, "skipped", "a.py:1", "a.py:2", None)
    f = Finding(FindingKind.STUCK, (3,), "one line", evidence=evidence, call_shift=shift)
    out = finding_to_dict(f)
    assert out["score"] == 0.5  # a headline field, next to the verdict
    # Fields in order; a required None is written, an optional one only when set; mapping
    # keys as strings, tuples as lists; the call shift last.
    assert list(out["evidence"]) == ["score", "where", "per_rank", "extra", "call_shift"]
    assert out["evidence"]["where"] is None and out["evidence"]["per_rank"] == {"3": [1, 2]}
    assert out["evidence"]["call_shift"] == {
        "seq": 7,
        "kind": "skipped",
        "peer_site": "a.py:1",
        "rank_site": "a.py:2",
        "op": None,
    }
    frame = FrameInfo("train.py", "step", 3)
    assert finding_to_dict(
        Finding(FindingKind.STUCK, (3,), "s", evidence=_NewEvidence(1.0, frame, {}))
    )["evidence"]["where"] == {"file": "train.py", "function": "step", "line": 3}


def test_compact_report_spells_long_rank_lists_as_ranges_and_gives_evidence_on_request() -> None:
    job = healthy(Job(world_size=40))
    job.collective(ranks=[r for r in range(40) if r != 17], complete=False)
    job.stall(17)
    report = analyze(job.run(ranks=[r for r in range(40) if r != 39]))
    data = json.loads(rendered(JsonRenderer, report, compact=True, ranks=(3,)))
    assert data["ranks_with_dump"] == "0-38" and data["missing_ranks"] == [39]
    assert "dumps" not in data and data["dump_count"] == 39
    first = data["findings"][0]
    assert first["ranks"] == [17] and first["pg_ranks"] == "0-39"
    assert first["consequences"][0]["waiting_ranks"] == "0-38 except 17"
    evidence = {e["rank"]: e for e in data["rank_evidence"]}
    assert set(evidence) == {3, 17, 39}  # asked for, and blamed (39 left no dump)
    assert evidence[17]["blamed_by"] == [0] and evidence[3]["blamed_by"] == []
    assert evidence[39]["dump"] is None and evidence[39]["blamed_by"]
    assert evidence[3]["state"]["status"] == "waiting" and evidence[3]["dump"] == "<rank 3>"
    assert "load_batch" in evidence[17]["where"]
    # The full report of the same run still lists every rank.
    full = json.loads(rendered(JsonRenderer, report))
    assert full["ranks_with_dump"] == list(range(39)) and len(full["dumps"]) == 39
