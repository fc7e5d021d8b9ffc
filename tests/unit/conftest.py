"""Unit tests' sockets run with CURVE too, as the cluster's own processes: a key pair made once
per session (the integration tests' clusters make theirs like `roq up` does)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from roq.transport import security


@pytest.fixture(autouse=True, scope="session")
def _cluster_identity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    secrets = security.generate(tmp_path_factory.mktemp("security"))
    security.use(secrets.identity(), secrets.principals)
    yield
    security.reset()


@pytest.fixture(scope="module", params=["compiled", "pure"])
def batch_code(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module's tests on the compiled loops of the batch format (roq.log._native, built by
    `make setup`) and on its pure-Python code, as ROQ_PURE_PYTHON=1 would: both must behave the
    same, and the pure code is what runs where the extension is not built. Module-scoped, so
    hypothesis tests may use it."""
    from roq.log import format as fmt

    loaded = fmt._native
    if request.param == "compiled" and loaded is None:
        if os.environ.get("ROQ_NATIVE_REQUIRED"):  # `make test`: its setup built it
            pytest.fail("roq.log._native is not compiled (or ROQ_PURE_PYTHON is set)")
        pytest.skip("roq.log._native is not compiled here (make setup builds it)")
    fmt._native = loaded if request.param == "compiled" else None
    try:
        yield request.param
    finally:
        fmt._native = loaded
