"""What ``flightrec doctor`` reports: whether tracing would work in this environment, and how.

For the Python and torch it runs under: flightrec's version, which recording path is active
(the C hot path or pure Python), whether the C path's tensor-memory reader and frame walk are
on and why not, whether the start-up hook (``flightrec-autostart.pth``) is installed, and where
dumps would go with the current environment. It is what a user runs first when something looks
wrong, and what a bug report should contain.

Nothing here changes the environment: torch.distributed is not wrapped, and the dump folder is
only tested (an empty folder made and removed at once where the dumps would go).
torch is imported (where installed) to check the tensor-memory reader on a few probe tensors,
as the recorder itself does at its first recorded call. Without torch, the report says tracing
cannot work; it never raises for what it finds.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flightrec
from flightrec.recorder import config as _config
from flightrec.recorder.torchapi import NEWEST_TESTED, OLDEST_TESTED, TorchAPI, probe

PTH = "flightrec-autostart.pth"


@dataclass(frozen=True)
class Item:
    """One line of the report."""

    topic: str
    """What is checked: ``python``, ``torch``, ``recording path``, ..."""
    value: str
    """What was found, in a few words."""
    why: str = ""
    """Why a path is off, or what else matters about the value."""
    blocks: bool = False
    """True where this stops tracing from working."""


@dataclass(frozen=True)
class Diagnosis:
    """The whole report, in order."""

    items: tuple[Item, ...]

    @property
    def tracing_works(self) -> bool:
        """Whether ``FLIGHTREC=1`` would trace a job started in this environment."""
        return not any(item.blocks for item in self.items)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"tracing_works": bool, "items": [{"topic", "value", "why",
        "blocks"}, ...]}``."""
        return {
            "schema": "flightrec.doctor/1",
            "tracing_works": self.tracing_works,
            "items": [
                {"topic": i.topic, "value": i.value, "why": i.why, "blocks": i.blocks}
                for i in self.items
            ],
        }


def diagnose(env: Mapping[str, str] | None = None, live: bool = False) -> Diagnosis:
    """Check this interpreter and the FLIGHTREC_* settings in ``env`` (default: os.environ).

    With ``live``, also prove the answer: a fresh Python, with ``FLIGHTREC=1`` and nothing
    imported from flightrec, runs one all_reduce on a 1-rank gloo group and exits; its exit
    dump must hold the call (``live_check``).
    """
    env = os.environ if env is None else env
    cfg = _config.from_env(env)
    # Under FLIGHTREC=1 the start-up hook armed itself in this very process (which shows it
    # works): disarm it, so that importing torch.distributed below starts no recorder here.
    autostart = sys.modules.get("flightrec._autostart")
    if autostart is not None:
        autostart._remove()
    items = [
        Item("flightrec", flightrec.__version__, str(Path(flightrec.__file__).parent)),
        _python(),
    ]
    torch, torch_item = _torch()
    items.append(torch_item)
    api = _torch_api(torch)
    fast, path_item = _recording_path(api)
    items.append(path_item)
    if api is not None:
        items.append(_internals(api))
        items.append(_native_recorder(api, cfg.native))
    items.append(_tensor_reader(fast, torch))
    items.append(_frame_walk(fast, cfg.stack_depth))
    items.append(_group_cache(fast))
    items.append(_hook(env, armed=autostart is not None))
    if live and torch is not None:
        items.append(live_check())
    items.append(_dumps(cfg.directory))
    items.append(
        Item(
            "settings",
            f"timeout {cfg.timeout_s:g} s, buffer {cfg.buffer} entries, "
            f"stack depth {cfg.stack_depth}",
            ", ".join(sorted(k for k in env if k.startswith("FLIGHTREC"))) or "no FLIGHTREC_*",
        )
    )
    return Diagnosis(tuple(items))


def _python() -> Item:
    impl = sys.implementation.name
    threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    value = f"{sys.version.split()[0]} ({impl}{', free-threaded' if threaded else ''})"
    return Item("python", value, sys.executable)


def _torch() -> tuple[Any, Item]:
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # ImportError, or a broken install raising anything
        return None, Item("torch", "not importable", f"{type(exc).__name__}: {exc}", True)
    if not dist.is_available():
        return torch, Item(
            "torch", torch.__version__, "built without torch.distributed: nothing to trace", True
        )
    backends = [
        name
        for name, check in (
            ("gloo", getattr(dist, "is_gloo_available", None)),
            ("nccl", getattr(dist, "is_nccl_available", None)),
        )
        if check is not None and check()
    ]
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return torch, Item("torch", torch.__version__, f"{cuda}; backends: {', '.join(backends)}")


def _torch_api(torch: Any) -> TorchAPI | None:
    if torch is None:
        return None
    try:
        return probe()
    except Exception:  # torch without torch.distributed: already reported
        return None


def _internals(api: TorchAPI) -> Item:
    topic = "torch internals"
    if api.newer_than_tested:
        return Item(topic, "public API only", api.notice().removeprefix("flightrec: "))
    tested = "-".join(".".join(map(str, r)) for r in (OLDEST_TESTED, NEWEST_TESTED))
    world = "" if api.world else "; no c10d._world: the default group through GroupMember"
    return Item(topic, "fast paths allowed", f"torch {api.version}, tested {tested}{world}")


def _native_recorder(api: TorchAPI, wanted: bool) -> Item:
    topic = "PyTorch's recorder"
    if not wanted:
        return Item(topic, "not merged", "FLIGHTREC_NATIVE=0")
    if not api.native_dump:
        return Item(topic, "not merged", "this torch has no _dump_fr_trace")
    if not api.merge_native:
        return Item(topic, "not merged", "a torch newer than tested: its private API is not used")
    how = "one recorder per backend" if api.native_backends else "one recorder per process"
    return Item(topic, "merged into dumps", how)


def _recording_path(api: TorchAPI | None = None) -> tuple[Any, Item]:
    """The C extension where it is built and used, else None (the pure-Python path)."""
    try:
        from flightrec.recorder.hooks import codegen
    except Exception as exc:  # the recorder's own modules failing to import: report it
        return None, Item("recording path", "unavailable", f"{type(exc).__name__}: {exc}", True)
    fast: Any
    try:
        from flightrec.recorder.hotpath import _fast as fast
    except ImportError:
        fast = None
    if fast is None:
        return None, Item(
            "recording path",
            "pure Python",
            "the C extension is not built (no compiler at install time?): every call is "
            "recorded the same, more slowly",
        )
    if not codegen.USE_FAST:
        return None, Item("recording path", "pure Python", "the C path is switched off")
    if api is not None and not api.fast_paths:
        return None, Item("recording path", "pure Python", "a torch newer than tested")
    return fast, Item("recording path", "C", str(fast.__file__))


def _bare_fast_path(fast: Any) -> Any:
    """A C FastPath with empty tables: enough to calibrate and check the layout on."""
    from flightrec.recorder.hotpath.counters import new_active, new_counter

    return fast.FastPath(
        settle=None, fail=None, by_pg={}, active=new_active(), threads={}, tcaches={}, reds={},
        ids=new_counter(), capture=None, buffer=bytearray(fast.SLOT_SIZE), capacity=1, depth=0,
    )  # fmt: skip


def _tensor_reader(fast: Any, torch: Any) -> Item:
    topic = "tensor-memory reader"
    if fast is None:
        return Item(topic, "off", "needs the C path")
    if torch is None:
        return Item(topic, "off", "needs torch")
    from flightrec.recorder.hotpath import layout

    why = layout.install_why_not(_bare_fast_path(fast))
    if why is None:
        return Item(topic, "on", f"shapes and dtypes read from torch {torch.__version__}'s memory")
    return Item(topic, "off", f"{why}; torch's getters are used (same entries, slower)")


def _frame_walk(fast: Any, depth: int) -> Item:
    topic = "frame walk"
    if fast is None:
        return Item(topic, "off", "needs the C path")
    if depth == 0:
        return Item(topic, "off", "stacks are off (FLIGHTREC_STACK_DEPTH=0)")
    if getattr(fast, "FRAME_WALK", 0):
        return Item(topic, "on", "callers' stacks read off the interpreter's frames")
    return Item(topic, "off", frame_walk_declined() + "; stacks come through PyEval_GetFrame")


def frame_walk_declined(
    version: tuple[int, int] | None = None, free_threaded: bool | None = None
) -> str:
    """Why the C path's build has no frame walk, decided by version: the interpreter's frames
    are internal structures, read only where their layout is known (CPython 3.11 to 3.14, with
    the GIL)."""
    version = sys.version_info[:2] if version is None else version
    if free_threaded is None:
        free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} has no CPython interpreter frames"
    if free_threaded:
        return "free-threaded build: frames are not read without the GIL"
    if version >= (3, 15):
        return f"Python {version[0]}.{version[1]}'s interpreter frames are not known to this build"
    return "this build of the C path was compiled without it"


def _group_cache(fast: Any) -> Item:
    topic = "group cache"
    if fast is None:
        return Item(topic, "off", "needs the C path")
    if getattr(fast, "DICT_VERSION", 0):
        return Item(topic, "on", "a call's group is looked up once per change of the group table")
    return Item(topic, "off", "this Python has no dict version tags (3.14+): one lookup per call")


def _site_dirs() -> list[Path]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [Path(d) for d in dict.fromkeys(dirs)]


def installed_hook() -> Path | None:
    """The start-up hook that starts flightrec, where one is in site-packages, else None."""
    for d in _site_dirs():
        pth = d / PTH
        try:
            if "flightrec._autostart" in pth.read_text():
                return pth
        except OSError:
            continue
    return None


def _hook(env: Mapping[str, str], armed: bool) -> Item:
    on = _config.is_true(env.get("FLIGHTREC"))
    state = "FLIGHTREC is not set: set FLIGHTREC=1 for the job"
    if on:
        state = "FLIGHTREC=1, and it ran in this process" if armed else "FLIGHTREC=1"
    for d in _site_dirs():
        pth = d / PTH
        try:
            text = pth.read_text()
        except OSError:
            continue
        if "flightrec._autostart" not in text:
            return Item("start-up hook", f"{pth} does not start flightrec", state, True)
        return Item("start-up hook", f"installed ({pth})", state)
    return Item(
        "start-up hook",
        "not installed",
        f"no {PTH} in {', '.join(map(str, _site_dirs()))}: FLIGHTREC=1 cannot trace a script "
        "that never imports flightrec (pip install torch-flightrec installs it)",
        True,
    )


LIVE_JOB = """
import socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
"""
"""The live check's job: plain torch, no flightrec import (the start-up hook must trace it)."""
LIVE_TIMEOUT_S = 120.0


def live_check(timeout_s: float = LIVE_TIMEOUT_S) -> Item:
    """Run ``LIVE_JOB`` in a fresh interpreter under ``FLIGHTREC=1`` and read its exit dump:
    the proof that a job started here is traced (the hook ran, the call was recorded, the
    dump was written)."""
    import subprocess

    from flightrec.format.read import read_dump

    topic = "live check"
    with tempfile.TemporaryDirectory(prefix="flightrec-doctor-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
        env.update(FLIGHTREC="1", FLIGHTREC_DIR=tmp, FLIGHTREC_DUMP_ON_EXIT="1",
                   FLIGHTREC_VERDICT="0", FLIGHTREC_SLOW_CHECK="0")  # fmt: skip
        try:
            run = subprocess.run(
                [sys.executable, "-c", LIVE_JOB], cwd=tmp, env=env, capture_output=True,
                text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Item(topic, "failed", f"a 1-rank gloo job did not end in {timeout_s:g} s", True)
        if run.returncode:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            return Item(topic, "failed", f"a 1-rank gloo job failed: {last}", True)
        dumps = sorted(Path(tmp).rglob("*.frdump"))
        recorded = False
        for path in dumps:
            try:
                recorded = recorded or "all_reduce" in read_dump(path).strings
            except Exception:
                continue
        if not recorded:
            why = "its exit dump holds no all_reduce" if dumps else "it left no dump"
            return Item(topic, "not traced", f"a 1-rank gloo job ran under FLIGHTREC=1; {why}",
                        True)  # fmt: skip
    return Item(topic, "traced", "a 1-rank gloo all_reduce in a fresh Python under FLIGHTREC=1 "
                "was recorded and dumped")  # fmt: skip


def _dumps(directory: str) -> Item:
    if "://" in directory:
        try:
            import fsspec  # type: ignore[import-untyped]

            fsspec.get_filesystem_class(directory.split("://", 1)[0])
        except Exception as exc:  # ImportError, or an unknown or uninstalled protocol
            return Item("dumps", directory, f"a URL, not writable here: {exc}", True)
        return Item("dumps", directory, "a URL: spooled locally, then uploaded through fsspec")
    path = Path(directory).expanduser().absolute()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return Item("dumps", str(path), f"{probe} is not a folder", True)
    try:  # what the dumper does first: make a folder there (os.access trusts root)
        os.rmdir(tempfile.mkdtemp(prefix=".flightrec-doctor-", dir=probe))
    except OSError as exc:
        return Item("dumps", str(path), f"cannot write under {probe}: {exc.strerror}", True)
    state = "exists, writable" if probe == path else f"created at the first dump (under {probe})"
    return Item("dumps", str(path), state)
