"""tools/check_layers.py: the repository passes, and a layer break or a new circle fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_layers", REPO / "tools" / "check_layers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_layers", module)
    spec.loader.exec_module(module)
    return module


check_layers = _load()


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A small tree with the packages the check knows, plus ``files`` (path -> source)."""
    base = {
        "flightrec/__init__.py": "__version__ = '0'\n",
        "flightrec/errors.py": "",
        "flightrec/format/__init__.py": "",
        "flightrec/format/schema.py": "",
        "flightrec/recorder/__init__.py": "",
        "flightrec/recorder/hooks.py": "from flightrec.format import schema\n",
        "flightrec/readers/__init__.py": "",
        "flightrec/analysis/__init__.py": "",
        "flightrec/report/__init__.py": "from flightrec.analysis import model\n",
        "flightrec/analysis/model.py": "from flightrec.errors import x\nfrom flightrec import __version__\n",
        "cli/flightrec_cli/__init__.py": "",
        "cli/flightrec_cli/app.py": "import flightrec.report\nfrom flightrec.recorder import hooks\n",
    }
    for rel, text in {**base, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _run(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    status = check_layers.main(["--root", str(root), *extra])
    return status, capsys.readouterr().out


def test_the_repository_passes(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(REPO, capsys)
    assert status == 0, out
    assert "every import runs downward" in out


def test_the_repository_passes_with_no_known_circle() -> None:
    # The recorder's last circle (its hot path held the whole Recorder) is gone: the list of
    # allowed circles is empty, so any circle in the tree now fails the check above.
    listed = (REPO / "tools" / "known_import_cycles.txt").read_text().splitlines()
    assert [line for line in listed if line.strip() and not line.startswith("#")] == []


def test_a_clean_tree_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(_tree(tmp_path, {}), capsys)
    assert status == 0, out


@pytest.mark.parametrize(
    ("rel", "source", "broken"),
    [
        ("flightrec/format/write.py", "from flightrec.recorder import hooks\n", "format"),
        ("flightrec/format/write.py", "from ..recorder.hooks import x\n", "format"),
        (
            "flightrec/recorder/dump.py",
            "def f():\n    import flightrec.analysis.model\n",
            "recorder",
        ),
        ("flightrec/analysis/passes.py", "from flightrec.recorder import hooks\n", "analysis"),
        ("flightrec/analysis/render.py", "from flightrec.report import x\n", "analysis"),
        ("flightrec/readers/view.py", "import flightrec_cli.app\n", "readers"),
        (
            "flightrec/report/json.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flightrec.recorder import hooks\n",
            "report",
        ),
    ],
)
def test_an_import_up_or_across_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rel: str, source: str, broken: str
) -> None:
    status, out = _run(_tree(tmp_path, {rel: source}), capsys)
    assert status == 1
    assert f"{rel}:" in out and "layer break" in out and f"({broken}) imports" in out


def test_a_package_in_no_layer_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(_tree(tmp_path, {"flightrec/storage/__init__.py": ""}), capsys)
    assert status == 1
    assert "flightrec.storage is in no layer" in out


def _circle(root: Path) -> Path:
    return _tree(
        root,
        {
            "flightrec/analysis/a.py": "from flightrec.analysis import b\n",
            "flightrec/analysis/b.py": "from flightrec.analysis.c import f\n",
            "flightrec/analysis/c.py": "def g():\n    from . import a\n",
        },
    )


def test_a_circle_inside_a_package_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _run(_circle(tmp_path), capsys)
    assert status == 1
    assert "import circle in flightrec.analysis (3 modules" in out
    assert (
        "flightrec.analysis.a -> flightrec.analysis.b -> flightrec.analysis.c -> flightrec.analysis.a"
        in out
    )


def test_a_known_circle_passes_and_a_grown_one_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _circle(tmp_path)
    known = tmp_path / "known.txt"
    known.write_text(
        "# a comment\nflightrec.analysis.a flightrec.analysis.b flightrec.analysis.c  # ok\n"
    )
    assert _run(root, capsys, "--known", str(known))[0] == 0

    # A module joining the known circle makes it a new one.
    (root / "flightrec/analysis/d.py").write_text("from flightrec.analysis import a\n")
    (root / "flightrec/analysis/a.py").write_text("from flightrec.analysis import b, d\n")
    status, out = _run(root, capsys, "--known", str(known))
    assert status == 1
    assert "(4 modules" in out


def test_the_default_known_list_is_read_from_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _circle(tmp_path)
    (root / "tools").mkdir()
    (root / "tools/known_import_cycles.txt").write_text(
        "flightrec.analysis.a flightrec.analysis.b flightrec.analysis.c\n"
        "flightrec.recorder.x flightrec.recorder.y\n"
    )
    status, out = _run(root, capsys)
    assert status == 0, out
    # A circle that is gone is named so its line can be deleted; it does not fail the check.
    assert "known circle flightrec.recorder.x flightrec.recorder.y is gone" in out


def test_circles_across_packages_are_the_layer_checks_business(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _run(
        _tree(tmp_path, {"flightrec/format/schema.py": "from flightrec.recorder import hooks\n"}),
        capsys,
    )
    assert status == 1
    assert "layer break" in out and "import circle" not in out


def test_a_file_that_does_not_parse_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _run(_tree(tmp_path, {"flightrec/format/bad.py": "def (:\n"}), capsys)
    assert status == 1
    assert "flightrec/format/bad.py:1: cannot parse" in out
