"""The cluster's security as its processes use it (docs/security.md): the ZooKeeper credential
of the identity in use (for packages that may not import transport: the HTTP gateway), and the
principal table a GCM or host follows in ZooKeeper."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from roq.coordination.principals import PrincipalStore
from roq.protocol.principals import Principal
from roq.protocol.zktls import ZkTls
from roq.transport import security

log = logging.getLogger(__name__)


def zk_auth() -> str | None:
    """The digest credential to open a ZooKeeper session with; None with security off."""
    return security.zk_auth()


def zk_tls() -> ZkTls | None:
    """The TLS material to open a ZooKeeper session with; None: plain TCP (docs/security.md §4)."""
    return security.zk_tls()


def secured() -> bool:
    """Whether this process runs with security (the HTTP gateway then asks for tokens)."""
    return security.enabled()


def follow_principals(zk: Any, namespace: str, children_file: Path | None = None) -> None:
    """For a GCM or host: seed the cluster's principal table on its first start, then keep
    this process's gate (and, for a host, its children's file) equal to it at every change.
    Nothing to do with security off."""
    auth = security.zk_auth()
    if auth is None:
        return
    store = PrincipalStore(zk, namespace, auth)
    store.seed(security.gate().principals())

    def changed(table: list[Principal]) -> None:
        security.gate().replace(table)
        if children_file is not None:
            security.publish_principals(children_file, table)

    store.watch(changed)


def principals_file(lease: str) -> Path | None:
    """Where a host writes its children's principal table: beside their lease file."""
    return Path(lease).with_suffix(".principals") if lease else None
