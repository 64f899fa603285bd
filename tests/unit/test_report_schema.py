"""docs/report-schema.json describes what ``flightrec analyze --json`` prints for every sample."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flightrec_cli import exiting
from flightrec_cli.app import app
from typer.testing import CliRunner

from flightrec.analysis import FindingKind
from flightrec.report.json import SCHEMA

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "docs" / "report-schema.json"
SAMPLES = sorted(
    p.parent.relative_to(REPO)
    for p in [*REPO.glob("samples/*/expected.json"), *REPO.glob("samples/native/*/expected.json")]
)


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _analyze(sample: Path, *options: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, Any]:
    """``flightrec analyze SAMPLE --json OPTIONS`` in this process: (exit status, report)."""
    monkeypatch.chdir(REPO)
    # The command asks app.main to skip the interpreter's teardown; only main acts on it.
    monkeypatch.setattr(exiting, "_skip", False)
    result = CliRunner().invoke(app, ["analyze", str(sample), "--json", *options])
    return result.exit_code, json.loads(result.stdout)


def _errors(validator: jsonschema.protocols.Validator, report: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(report)]


def test_every_sample_is_checked() -> None:
    assert len(SAMPLES) >= 19
    assert Path("samples/stalled_rank") in SAMPLES and Path("samples/native/hang") in SAMPLES


@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_a_samples_report_follows_the_schema(
    validator: jsonschema.protocols.Validator,
    monkeypatch: pytest.MonkeyPatch,
    sample: Path,
    compact: bool,
) -> None:
    options = ("--compact", "--rank", "0") if compact else ()
    status, report = _analyze(sample, *options, monkeypatch=monkeypatch)
    expected = json.loads((REPO / sample / "expected.json").read_text(encoding="utf-8"))
    assert status == expected["exit_status"]
    assert report["schema"] == SCHEMA
    assert _errors(validator, report) == []


def test_the_schema_names_every_finding_kind() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert set(schema["$defs"]["kind"]["examples"]) == {k.value for k in FindingKind}


@pytest.fixture(scope="module")
def stalled() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        status, report = _analyze(Path("samples/stalled_rank"), monkeypatch=mp)
    assert status == 1 and report["findings"]
    return report


def _set(report: Any, path: str, value: Any) -> Any:
    """A copy of ``report`` with the value at ``path`` (dots; ``-`` deletes) replaced."""
    out = copy.deepcopy(report)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value == "-":
        del node[last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return out


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("schema", "flightrec.report/2"),
        ("findings", "-"),
        ("notes", "-"),
        ("world_size", "4"),
        ("ranks_with_dump", [0, "1"]),
        ("ranks_with_dump", "0-3 and more"),
        ("dumps", "-"),
        ("findings.0.kind", "Not Arrived"),
        ("findings.0.ranks", [-1]),
        ("findings.0.summary", "-"),
        ("findings.0.seq", "4"),
        ("findings.0.kind", "mismatch"),
        ("findings.0.consequences.0.waited_s", "2 s"),
        ("findings.0.consequences.0.waiting_ranks", "-"),
        ("findings.0.evidence.waiting_ranks", {"0": 1}),
        ("findings.0.evidence.culprits.2.stack.0.line", "52"),
        ("findings.0.evidence.culprits.2.pid", "-"),
        ("findings.0.evidence.confidence", "medium"),
        ("findings.0.evidence.longest_wait_s", 3.0),
        ("problems", [{"path": "x"}]),
        ("rank_evidence", []),
    ],
)
def test_a_report_that_breaks_the_contract_fails(
    validator: jsonschema.protocols.Validator, stalled: Any, path: str, value: Any
) -> None:
    assert _errors(validator, stalled) == []
    assert _errors(validator, _set(stalled, path, value)) != []


def test_new_fields_are_allowed(validator: jsonschema.protocols.Validator, stalled: Any) -> None:
    grown = _set(stalled, "findings.0.evidence.new_fact", {"any": "shape"})
    grown = _set(grown, "findings.0.kind", "a_kind_added_later")
    assert _errors(validator, _set(grown, "html_report", "report.html")) == []
