"""What a client holds of the cluster's security, for packages that may not import transport
(the HTTP gateway): the ZooKeeper credential of the identity in use (docs/security.md)."""

from __future__ import annotations

from roq.transport import security


def zk_auth() -> str | None:
    """The digest credential to open a ZooKeeper session with; None with security off."""
    return security.zk_auth()
