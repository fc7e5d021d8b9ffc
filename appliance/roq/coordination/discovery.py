"""Clients find the leading GCM through ZooKeeper (its ephemeral leader znode)."""

from __future__ import annotations

import json

from kazoo.exceptions import NoNodeError

from roq import limits
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.errors import CoordinationError


def leader_admin_endpoint(servers: str, namespace: str = "/roq") -> str:
    client = session.connect(servers, limits.zk_client_session_ms, connect_timeout_s=5.0)
    try:
        data, _ = client.get(Paths(namespace).leader)
    except NoNodeError:
        raise CoordinationError(f"no GCM leads the cluster {namespace} at {servers}") from None
    finally:
        session.close(client)
    return str(json.loads(data.decode())["admin"])
