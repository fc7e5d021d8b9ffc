"""What ZooKeeper records of a test cluster, read through roq's own registry.

`roq.testing` may not import `roq.coordination` (the layer table), so the tests that check
processes against ZooKeeper's records share this helper instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import Registry
from roq.testing.cluster import LocalCluster

SESSION_TIMEOUT_MS = 4000


@contextlib.contextmanager
def registry(cluster: LocalCluster) -> Iterator[Registry]:
    """A registry over its own ZooKeeper session, closed on leaving."""
    client = session.connect(cluster.zk, SESSION_TIMEOUT_MS, auth=cluster.zk_auth)
    try:
        yield Registry(client, Paths(cluster.namespace))
    finally:
        session.close(client)
