"""The JSON report follows DESIGN.md's contract."""

from __future__ import annotations

import json

from flightrec.analysis import analyze
from flightrec.report.json import SCHEMA, JsonRenderer
from tests.unit.factories import Job, healthy


def test_healthy_report_has_empty_findings() -> None:
    data = json.loads(JsonRenderer().render(analyze(healthy(Job()).run())))
    assert data["schema"] == SCHEMA == "flightrec.report/1"
    assert data["world_size"] == 4 and data["ranks_with_dump"] == [0, 1, 2, 3]
    assert data["findings"] == []


def test_finding_carries_every_contract_field() -> None:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    data = json.loads(JsonRenderer(indent=2).render(analyze(job.run(ranks=[0, 1, 2]))))
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
    first = json.loads(JsonRenderer().render(analyze(job.run())))["findings"][0]
    assert (first["kind"], first["field"], first["ranks"]) == ("mismatch", "dtype", [2])
