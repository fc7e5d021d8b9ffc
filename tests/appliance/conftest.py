"""Fixtures of the appliance tests (tests of the frozen executable, units and image)."""

from __future__ import annotations

from pathlib import Path

import pytest
from appliance_support import build_frozen


@pytest.fixture(scope="session")
def frozen_roq() -> Path:
    """The frozen executable, built once per source state (shared by xdist workers)."""
    return build_frozen()
