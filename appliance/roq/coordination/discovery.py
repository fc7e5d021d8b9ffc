"""Clients find the leading GCM through ZooKeeper (its ephemeral leader znode)."""

from __future__ import annotations

import json

from kazoo.exceptions import NoAuthError, NoNodeError

from roq import limits
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.errors import CoordinationError


def leader_admin_endpoint(servers: str, namespace: str = "/roq", auth: str | None = None) -> str:
    """The leader's admin endpoint; `auth` is the digest credential of a secured cluster."""
    client = session.connect(servers, limits.zk_client_session_ms, connect_timeout_s=5.0, auth=auth)
    try:
        data, _ = client.get(Paths(namespace).leader)
    except NoNodeError:
        raise CoordinationError(f"no GCM leads the cluster {namespace} at {servers}") from None
    except NoAuthError:
        raise session.SecurityRefused(
            f"ZooKeeper refuses to show {namespace} to this principal: use --gcm, or the "
            "credentials of a principal that holds the cluster's ZooKeeper credential"
        ) from None
    finally:
        session.close(client)
    return str(json.loads(data.decode())["admin"])
