"""The kinds table: every finding kind has a row, a candidate module that makes it and a
scenario test, so that adding a kind without one of them fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import flightrec.analysis.findings as findings_pkg
from flightrec.analysis.kinds import KINDS, kinds_where
from flightrec.analysis.model import FindingKind

TESTS = Path(__file__).resolve().parents[1]


def _candidate_modules() -> dict[str, tuple[FindingKind, ...]]:
    out: dict[str, tuple[FindingKind, ...]] = {}
    for info in pkgutil.iter_modules(findings_pkg.__path__):
        module = importlib.import_module(f"{findings_pkg.__name__}.{info.name}")
        out[info.name] = tuple(getattr(module, "KINDS", ()))
    return out


def test_every_kind_has_a_row() -> None:
    assert set(KINDS) == set(FindingKind)
    assert all(spec.kind is kind for kind, spec in KINDS.items())


def test_every_kind_is_made_by_a_candidate_module_that_says_so() -> None:
    modules = _candidate_modules()
    for kind, spec in KINDS.items():
        assert spec.made_by, f"{kind}: no candidate module"
        for name in spec.made_by:
            assert name in modules, f"{kind}: no module findings/{name}.py"
            assert kind in modules[name], f"findings/{name}.py does not list {kind} in KINDS"
    for name, kinds in modules.items():
        assert kinds, f"findings/{name}.py makes no kind (its KINDS is missing or empty)"
        for kind in kinds:
            assert name in KINDS[kind].made_by, f"{kind}'s row does not name findings/{name}.py"


def test_every_kind_has_a_scenario_test() -> None:
    sources = [
        p.read_text()
        for p in TESTS.rglob("test_*.py")
        if p.name != Path(__file__).name and p.parent.name in ("unit", "integration")
    ]
    for kind in FindingKind:
        said = re.compile(rf"FindingKind\.{kind.name}\b|[\"']{kind.value}[\"']")
        assert any(said.search(s) for s in sources), f"{kind}: no test names it"


def test_traits_read_by_the_refinements() -> None:
    # A mismatch is wrong however short the wait; a straggler is no hang.
    assert not KINDS[FindingKind.MISMATCH].low_confidence_below_timeout
    assert kinds_where("marks_lanes") == {FindingKind.STRAGGLER}
    assert FindingKind.STRAGGLER not in kinds_where("hang")
    assert kinds_where("root_cause").isdisjoint(kinds_where("out_of_step"))
