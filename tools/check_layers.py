"""Check that flightrec's layers import downward only and that no package imports in a circle.

Run from anywhere: ``python tools/check_layers.py`` (``--root DIR`` checks another tree). It
reads every module of ``flightrec/`` and ``cli/flightrec_cli/`` with ``ast`` (nothing is
imported or executed) and prints one line per problem, then exits 1; with none it prints one
line and exits 0. Three kinds of problem:

- an import that runs up or across the layers (``LAYERS`` below, docs/design.md "Layers");
- a module of ``flightrec/`` in a package ``LAYERS`` does not name (say where it belongs);
- a circle of imports among the modules of one package (subpackages included), unless every
  module of it is in one of the known circles listed in ``tools/known_import_cycles.txt``.

Every import counts, wherever it is written: at module level, inside a function (a lazy import
is still a dependency) and under ``if TYPE_CHECKING:`` (a type is part of a module's contract).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

BASE = "base"
TOP = "flightrec"
CLI = "cli"

LAYERS: dict[str, frozenset[str]] = {
    # The shared helpers every layer may use: text phrasing, the error hierarchy, frame rules.
    BASE: frozenset(),
    # The dump format knows nothing of who writes or reads it.
    "format": frozenset({BASE}),
    # The training side; it never sees the readers or the analysis.
    "recorder": frozenset({"format", BASE}),
    # Every file format -> DumpView.
    "readers": frozenset({"format", BASE}),
    "analysis": frozenset({"readers", "format", BASE}),
    "report": frozenset({"analysis", "readers", "format", BASE}),
    # `flightrec attach`: snapshots of a running job taken from outside; it writes dumps and
    # reads torch's ring as a native dump, and never needs the analysis.
    "attach": frozenset({"readers", "format", BASE}),
    # Writes dumps of made-up jobs and names the finding each fault must give.
    "simulate": frozenset({"analysis", "readers", "format", BASE}),
    # The verdict in the job's log: the one place where the recorder and the analysis meet,
    # loaded by the recorder only through the reporter that `flightrec.enable` hands it.
    "live": frozenset({"recorder", "report", "analysis", "readers", "format", BASE}),
    # flightrec/__init__.py and the start-up hook wire the recorder to the live verdict.
    TOP: frozenset(
        {"live", "recorder", "simulate", "report", "analysis", "readers", "format", BASE}
    ),
    CLI: frozenset(
        {
            TOP,
            "live",
            "recorder",
            "attach",
            "simulate",
            "report",
            "analysis",
            "readers",
            "format",
            BASE,
        }
    ),
}
"""Each layer and the layers it may import (the closure is spelled out, not inferred)."""

BASE_MODULES = frozenset({"flightrec.errors", "flightrec.text", "flightrec.frames"})
TOP_MODULES = frozenset({"flightrec", "flightrec._autostart"})
SOURCES = (("flightrec", "flightrec"), ("cli/flightrec_cli", "flightrec_cli"))
"""(folder under the root, the package name it holds)."""

KNOWN_CYCLES = "tools/known_import_cycles.txt"
ROOT_PACKAGE = "flightrec"


@dataclass(frozen=True)
class Import:
    """One import of a module of the tree by another."""

    source: str
    target: str
    path: Path
    line: int


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the checked packages, by dotted name."""
    found: dict[str, Path] = {}
    for folder, package in SOURCES:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
        # A C extension is a module too (its stub names it), one that imports nothing of ours.
        for stub in sorted(base.rglob("*.pyi")):
            name = ".".join([package, *stub.relative_to(base).with_suffix("").parts])
            found.setdefault(name, stub)
    return found


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name a (possibly relative) ``from`` import refers to."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, name] if name else parts)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the tree (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """The tree's modules that ``module`` imports, each with where it does."""
    if path.suffix != ".py":
        return
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub; `from mod import name` mod.
                sub = f"{base}.{alias.name}"
                names.append(sub if sub in modules else base)
        if not names:
            continue
        line = getattr(node, "lineno", 0)
        for name in names:
            target = _known(name, modules)
            # Python runs the root package before any module of the tree, so importing it (for
            # ``__version__``) adds no dependency; it holds only metadata and lazy entry points.
            if target is not None and target not in (module, ROOT_PACKAGE):
                yield Import(module, target, path, line)


def layer_of(module: str) -> str | None:
    """The layer a module belongs to, or None for a package ``LAYERS`` does not name."""
    if module == "flightrec_cli" or module.startswith("flightrec_cli."):
        return CLI
    if module in TOP_MODULES:
        return TOP
    if module in BASE_MODULES:
        return BASE
    package = module.split(".")[1]
    return package if package in LAYERS and package not in (BASE, TOP, CLI) else None


def package_of(module: str, modules: dict[str, Path]) -> str:
    """The top-level package whose circles a module is checked in (``flightrec.analysis``)."""
    parts = module.split(".")
    if parts[0] == "flightrec_cli":
        return "flightrec_cli"
    if len(parts) > 2 or (len(parts) == 2 and modules[module].name == "__init__.py"):
        return ".".join(parts[:2])
    return "flightrec"


def _shown(path: Path, root: Path) -> str:
    """A path as the problem lines give it: relative to the root where it is inside it."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def layer_breaks(edges: Iterable[Import], root: Path) -> Iterator[str]:
    """One line per import that runs up or across the layers."""
    for imp in edges:
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source is None or target is None or source == target or target in LAYERS[source]:
            continue
        yield (
            f"{_shown(imp.path, root)}:{imp.line}: layer break: {imp.source} ({source}) imports "
            f"{imp.target} ({target}); {source} may import only "
            f"{', '.join(sorted(LAYERS[source])) or 'nothing of the tree'}"
        )


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        # The packages are small (a few dozen modules), so recursion depth is no concern.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def one_circle(graph: dict[str, set[str]], members: Sequence[str]) -> list[str]:
    """A shortest circle through the component's first module, as a path that returns to it."""
    start, inside = members[0], set(members)
    paths: dict[str, list[str]] = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph.get(node, set()) & inside):
            if succ == start:
                return [*paths[node], start]
            if succ not in paths:
                paths[succ] = [*paths[node], succ]
                queue.append(succ)
    return list(members)


def read_known_cycles(path: Path) -> list[frozenset[str]]:
    """The known circles: one a line, module names separated by spaces; ``#`` starts a comment."""
    if not path.is_file():
        return []
    known = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].split()
        if line:
            known.append(frozenset(line))
    return known


def check(root: Path, known_path: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) for the tree under ``root``."""
    root = root.resolve()
    modules = module_files(root)
    problems: list[str] = []
    edges: list[Import] = []
    for module, path in modules.items():
        try:
            edges.extend(imports_of(module, path, modules))
        except SyntaxError as exc:
            problems.append(f"{_shown(path, root)}:{exc.lineno}: cannot parse: {exc.msg}")
    for module, path in modules.items():
        if layer_of(module) is None:
            problems.append(
                f"{_shown(path, root)}: {module} is in no layer: add its package to LAYERS in tools/check_layers.py"
            )
    problems.extend(layer_breaks(edges, root))

    graphs: dict[str, dict[str, set[str]]] = {}
    for imp in edges:
        package = package_of(imp.source, modules)
        if package == package_of(imp.target, modules):
            graphs.setdefault(package, {}).setdefault(imp.source, set()).add(imp.target)
    known = read_known_cycles(known_path)
    used: set[frozenset[str]] = set()
    for package, graph in sorted(graphs.items()):
        for members in strongly_connected(graph):
            allowed = [entry for entry in known if set(members) <= entry]
            if allowed:
                used.update(allowed)
                continue
            circle = " -> ".join(one_circle(graph, members))
            problems.append(
                f"{_shown(modules[members[0]], root)}: import circle in {package} ({len(members)} modules: "
                f"{', '.join(members)}): {circle}"
            )
    notes = [
        f"{known_path}: the known circle {' '.join(sorted(entry))} is gone: delete its line"
        for entry in known
        if entry not in used
    ]
    return problems, notes


def main(argv: Sequence[str] | None = None) -> int:
    """Print each problem; 1 when there is any, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parent.parent, help="repository root"
    )
    parser.add_argument(
        "--known", type=Path, default=None, help=f"known circles (default: ROOT/{KNOWN_CYCLES})"
    )
    args = parser.parse_args(argv)
    root: Path = args.root
    problems, notes = check(root, args.known or root / KNOWN_CYCLES)
    for line in notes:
        print(f"note: {line}")
    if problems:
        print(f"layers: {len(problems)} problem(s)")
        for line in problems:
            print(line)
        return 1
    print("layers: every import runs downward and no package imports in a new circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
