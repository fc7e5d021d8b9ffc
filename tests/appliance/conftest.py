"""Fixtures of the appliance tests (tests of the frozen executable, units and image)."""

from __future__ import annotations

from pathlib import Path

import pytest
from appliance_support import BUILD_TIMEOUT_S, build_frozen


@pytest.fixture(scope="session")
def frozen_roq() -> Path:
    """The frozen executable, built once per source state (shared by xdist workers)."""
    return build_frozen()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The first test of each worker waits for the PyInstaller build (BUILD_TIMEOUT_S) in setup,
    # which pytest-timeout counts: give these tests room for it.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 60))
