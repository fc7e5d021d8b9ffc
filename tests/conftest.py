"""Shared fixtures: one real ZooKeeper per test worker, a fresh roq cluster per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from roq.local.zkserver import ZooKeeperServer
from roq.testing.cluster import LocalCluster, PortBlocks


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0)


@pytest.fixture(scope="session")
def port_blocks() -> PortBlocks:
    # Below the kernel's ephemeral range (32768+), so client sockets never take our ports.
    # ROQ_TEST_PORT_BASE lets two suites share a machine without sharing ports.
    base = int(os.environ.get("ROQ_TEST_PORT_BASE", "21000"))
    start = base + 5000 * _worker_index()
    return PortBlocks(start, start + 5000)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory, port_blocks: PortBlocks) -> Iterator[str]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), port_blocks.take(1))
    server.start()
    yield server.connect_string
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str, port_blocks: PortBlocks) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path, zookeeper, port_blocks)
    yield local
    local.stop()
