"""Every committed sample folder, through the real CLI, against its expected.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_cli_analyze import flightrec

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p.parent for p in (ROOT / "samples").rglob("expected.json"))


@pytest.mark.skipif(not SAMPLES, reason="no sample folders committed yet")
@pytest.mark.parametrize("folder", SAMPLES, ids=[str(p.relative_to(ROOT)) for p in SAMPLES])
def test_sample_verdict(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    result = flightrec("analyze", folder, "--json")
    assert result.returncode == expected["exit_status"], result.stderr
    report = json.loads(result.stdout)
    assert report["world_size"] == expected["world_size"]
    want = expected["first_finding"]
    if want is None:
        assert report["findings"] == []
        return
    first = report["findings"][0]
    assert first["kind"] == want["kind"], first["summary"]
    assert first["ranks"] == want["ranks"], first["summary"]
    for key in ("process_group", "seq", "op", "field"):
        if key in want:
            assert first[key] == want[key], (key, first["summary"])
