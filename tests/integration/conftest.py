"""Fixtures of the integration tests beyond the shared ones (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["zookeeper", "log"])
def delivery_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A request/response or work-queue test runs with the delivery state (task records,
    consumer groups) in ZooKeeper and in the monitor's state log (`delivery.state`,
    docs/architecture.md §12): its module's host settings (`HOST` or `WORK`) get the store."""
    settings = getattr(request.module, "HOST", None) or request.module.WORK
    monkeypatch.setitem(settings, "delivery.state", request.param)
    return str(request.param)
