"""Unit tests' sockets run with CURVE too, as the cluster's own processes: a key pair made once
per session (the integration tests' clusters make theirs like `roq up` does)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from roq.transport import security


@pytest.fixture(autouse=True, scope="session")
def _cluster_identity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    secrets = security.generate(tmp_path_factory.mktemp("security"))
    security.use(secrets.identity(), secrets.principals)
    yield
    security.reset()
