"""The kinds table: every finding kind has a row, the one candidate module that makes it, the
finder the pipeline runs for it in the row's order, and a scenario test; the simulator's
faults say which kind they end in, and docs/analysis.md lists the kinds in the table's order,
so that adding a kind without one of them fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import flightrec.analysis.findings as findings_pkg
from flightrec.analysis import pipeline
from flightrec.analysis.candidates import Histories
from flightrec.analysis.kinds import KINDS, KindSpec, by_order, kind_of_fault, kinds_where
from flightrec.analysis.matching.matching import match
from flightrec.analysis.model import Finding, FindingKind
from flightrec.analysis.timing.clocks import Clocks
from flightrec.simulate.faults import Fault
from flightrec.simulate.job import expected_kind
from tests.unit.factories import Job, healthy

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FINDINGS = Path(findings_pkg.__path__[0])


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
        assert spec.made_by in modules, f"{kind}: no module findings/{spec.made_by}.py"
        assert kind in modules[spec.made_by], (
            f"findings/{spec.made_by}.py does not list {kind} in KINDS"
        )
    for name, kinds in modules.items():
        assert kinds, f"findings/{name}.py makes no kind (its KINDS is missing or empty)"
        for kind in kinds:
            assert KINDS[kind].made_by == name, f"{kind}'s row does not name findings/{name}.py"


def _kinds_in(node: ast.expr, scope: ast.AST) -> set[str] | None:
    """The ``FindingKind`` members ``node`` can be: a member, a choice between members, or a
    local variable assigned members in ``scope``; None for anything else."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "FindingKind"
    ):
        return {node.attr}
    if isinstance(node, ast.IfExp):
        a, b = _kinds_in(node.body, scope), _kinds_in(node.orelse, scope)
        return None if a is None or b is None else a | b
    if isinstance(node, ast.Name):
        out: set[str] = set()
        for a in ast.walk(scope):
            if isinstance(a, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in a.targets
            ):
                got = _kinds_in(a.value, scope)
                if got is None:
                    return None
                out |= got
        return out or None
    return None


def _built_kinds(path: Path) -> tuple[dict[str, list[int]], list[str]]:
    """Per kind, the lines of ``path`` that build a ``Finding`` of it; and what the scan
    cannot tell (a kind it cannot resolve, a kind changed by ``replace``)."""
    tree = ast.parse(path.read_text(), str(path))
    built: dict[str, list[int]] = defaultdict(list)
    unclear: list[str] = []
    scopes: list[ast.AST] = [tree]

    def visit(node: ast.AST) -> None:
        is_scope = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if is_scope:
            scopes.append(node)
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            kind_arg = next((k.value for k in node.keywords if k.arg == "kind"), None)
            if name == "Finding":
                arg = kind_arg if kind_arg is not None else (node.args[0] if node.args else None)
                kinds = _kinds_in(arg, scopes[-1]) if arg is not None else None
                if kinds is None:
                    unclear.append(
                        f"{path}:{node.lineno}: a Finding whose kind the scan cannot read"
                    )
                for k in kinds or ():
                    built[k].append(node.lineno)
            elif name == "replace" and kind_arg is not None:
                unclear.append(f"{path}:{node.lineno}: replace() changes a finding's kind")
        for child in ast.iter_child_nodes(node):
            visit(child)
        if is_scope:
            scopes.pop()

    visit(tree)
    return built, unclear


def _sources() -> list[Path]:
    return sorted(
        p
        for top in ("flightrec", "cli")
        for p in (ROOT / top).rglob("*.py")
        if "_pb2" not in p.name
    )


def test_only_the_module_its_row_names_builds_a_kind() -> None:
    # A kind's findings are built in one place: another module that finds facts about it
    # hands them to that one (crashes' exits and stuck's late arrivals, for instance).
    modules = _candidate_modules()
    problems: list[str] = []
    by_module: dict[str, set[str]] = defaultdict(set)
    for path in _sources():
        built, unclear = _built_kinds(path)
        problems += unclear
        for kind, lines in built.items():
            owner = KINDS[FindingKind[kind]].made_by
            if path.parent != FINDINGS or path.stem != owner:
                problems += [
                    f"{path}:{n}: builds {kind}, which findings/{owner}.py makes" for n in lines
                ]
            else:
                by_module[owner].add(kind)
    assert not problems, "\n".join(problems)
    for name, kinds in modules.items():
        assert by_module[name] == {k.name for k in kinds}, (
            f"findings/{name}.py: KINDS is not what it builds"
        )


def test_the_scan_sees_a_kind_built_elsewhere(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        "def f(x):\n"
        "    kind = FindingKind.STUCK if x else FindingKind.DEAD_RANK\n"
        "    a = Finding(kind=kind, ranks=(), summary='')\n"
        "    b = model.Finding(FindingKind.DESYNC, (), '')\n"
        "    return replace(a, kind=FindingKind.MISMATCH), Finding(kind=pick(x), ranks=(), summary='')\n"
    )
    built, unclear = _built_kinds(stray)
    assert {k: len(v) for k, v in built.items()} == {"STUCK": 1, "DEAD_RANK": 1, "DESYNC": 1}
    assert len(unclear) == 2


def test_every_simulated_fault_names_the_kind_it_ends_in() -> None:
    named = [f for spec in KINDS.values() for f in spec.simulated_by]
    assert len(named) == len(set(named)), "a fault is named by two rows"
    assert set(named) == {f.value for f in Fault} - {Fault.NONE.value}
    assert kind_of_fault(Fault.NONE.value) is None
    assert expected_kind(Fault.STALL) == FindingKind.NOT_ARRIVED.value
    assert expected_kind(Fault.CRASH) == FindingKind.MISSING_DUMP.value
    with pytest.raises(ValueError, match="none"):
        expected_kind(Fault.NONE)


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
    assert kinds_where("marks_lanes") == {FindingKind.STRAGGLER, FindingKind.SLOW_STAGE}
    slowness = {FindingKind.STRAGGLER, FindingKind.SLOW_STAGE, FindingKind.IMBALANCE}
    assert slowness.isdisjoint(kinds_where("hang") | kinds_where("root_cause"))
    assert kinds_where("root_cause").isdisjoint(kinds_where("out_of_step"))
    # A rank that is gone is why its peers wait: the kinds that say so are root causes.
    assert kinds_where("gone") == {FindingKind.DEAD_RANK, FindingKind.MISSING_DUMP}
    assert kinds_where("gone") <= kinds_where("root_cause")


def test_every_finder_is_a_function_of_its_module_taking_the_stages_and_the_findings_above() -> (
    None
):
    for kind, spec in KINDS.items():
        if not spec.finder:
            assert spec.order == 0 and spec.root_cause, (
                f"{kind}: no finder, yet not the arbitration's"
            )
            continue
        find = pipeline.finder_of(spec)
        assert find.__module__ == f"{findings_pkg.__name__}.{spec.made_by}"
        params = list(inspect.signature(find).parameters.values())
        # (annotations are strings: ``from __future__ import annotations``)
        want = "Histories" if spec.beside else "Stages"
        assert [p.annotation for p in params[:2]] == [want, "Sequence[Finding]"], (
            f"{kind}: {spec.finder} must take ({want}, Sequence[Finding])"
        )
        assert all(p.default is not inspect.Parameter.empty for p in params[2:])


def test_the_rows_are_in_the_order_the_pipeline_runs_them() -> None:
    orders = [spec.order for spec in by_order()]
    assert orders == sorted(set(orders)) and orders[0] >= 1, "two finders share an order"
    # The table reads in run order: the arbitration's kinds, then each finder's.
    assert [s.order for s in KINDS.values()] == sorted(s.order for s in KINDS.values())
    # The beside kinds run as one lane: nothing runs between them.
    beside = [i for i, spec in enumerate(by_order()) if spec.beside]
    assert beside == list(range(beside[0], beside[-1] + 1))


def _documented_kinds() -> list[tuple[str, str]]:
    """(kind, finder) per row of docs/analysis.md's table of finding kinds."""
    text = (ROOT / "docs" / "analysis.md").read_text()
    section = text.split("## Finding kinds", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_0-9]+)` \| ([^|]+?) \|", section, re.M)


def test_the_docs_list_the_kinds_and_their_finders_in_the_tables_order() -> None:
    assert _documented_kinds() == [
        (kind.value, f"`{s.made_by}.{s.finder}`" if s.finder else "(the arbitration alone)")
        for kind, s in KINDS.items()
    ], "docs/analysis.md's 'Finding kinds' table must list every kind as kinds.KINDS does"


def _stalled() -> Job:
    job = healthy(Job(world_size=4))
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2, "load_batch", 18)
    return job


def test_diagnose_runs_each_finder_in_the_tables_order_with_the_findings_above(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[FindingKind, tuple[FindingKind, ...]]] = []

    def recording(spec: KindSpec) -> Callable[..., list[Finding]]:
        def find(stages: Histories, above: Sequence[Finding]) -> list[Finding]:
            calls.append((spec.kind, tuple(f.kind for f in above)))
            return [Finding(kind=spec.kind, ranks=(), summary=spec.kind.value)]

        return find

    monkeypatch.setattr(pipeline, "finder_of", recording)
    m = match(_stalled().run())
    pipeline.diagnose(m, Clocks(m))
    rows = by_order()
    assert [kind for kind, _ in calls] == [spec.kind for spec in rows]
    roots = (FindingKind.NOT_ARRIVED,)
    for (kind, above), spec in zip(calls, rows, strict=True):
        # A beside finder sees the beside findings above it alone, however it runs.
        lane = [s.kind for s in rows if s.beside == spec.beside and s.order < spec.order]
        before = [s.kind for s in rows if s.order < spec.order]
        assert list(above) == (lane if spec.beside else [*roots, *before]), kind
