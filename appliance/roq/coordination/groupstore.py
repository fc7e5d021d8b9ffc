"""Durable state of a queue's consumer groups, in ZooKeeper: one znode per group and one per
live slot (not per message), written by the queue's monitor through its process's one session.

    <ns>/groups/<queue>/<group>           {"name", "ordered", "from", "cursors": {exchange: end}}
    <ns>/groups/<queue>/<group>/<slot>    the slot's record (monitor/slots.py, `Slot.record`)

(paths built by coordination/paths.py)

Writes carry the version the writer last saw: a second monitor of the same queue (one re-placed
after its host was lost while the old one still runs) fails them instead of silently
overwriting, and the writer then re-reads (`StaleWrite`). docs/architecture.md, "Work queues",
says why ZooKeeper fits the load.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)

from roq.coordination.paths import Paths
from roq.coordination.session import QueueStore, SharedSession
from roq.errors import CoordinationError

log = logging.getLogger(__name__)


class StaleWrite(CoordinationError):
    """The znode changed since this writer read it (another writer)."""


@dataclass(frozen=True)
class Write:
    """One change of a commit: a group's record (`slot` ""; created if this store has not
    seen its znode), a slot's record (`version` -1: create), or a slot's deletion."""

    group: str
    slot: str = ""
    record: dict[str, Any] | None = None  # None: delete the slot's znode
    version: int = -1


class Commit:
    """A ZooKeeper multi in flight: `ready()` says when it ended, `versions()` gives each
    write's new znode version (-1 for a deletion and a group record), or raises."""

    def __init__(self, result: Any, writes: list[Write], store: GroupStore):
        self._result, self.writes, self._store = result, writes, store

    def ready(self) -> bool:
        return bool(self._result.ready())

    def wait(self, timeout_s: float) -> bool:
        """Block at most `timeout_s` for the end; True if it ended."""
        self._result.wait(timeout_s)
        return self.ready()

    def versions(self) -> list[int]:
        try:
            results = self._result.get_nowait()
        except KazooException as error:
            raise CoordinationError(f"writing {self._store.root}: {error!r}") from None
        failed = [
            r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)
        ]
        if failed:
            if isinstance(failed[0], BadVersionError | NodeExistsError | NoNodeError):
                raise StaleWrite(f"{self._store.root} changed under this monitor "
                                 f"({type(failed[0]).__name__})")  # fmt: skip
            raise CoordinationError(f"writing {self._store.root}: {failed[0]!r}")
        out = []
        for write, result in zip(self.writes, results, strict=True):
            if not write.slot:
                self._store.stored.add(write.group)
            out.append(int(getattr(result, "version", 0)) if write.record and write.slot else -1)
        return out


class GroupStore(QueueStore):
    """A queue's consumer groups (`QueueStore`: whose thread, whose session)."""

    def __init__(self, zk: SharedSession, paths: Paths, queue: str):
        super().__init__(zk, paths, queue, paths.groups(queue))
        self.stored: set[str] = set()  # groups whose znode exists (read back or created)

    def commit(self, writes: list[Write]) -> Commit:
        """Start one multi of `writes` (group records first: a slot's parent must exist): one
        round trip and one ZooKeeper log write for all of them, all or none. The caller keeps
        at most one in flight, so each versioned write names the version the last one made."""
        try:
            transaction = self._transaction()
            for write in writes:
                path = self._path(write.group, write.slot)
                if write.record is None:
                    transaction.delete(path)
                elif not write.slot and write.group in self.stored:
                    transaction.set_data(path, _dump(write.record))
                elif write.slot and write.version >= 0:
                    transaction.set_data(path, _dump(write.record), version=write.version)
                else:
                    transaction.create(path, _dump(write.record))
            return Commit(transaction.commit_async(), writes, self)
        except KazooException as error:
            raise CoordinationError(f"writing {self.root}: {error!r}") from None

    def _path(self, group: str, slot: str = "") -> str:
        if slot:
            return self.paths.slot(self.queue, group, slot)
        return self.paths.group(self.queue, group)

    def load(self) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], int]]]]:
        """Every group of the queue with its slots' records and versions."""
        found = []
        try:
            zk = self._zk()
            for name in sorted(_children(zk, self.root)):
                data, _ = zk.get(self._path(name))
                slots = []
                for child in _children(zk, self._path(name)):
                    raw, stat = zk.get(self._path(name, child))
                    slots.append((_load(raw), stat.version))
                found.append((_load(data), slots))
                self.stored.add(name)
        except NoNodeError:
            pass  # a group or slot deleted while we read: the rest stands
        except KazooException as error:
            raise CoordinationError(f"reading {self.root}: {error!r}") from None
        return found

    def delete_group(self, group: str) -> None:
        path = self._path(group)
        self.stored.discard(group)
        try:
            self._zk().delete(path, recursive=True)
        except NoNodeError:
            pass
        except KazooException as error:
            raise CoordinationError(f"deleting {path}: {error!r}") from None


def delete_queue_groups(client: Any, paths: Paths, queue: str) -> None:
    """A deleted queue's delivery state goes with it (called by the GCM after the queue's
    transaction): its consumer groups, and its request/response settings and tasks, which a
    new queue of the same name would otherwise inherit."""
    for what, path in (("groups", paths.groups(queue)), ("tasks", paths.tasks(queue))):
        try:
            client.delete(path, recursive=True)
        except NoNodeError:
            pass
        except KazooException as error:
            log.warning("the %s of deleted queue %s stay in ZooKeeper: %r", what, queue, error)


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
