"""Durable state of a queue's request/response tasks, in ZooKeeper, written by the queue's monitor
(monitor/tasks.py):

    <ns>/tasks/<queue>            the queue's request settings that differ from the defaults (JSON)
    <ns>/tasks/<queue>/<task id>  the task's record (BSON, its result included: at most 64 KiB)

(paths built by coordination/paths.py; the session is the monitor's one, session.SharedSession)

Creating the task's znode is the claim of its id: ZooKeeper's create is atomic, so of any number
of concurrent submissions of one request id exactly one creates it, whichever monitor (an old
one fenced, a new one placed after a host loss) serves them. Updates carry the version read, so
two writers never overwrite each other's state change (`StaleWrite`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from roq.coordination.groupstore import StaleWrite
from roq.coordination.paths import Paths
from roq.coordination.session import QueueStore, SharedSession
from roq.errors import CoordinationError

__all__ = ["Exists", "RolledBack", "StaleWrite", "TaskStore", "TaskWrite"]


class Exists(CoordinationError):
    """A claim (create) of a task that exists."""


class RolledBack(CoordinationError):
    """Not made: another write of the same multi failed (the caller sends it again)."""


@dataclass(frozen=True)
class TaskWrite:
    """One write of a multi: create the task's znode (`version` -1: the claim), replace the
    record read at `version`, or (`record` None) delete it at `version`."""

    task: str
    record: bytes | None
    version: int


Outcome = int | CoordinationError  # the new version (-1: deleted), or why it was not made


class TaskStore(QueueStore):
    """A queue's tasks (`QueueStore`: whose thread, whose session)."""

    def __init__(self, zk: SharedSession, paths: Paths, queue: str):
        super().__init__(zk, paths, queue, paths.tasks(queue))

    def _path(self, task: str) -> str:
        return self.paths.task(self.queue, task)

    def claim(self, task: str, record: bytes) -> bool:
        """Create the task's znode: True; it exists already: False."""
        path = self._path(task)
        try:
            self._zk().create(path, record, makepath=True)
        except NodeExistsError:
            return False
        except KazooException as error:
            raise CoordinationError(f"creating {path}: {error!r}") from None
        return True

    def get(self, task: str) -> tuple[bytes, int] | None:
        """(record, version), or None when there is no such task."""
        path = self._path(task)
        try:
            data, stat = self._zk().get(path)
        except NoNodeError:
            return None
        except KazooException as error:
            raise CoordinationError(f"reading {path}: {error!r}") from None
        return bytes(data), int(stat.version)

    def put(self, task: str, record: bytes, version: int) -> int:
        """Replace the record read at `version`; its new version (StaleWrite if it changed)."""
        path = self._path(task)
        try:
            return int(self._zk().set(path, record, version=version).version)
        except (BadVersionError, NoNodeError) as error:
            raise StaleWrite(f"{path} changed ({type(error).__name__})") from None
        except KazooException as error:
            raise CoordinationError(f"writing {path}: {error!r}") from None

    def delete(self, task: str, version: int = -1) -> bool:
        """Delete it (at `version`, or any): False if it was gone or changed."""
        path = self._path(task)
        try:
            self._zk().delete(path, version=version)
        except (NoNodeError, BadVersionError):
            return False
        except KazooException as error:
            raise CoordinationError(f"deleting {path}: {error!r}") from None
        return True

    def commit(self, writes: list[TaskWrite]) -> list[Outcome]:
        """The writes of one monitor turn as one multi: one round trip and one ZooKeeper log
        write (fsync) for all of them. A multi is all or none: when one write fails (Exists,
        StaleWrite), the others come back RolledBack, and the caller sends them again."""
        try:
            transaction = self._transaction()
            for write in writes:
                path = self._path(write.task)
                if write.record is None:
                    transaction.delete(path, version=write.version)
                elif write.version < 0:
                    transaction.create(path, write.record)
                else:
                    transaction.set_data(path, write.record, version=write.version)
            results = transaction.commit()
        except KazooException as error:
            raise CoordinationError(f"writing {self.root}: {error!r}") from None
        return [_outcome(w, r) for w, r in zip(writes, results, strict=True)]

    def tasks(self) -> list[str]:
        """The ids of every stored task (the collector visits them a batch at a time)."""
        try:
            return list(self._zk().get_children(self.root))
        except NoNodeError:
            return []
        except KazooException as error:
            raise CoordinationError(f"listing {self.root}: {error!r}") from None

    def load_settings(self) -> dict[str, str]:
        try:
            data, _ = self._zk().get(self.root)
        except NoNodeError:
            return {}
        except KazooException as error:
            raise CoordinationError(f"reading {self.root}: {error!r}") from None
        try:
            value = json.loads(bytes(data).decode() or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            return {}  # unreadable: the defaults hold (the next save replaces it)
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def save_settings(self, settings: dict[str, str]) -> None:
        data = json.dumps(settings, sort_keys=True).encode()
        try:
            zk = self._zk()
            try:
                zk.set(self.root, data)
            except NoNodeError:
                zk.create(self.root, data, makepath=True)
        except KazooException as error:
            raise CoordinationError(f"writing {self.root}: {error!r}") from None


def _outcome(write: TaskWrite, result: Any) -> Outcome:
    path = f"{write.task} ({'delete' if write.record is None else 'write'})"
    if isinstance(result, NodeExistsError):
        return Exists(f"{path}: exists")
    if isinstance(result, BadVersionError | NoNodeError):
        return StaleWrite(f"{path} changed ({type(result).__name__})")
    if isinstance(result, RolledBackError | RuntimeInconsistency):
        return RolledBack(f"{path}: rolled back")
    if isinstance(result, Exception):
        return CoordinationError(f"{path}: {result!r}")
    if write.record is None:
        return -1
    return 0 if write.version < 0 else int(result.version)
