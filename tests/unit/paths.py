"""Run a module's tests on both paths of an optional C extension: its C loops, then the Python
loops it stands in for."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

Fixture = Callable[[pytest.FixtureRequest, pytest.MonkeyPatch], str]


def c_and_python(module: ModuleType, attr: str) -> Fixture:
    """An autouse fixture, parametrized "c" and "python": "python" sets ``module.attr`` (the
    optional extension the module uses where built) to None for the test; "c" skips the test
    where the extension is not built. Assign it to a name in the test module."""
    built = getattr(module, attr)

    @pytest.fixture(autouse=True, params=["c", "python"])
    def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
        if request.param == "python":
            monkeypatch.setattr(module, attr, None)
        elif built is None:
            pytest.skip(f"{module.__name__}.{attr} is not built")
        return str(request.param)

    return loops  # type: ignore[no-any-return]
