"""Start tracing in a process that never imports flightrec (``FLIGHTREC=1``).

``flightrec-autostart.pth`` imports this module at interpreter start when FLIGHTREC is on
(``import flightrec`` does too, so that a process whose site-packages lacks the hook is
traced from that import, and says so).
Importing torch here would add seconds to every Python process (and the torchrun launcher),
so instead a meta-path finder waits for ``torch.distributed`` to be imported and enables the
recorder right after that module finishes loading, before user code can take references to
its functions. Any failure is one warning: tracing must never break the job.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "torch.distributed"
log = logging.getLogger("flightrec")


def _enable() -> None:
    try:
        from flightrec import recorder
        from flightrec.live import REPORTER
        from flightrec.recorder import runtime
        from flightrec.recorder.diagnose import PTH, installed_hook

        recorder.enable(reporter=REPORTER)
        rt = runtime.current()
        if rt is None or not rt.hooks.installed:
            log.warning(
                "flightrec: FLIGHTREC=1 but nothing in torch.distributed could be hooked: "
                "this process is not traced (flightrec doctor says more)"
            )
        elif installed_hook() is None:
            log.warning(
                "flightrec: FLIGHTREC=1 but no %s in site-packages: this process is traced "
                "because it imported flightrec, processes that never do are not (reinstall "
                "with pip install . or pip install -e ., setuptools 64 or later)",
                PTH,
            )
    except Exception as exc:
        log.warning("flightrec: FLIGHTREC=1 but tracing could not start: %s", exc)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then enables tracing."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _enable()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``torch.distributed`` once, then leaves."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        _remove()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        for finder in sys.meta_path if spec is None else ():
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)  # type: ignore[arg-type]
        return spec


_FINDER = _Finder()


def _remove() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Enable now if torch.distributed is loaded, else when it gets imported."""
    if TARGET in sys.modules:
        _enable()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


install()
