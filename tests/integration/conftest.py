"""Everything under tests/integration starts real process groups or subprocesses: mark it so
(``pytest -m "not integration"`` runs the unit tests alone)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def pg() -> Iterator[None]:
    """A 1-rank gloo default group for the module's tests (torch imported only here: the
    integration tests that need no torch still collect without it)."""
    from tests.integration.gloo import one_rank_gloo

    with one_rank_gloo():
        yield
