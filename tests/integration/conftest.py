"""Everything under tests/integration starts real process groups or subprocesses: mark it so
(``pytest -m "not integration"`` runs the unit tests alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)
