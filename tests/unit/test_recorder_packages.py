"""The recorder's folders import one way: no circle between its subpackages, and the hot path
needs nothing of the recorder above it (read with tools/check_layers.py's own import reader)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_check_layers import REPO, check_layers

RECORDER = "flightrec.recorder"


def folder_of(module: str, modules: dict[str, Path]) -> str:
    """``hotpath`` for flightrec.recorder.hotpath.ring; the module's own name at the top."""
    rest = module[len(RECORDER) + 1 :].split(".")
    return rest[0] if rest[0] and (len(rest) > 1 or modules[module].name == "__init__.py") else ""


def recorder_edges() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(folder -> folders it imports, module -> recorder modules it imports)."""
    modules = check_layers.module_files(REPO)
    folders: dict[str, set[str]] = {}
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith(RECORDER + "."):
            continue
        for edge in check_layers.imports_of(name, path, modules):
            if not edge.target.startswith(RECORDER + "."):
                continue
            imports.setdefault(name, set()).add(edge.target)
            a, b = folder_of(name, modules), folder_of(edge.target, modules)
            if a and b and a != b:
                folders.setdefault(a, set()).add(b)
    return folders, imports


def test_the_recorders_subpackages_import_in_no_circle() -> None:
    folders, _ = recorder_edges()
    assert {"hotpath", "recording", "hooks", "dumping", "exchange", "native"} <= set(folders) | {
        b for targets in folders.values() for b in targets
    }
    assert check_layers.strongly_connected(folders) == [], folders


def test_the_hot_path_imports_nothing_of_the_recorder_above_it() -> None:
    _, imports = recorder_edges()
    hot = {m: targets for m, targets in imports.items() if m.startswith(RECORDER + ".hotpath")}
    assert hot, "no hot path modules found"
    outside = {
        m: sorted(t for t in ts if not t.startswith(RECORDER + ".hotpath")) for m, ts in hot.items()
    }
    assert {m: ts for m, ts in outside.items() if ts} == {}
