"""Principals in ZooKeeper (docs/security.md §5): `<ns>/security/principals/@<digest>`, one JSON
principal each (protocol/principals.py), and a watch that hands the whole table to its owner at
every change.

A znode is named by an HMAC of the principal's name keyed with the cluster's ZooKeeper
credential, not by the name: ZooKeeper answers `exists` (and tells a missing znode from a
forbidden one on reads) without any permission, so a client without the credential could test
names one by one (issue 31). Only a holder of the credential can compute a principal's znode;
the name itself is in the record, which the namespace's ACL lets only that holder read. A table
written before (znodes named by the name) is renamed at the next start of a GCM or host (`seed`).

Every write also sets the data of `<ns>/security/principals` itself (in the same transaction),
so one data watch on that znode sees grants and revocations as well as new principals; kazoo
re-registers the watch after a reconnection and a new session, so a change made meanwhile is
seen once the session is back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from roq import limits
from roq.coordination.paths import Paths
from roq.coordination.watches import watch_data
from roq.errors import CoordinationError
from roq.protocol import principals
from roq.protocol.principals import Principal

log = logging.getLogger(__name__)


NODE_PREFIX = "@"  # never the first character of a principal's name (principals.NAME)


def principal_node(name: str, auth: str) -> str:
    """The znode name of principal `name` under the cluster's credential `auth`."""
    digest = hmac.new(auth.encode(), b"roq principal\0" + name.encode(), hashlib.sha256)
    return NODE_PREFIX + digest.hexdigest()


class PrincipalStore:
    """`auth` is the cluster's ZooKeeper credential, which names the znodes: needed to read or
    write one principal by name, not to read the whole table (`all`, `watch`)."""

    def __init__(self, client: Any, namespace: str, auth: str | None = None):
        self.client = client
        self.paths = Paths(namespace)
        self.root = self.paths.principals
        self._auth = auth

    def _path(self, name: str) -> str:
        if not self._auth:
            raise CoordinationError("principals are found by name only with the cluster's "
                                    "ZooKeeper credential")  # fmt: skip
        return self.paths.principal(principal_node(principals.check_name(name), self._auth))

    def seed(self, seeds: list[Principal]) -> bool:
        """Write `seeds` (the admin principal of cluster.json) when the cluster has no table yet:
        its first start. Never again, so a principal revoked later stays revoked. A table that
        exists has its znodes named by name, if any, renamed (`_rename_plain`)."""
        try:
            self.client.ensure_path(self.paths.security)
            self.client.create(self.root, b"")
        except NodeExistsError:
            self._rename_plain()
            return False
        except KazooException as error:
            raise CoordinationError(f"cannot create the principal table: {error}") from None
        for principal in seeds:
            self.put(principal)
        log.info("principals seeded: %s", ", ".join(p.name for p in seeds))
        return True

    def _rename_plain(self) -> None:
        """Move each principal written under its own name (before issue 31) to its digest's
        znode, in one transaction each; a GCM and a host doing it at once: one wins, the other's
        transaction fails and is ignored."""
        try:
            nodes = self.client.get_children(self.root)[: limits.principals_max]
        except KazooException as error:  # the next start tries again
            log.warning("principals named by name not renamed: %s", error)
            return
        for node in (n for n in nodes if not n.startswith(NODE_PREFIX)):
            try:
                data, stat = self.client.get(self.paths.principal(node))
                transaction = self.client.transaction()
                transaction.create(self._path(node), data)
                transaction.delete(self.paths.principal(node), stat.version)
                transaction.set_data(self.root, str(time.time()).encode())
                if not any(isinstance(r, Exception) for r in transaction.commit()):
                    log.info("principal %s: its znode is now named by its digest", node)
            except (KazooException, ValueError) as error:
                log.warning("principal znode %s not renamed: %s", node, error)

    def put(self, principal: Principal) -> None:
        try:
            self.client.ensure_path(self.root)
            self._write(principal, create=not self.client.exists(self._path(principal.name)))
        except KazooException as error:
            raise CoordinationError(f"cannot write principal {principal.name}: {error}") from None

    def _write(self, principal: Principal, *, create: bool, version: int = -1) -> None:
        data = json.dumps(principal.encode()).encode()
        transaction = self.client.transaction()
        if create:
            transaction.create(self._path(principal.name), data)
        else:
            transaction.set_data(self._path(principal.name), data, version)
        transaction.set_data(self.root, str(time.time()).encode())
        results = transaction.commit()
        for result in results:
            if isinstance(result, NodeExistsError | BadVersionError):
                raise result
            if isinstance(result, Exception):
                raise CoordinationError(f"principal {principal.name} not written: {result!r}")

    def update(self, name: str, change: Callable[[Principal], Principal]) -> Principal | None:
        """Apply `change` to principal `name` by compare-and-set: two `roq keys` commands on one
        principal at once both take effect (the loser reads again). None: no such principal."""
        for _ in range(limits.principal_cas_attempts_max):
            try:
                data, stat = self.client.get(self._path(name))
                changed = change(principals.decode(json.loads(data)))
                self._write(changed, create=False, version=stat.version)
                return changed
            except NoNodeError:
                return None
            except BadVersionError:
                continue  # changed since it was read: read it again
            except KazooException as error:
                raise CoordinationError(f"cannot change principal {name}: {error}") from None
        raise CoordinationError(f"principal {name} changed under every one of "
                                f"{limits.principal_cas_attempts_max} attempts")  # fmt: skip

    def remove(self, name: str) -> bool:
        """Delete a principal; False when there was none."""
        try:
            transaction = self.client.transaction()
            transaction.delete(self._path(name))
            transaction.set_data(self.root, str(time.time()).encode())
            results = transaction.commit()
        except KazooException as error:
            raise CoordinationError(f"cannot remove principal {name}: {error}") from None
        return not any(isinstance(result, Exception) for result in results)

    def get(self, name: str) -> Principal | None:
        try:
            data, _ = self.client.get(self._path(name))
        except NoNodeError:
            return None
        except KazooException as error:
            raise CoordinationError(f"cannot read principal {name}: {error}") from None
        return principals.decode(json.loads(data))

    def all(self) -> list[Principal]:
        """Every principal that decodes, by name; one that does not is logged and left out
        (denied)."""
        try:
            names = self.client.get_children(self.root)[: limits.principals_max]
        except NoNodeError:
            return []
        except KazooException as error:
            raise CoordinationError(f"cannot list principals: {error}") from None
        found = []
        for name in names:
            try:
                data, _ = self.client.get(self.paths.principal(name))
                found.append(principals.decode(json.loads(data)))
            except NoNodeError:
                continue  # removed between the listing and the read
            except (ValueError, KazooException) as error:
                log.warning("principal znode %s left out (denied): %s", name, error)
        return sorted(found, key=lambda p: p.name)

    def watch(self, on_change: Callable[[list[Principal]], None]) -> None:
        """Call `on_change` with the whole table now and after every change (kazoo's thread).
        The table's znode is not created here: a follower that is not a GCM or host (the HTTP
        gateway) must not keep a cluster's first start from seeding it; a watch on a missing
        znode fires once it is created."""

        def changed(_data: Any, _stat: Any) -> bool:
            try:
                on_change(self.all())
            except CoordinationError as error:  # the next change or reconnection reads again
                log.warning("principals not re-read: %s", error)
            return True

        watch_data(self.client, self.root, changed)
