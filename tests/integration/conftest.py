"""Fixtures of the integration tests beyond the shared ones (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["zookeeper", "log"])
def task_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A request/response test runs with the task records in ZooKeeper and in the monitor's
    state log (`request.state`, docs/architecture.md §12): its module's `HOST` settings get
    the store."""
    monkeypatch.setitem(request.module.HOST, "request.state", request.param)
    return str(request.param)
