"""Clients find the leading GCM through ZooKeeper (its ephemeral leader znode)."""

from __future__ import annotations

import json
from typing import Any

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError

from roq import limits
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.errors import CoordinationError
from roq.protocol.zktls import ZkTls


def leader_admin_endpoint(
    servers: str, namespace: str = "/roq", auth: str | None = None, tls: ZkTls | None = None
) -> str:
    """The leader's admin endpoint, read through a session of its own, closed after the read (a
    client's); `auth` is the digest credential of a secured cluster, `tls` its ZooKeeper TLS."""
    client = session.connect(
        servers, limits.zk_client_session_ms, connect_timeout_s=5.0, auth=auth, tls=tls
    )
    try:
        return read_leader_admin(client, Paths(namespace), f" at {servers}")
    finally:
        session.close(client)


def read_leader_admin(client: Any, paths: Paths, where: str = "") -> str:
    """The leader's admin endpoint, read through a session the caller holds (a monitor's
    SharedSession); CoordinationError when none leads or ZooKeeper does not answer."""
    namespace = paths.namespace
    try:
        data, _ = client.get(paths.leader)
    except NoNodeError:
        raise CoordinationError(f"no GCM leads the cluster {namespace}{where}") from None
    except NoAuthError:
        raise session.SecurityRefused(
            f"ZooKeeper refuses to show {namespace} to this principal: use --gcm, or the "
            "credentials of a principal that holds the cluster's ZooKeeper credential"
        ) from None
    except KazooException as error:  # a held session may be reconnecting: the caller retries
        raise CoordinationError(f"reading {paths.leader}{where}: {error!r}") from None
    return str(json.loads(data.decode())["admin"])
