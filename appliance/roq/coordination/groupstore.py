"""Durable state of a queue's consumer groups, in ZooKeeper: one znode per group and one per
live slot (not per message), written by the queue's monitor.

    <ns>/groups/<queue>/<group>           {"name", "ordered", "from", "cursors": {exchange: end}}
    <ns>/groups/<queue>/<group>/<slot>    the slot's record (monitor/slots.py, `Slot.record`)

Writes carry the version the writer last saw: a second monitor of the same queue (one re-placed
after its host was lost while the old one still runs) fails them instead of silently
overwriting, and the writer then re-reads (`StaleWrite`). docs/architecture.md, "Work queues",
says why ZooKeeper fits the load.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from roq.coordination import session
from roq.errors import CoordinationError

log = logging.getLogger(__name__)


class StaleWrite(CoordinationError):
    """The znode changed since this writer read it (another writer)."""


class GroupStore:
    """Owned by the monitor's main thread (kazoo's own threads aside)."""

    def __init__(
        self,
        servers: str,
        namespace: str,
        session_timeout_ms: int,
        queue: str,
        auth: str | None = None,  # the cluster's digest credential (docs/security.md)
    ):
        self.root = f"{namespace}/groups/{queue}"
        self._servers, self._timeout_ms, self._auth = servers, session_timeout_ms, auth
        self._client: Any = None

    def _zk(self) -> Any:
        if self._client is None:
            self._client = session.connect(self._servers, self._timeout_ms, auth=self._auth)
        return self._client

    def load(self) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], int]]]]:
        """Every group of the queue with its slots' records and versions."""
        found = []
        try:
            zk = self._zk()
            for name in sorted(_children(zk, self.root)):
                data, _ = zk.get(f"{self.root}/{name}")
                slots = []
                for child in _children(zk, f"{self.root}/{name}"):
                    raw, stat = zk.get(f"{self.root}/{name}/{child}")
                    slots.append((_load(raw), stat.version))
                found.append((_load(data), slots))
        except NoNodeError:
            pass  # a group or slot deleted while we read: the rest stands
        except KazooException as error:
            raise CoordinationError(f"reading {self.root}: {error!r}") from None
        return found

    def save_group(self, name: str, record: dict[str, Any]) -> None:
        path = f"{self.root}/{name}"
        try:
            zk = self._zk()
            try:
                zk.set(path, _dump(record))
            except NoNodeError:
                zk.create(path, _dump(record), makepath=True)
        except NodeExistsError:
            self.save_group(name, record)
        except KazooException as error:
            raise CoordinationError(f"writing {path}: {error!r}") from None

    def save_slot(self, group: str, slot: str, record: dict[str, Any], version: int) -> int:
        """Create (version -1) or update the slot's znode; its new version."""
        path = f"{self.root}/{group}/{slot}"
        try:
            zk = self._zk()
            if version < 0:
                zk.create(path, _dump(record), makepath=True)
                return 0
            return int(zk.set(path, _dump(record), version=version).version)
        except (BadVersionError, NodeExistsError, NoNodeError) as error:
            raise StaleWrite(
                f"{path} changed under this monitor ({type(error).__name__})"
            ) from None
        except KazooException as error:
            raise CoordinationError(f"writing {path}: {error!r}") from None

    def delete_slot(self, group: str, slot: str) -> None:
        path = f"{self.root}/{group}/{slot}"
        try:
            self._zk().delete(path)
        except NoNodeError:
            pass
        except KazooException as error:
            raise CoordinationError(f"deleting {path}: {error!r}") from None

    def delete_group(self, group: str) -> None:
        path = f"{self.root}/{group}"
        try:
            self._zk().delete(path, recursive=True)
        except NoNodeError:
            pass
        except KazooException as error:
            raise CoordinationError(f"deleting {path}: {error!r}") from None

    def close(self) -> None:
        if self._client is not None:
            session.close(self._client)
            self._client = None


def delete_queue_groups(client: Any, namespace: str, queue: str) -> None:
    """A deleted queue's groups go with it (called by the GCM after the queue's transaction)."""
    try:
        client.delete(f"{namespace}/groups/{queue}", recursive=True)
    except NoNodeError:
        pass
    except KazooException as error:
        log.warning("the groups of deleted queue %s stay in ZooKeeper: %r", queue, error)


def _children(zk: Any, path: str) -> list[str]:
    try:
        return list(zk.get_children(path))
    except NoNodeError:
        return []


def _dump(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CoordinationError(f"unreadable group znode: {error}") from None
    if not isinstance(value, dict):
        raise CoordinationError("group znode data is not a JSON object")
    return value
