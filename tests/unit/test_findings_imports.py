"""Who may import a finding module: the pipeline that runs them and the verdict stages that
weigh and refine their findings. Everything else (the rank states, the renderers, the in-job
verdict, the finding modules themselves) reads the shared facts under ``analysis/facts/``, so
that following one dump through the analysis never loops back into a finding module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = "flightrec.analysis.findings"
ALLOWED = ("flightrec/analysis/pipeline.py", "flightrec/analysis/verdict/")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, wherever it is written."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _finding_module_imports(top: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(top.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for line, module in _imports(path):
            if module.startswith(f"{FINDINGS}."):
                found.append(f"{rel}:{line}: imports {module}")
    return found


def test_only_the_pipeline_and_the_verdict_import_finding_modules() -> None:
    problems = _finding_module_imports(ROOT / "flightrec") + _finding_module_imports(ROOT / "cli")
    assert not problems, "\n".join(problems)


def test_the_scan_sees_an_import_of_a_finding_module(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        "from flightrec.analysis.findings.crashes import died_of\n"
        "def f():\n"
        "    import flightrec.analysis.findings.stacks\n"
    )
    assert [m for _, m in _imports(stray) if m.startswith(f"{FINDINGS}.")] == [
        "flightrec.analysis.findings.crashes",
        "flightrec.analysis.findings.crashes.died_of",
        "flightrec.analysis.findings.stacks",
    ]
