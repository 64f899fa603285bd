"""Every sample scenario recorded live: a real 4-rank gloo job traced by FLIGHTREC=1, then
`flightrec analyze` on its dumps must name the right culprit first.

The scenarios, the job and the ground truth are those of ``samples/generate.py``, which also
recorded the committed samples: this test proves that the recorder and analyzer of this tree
still produce those verdicts, not just that old dumps still parse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from samples.generate import SCENARIOS, Scenario, expected_json, record
from tests.integration.test_cli_analyze import flightrec

pytest.importorskip("torch")
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_live_scenario(scenario: Scenario, tmp_path: Path) -> None:
    folder = tmp_path / scenario.name
    record(scenario, folder)
    expected = expected_json(scenario)
    result = flightrec("analyze", folder, "--json")
    assert result.returncode == expected["exit_status"], (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    want = expected["first_finding"]
    if want is None:
        assert report["findings"] == []
        return
    first = report["findings"][0]
    assert (first["kind"], sorted(first["ranks"])) == (want["kind"], want["ranks"]), first[
        "summary"
    ]
    for key, value in want.items():
        assert first[key] == value, (key, first["summary"])
    # The terminal report leads with the same verdict.
    text = flightrec("analyze", folder).stdout
    assert text.splitlines()[0].strip("╭─ ").startswith(f"Verdict: {want['kind']}")
