"""``flightrec doctor``: what each Python version runs, and the report that says so.

The C path's fast readers are decided per Python version (a check when it is compiled, not a
probe that may fail at run time): these tests state, for the version they run on, which ones
must be on, so that a new Python that silently turns one off fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from flightrec_cli.app import app
from typer.testing import CliRunner

from flightrec.recorder import diagnose as doctor
from flightrec.recorder.diagnose import Diagnosis, diagnose, frame_walk_declined

try:
    from flightrec.recorder.hotpath import _fast
except ImportError:
    _fast = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
needs_c = pytest.mark.skipif(_fast is None, reason="C hot path not built")


def item(found: Diagnosis, topic: str) -> Any:
    return next(i for i in found.items if i.topic == topic)


@needs_c
def test_the_frame_walk_is_built_on_every_python_whose_frames_are_known() -> None:
    known = (3, 11) <= sys.version_info[:2] <= (3, 14) and not FREE_THREADED
    built = _fast.FRAME_WALK
    assert built == int(known)


@needs_c
def test_the_group_cache_keys_on_dict_versions_until_314_removed_them() -> None:
    built = _fast.DICT_VERSION
    assert built == int(sys.version_info[:2] < (3, 14))


def test_a_declined_frame_walk_names_the_version_that_declined_it() -> None:
    assert "3.15" in frame_walk_declined((3, 15), free_threaded=False)
    assert "free-threaded" in frame_walk_declined((3, 13), free_threaded=True)


@needs_c
def test_every_python_from_311_to_314_reads_plain_tensors_from_memory() -> None:
    torch = pytest.importorskip("torch")
    found = diagnose({})
    reader = item(found, "tensor-memory reader")
    assert (reader.value, item(found, "recording path").value) == ("on", "C"), reader.why
    assert torch.__version__ in reader.why
    walk = item(found, "frame walk")
    assert walk.value == ("on" if _fast.FRAME_WALK else "off")


@needs_c
def test_no_stacks_means_no_frame_walk_and_says_so() -> None:
    pytest.importorskip("torch")
    walk = item(diagnose({"FLIGHTREC_STACK_DEPTH": "0"}), "frame walk")
    assert (walk.value, walk.why) == ("off", "stacks are off (FLIGHTREC_STACK_DEPTH=0)")


def test_without_torch_tracing_would_not_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    found = diagnose({})
    assert not found.tracing_works
    assert item(found, "torch").blocks
    assert item(found, "tensor-memory reader").why == (
        "needs torch" if _fast is not None else "needs the C path"
    )


def test_the_start_up_hook_is_found_in_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "_site_dirs", lambda: [tmp_path / "none", tmp_path])
    missing = item(diagnose({}), "start-up hook")
    assert (missing.value, missing.blocks) == ("not installed", True)
    (tmp_path / doctor.PTH).write_text((ROOT / "flightrec" / doctor.PTH).read_text())
    found = item(diagnose({"FLIGHTREC": "1"}), "start-up hook")
    assert (found.value, found.blocks) == (f"installed ({tmp_path / doctor.PTH})", False)
    assert found.why.startswith("FLIGHTREC=1")
    (tmp_path / doctor.PTH).write_text("import os\n")
    assert item(diagnose({}), "start-up hook").blocks


def test_dumps_go_where_flightrec_dir_says_and_must_be_writable(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    dumps = item(diagnose({"FLIGHTREC_DIR": str(target)}), "dumps")
    assert (dumps.value, dumps.blocks) == (str(target), False)
    assert not target.exists() and list(tmp_path.iterdir()) == []  # tested, left as it was
    blocked = tmp_path / "file"
    blocked.write_text("")
    dumps = item(diagnose({"FLIGHTREC_DIR": str(blocked / "x")}), "dumps")
    assert dumps.blocks and "not a folder" in dumps.why


def test_the_command_prints_every_item_and_exits_by_the_verdict(tmp_path: Path) -> None:
    env = {"FLIGHTREC_DIR": str(tmp_path), "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["doctor", "--json"], env=env)
    report = json.loads(result.output)
    assert report["schema"] == "flightrec.doctor/1"
    assert result.exit_code == (0 if report["tracing_works"] else 1)
    topics = [i["topic"] for i in report["items"]]
    for topic in ("flightrec", "python", "torch", "recording path", "tensor-memory reader",
                  "frame walk", "start-up hook", "dumps"):  # fmt: skip
        assert topic in topics
    hook = next(i for i in report["items"] if i["topic"] == "start-up hook")
    if "torch" in sys.modules and not hook["blocks"]:
        # The proof: a fresh Python under FLIGHTREC=1 recorded and dumped a real all_reduce.
        live = next(i for i in report["items"] if i["topic"] == "live check")
        assert (live["value"], live["blocks"]) == ("traced", False), live
    text = CliRunner().invoke(app, ["doctor", "--no-live"], env=env)
    assert "live check" not in text.output
    assert text.exit_code == result.exit_code
    assert str(tmp_path) in text.output
    assert text.output.rstrip().endswith("tracing would work" if report["tracing_works"] else
                                         "tracing would NOT work")  # fmt: skip


def test_under_flightrec_1_the_doctor_starts_no_recorder(tmp_path: Path) -> None:
    """The start-up hook arms itself in the doctor's own process under FLIGHTREC=1; the
    doctor disarms it before importing torch.distributed, so nothing is written."""
    pytest.importorskip("torch")
    dumps = tmp_path / "dumps"
    code = (
        "import sys, flightrec._autostart as a; from flightrec_cli.app import main;"
        "sys.argv = ['flightrec', 'doctor']; main()"
    )
    env = {"FLIGHTREC": "1", "FLIGHTREC_DIR": str(dumps), "FLIGHTREC_DUMP_ON_EXIT": "1",
           "PYTHONPATH": f"{ROOT}:{ROOT / 'cli'}", "PATH": "/usr/bin:/bin"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    assert "start-up hook" in out.stdout
    assert not dumps.exists(), out.stderr


@needs_c
def test_a_reader_that_is_off_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from flightrec.recorder.hotpath import layout

    monkeypatch.setattr(layout, "USE_LAYOUT", False)
    reader = item(diagnose({}), "tensor-memory reader")
    assert reader.value == "off"
    assert reader.why.startswith("switched off (layout.USE_LAYOUT); torch's getters are used")
