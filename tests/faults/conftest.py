"""Fixtures of the fault tests: the machines (namespaces on a bridge), removed after every test
whatever happened; a test that cannot get them is skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faultnet import NamespacesUnavailable, Network
from faultrun import FaultRun

MACHINES = 3


@pytest.fixture
def network() -> Iterator[Network]:
    net = Network(MACHINES)
    try:
        net.create()
    except NamespacesUnavailable as error:
        net.destroy()
        pytest.skip(f"fault tests need network namespaces: {error}")
    try:
        yield net
    finally:
        net.destroy()
    assert net.leftovers() == [], f"not removed: {net.leftovers()}"


@pytest.fixture
def fault_run(tmp_path: Path, network: Network) -> Iterator[FaultRun]:
    run = FaultRun(tmp_path, network)
    try:
        yield run
    finally:
        run.close()
