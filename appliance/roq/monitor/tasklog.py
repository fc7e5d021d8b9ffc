"""A queue's task records in its monitor's state log (monitor/state.py), with the interface of
the ZooKeeper store it replaces (coordination/taskstore.py), so the task manager's logic is the
same whichever keeps them (`requests.state`, docs/configuration.md).

    task/<id>    the task's record (BSON, monitor/tasks.py `Record`)
    settings     the queue's request settings that differ from the defaults (JSON)

Versions are the ZooKeeper store's: 0 at the claim, one more per write (the state log counts
from 1: one is taken off), so the task manager's cache and its compare-and-set work unchanged.
The claim of an id is the state log's compare-and-set "must not exist": one writer (this
monitor, under its epoch and its host's lease) checks it against the state it alone changes,
so of any number of submissions of one id exactly one claims it, as ZooKeeper's create did.
A write is made when it is appended; the replies that depend on it wait until it is copied
(`StateKeeper.answer`).
"""

from __future__ import annotations

import json

from roq.coordination.taskstore import Exists, Outcome, StaleWrite, TaskWrite
from roq.log.statelog import Change, StateLog
from roq.monitor.state import StateKeeper

TASK_PREFIX = "task/"
SETTINGS_KEY = "settings"


def _key(task: str) -> str:
    return TASK_PREFIX + task


class TaskLog:
    """The task store on the state log (main thread only, as the keeper)."""

    def __init__(self, keeper: StateKeeper):
        self.keeper = keeper

    @property
    def state(self) -> StateLog:
        """The keeper's log; refused (busy, retriable) while the monitor recovers it."""
        return self.keeper.store_state()

    def _found(self, task: str) -> int:
        """The record's version as the task manager counts (-1: no record)."""
        found = self.state.get(_key(task))
        return -1 if found is None else found[1] - 1

    def _write(self, changes: list[Change]) -> None:
        self.keeper.store_write(changes)  # a compare-and-set is checked first: never refused

    def claim(self, task: str, record: bytes) -> bool:
        if self._found(task) >= 0:
            return False
        self._write([Change(_key(task), record, expect=0)])
        return True

    def get(self, task: str) -> tuple[bytes, int] | None:
        found = self.state.get(_key(task))
        return None if found is None else (found[0], found[1] - 1)

    def put(self, task: str, record: bytes, version: int) -> int:
        if self._found(task) != version:
            raise StaleWrite(f"task {task} changed (version {self._found(task)}, not {version})")
        self._write([Change(_key(task), record, expect=version + 1)])
        return version + 1

    def delete(self, task: str, version: int = -1) -> bool:
        found = self._found(task)
        if found < 0 or (version >= 0 and found != version):
            return False
        self._write([Change(_key(task), None)])
        return True

    def commit(self, writes: list[TaskWrite]) -> list[Outcome]:
        """One turn's writes as one append: each checked against the state (and the writes
        before it in the turn), the ones that fail told why, the rest written together."""
        versions: dict[str, int] = {}
        changes: list[Change] = []
        outcomes: list[Outcome] = []
        for write in writes:
            found = versions.get(write.task, self._found(write.task))
            outcome = _check(write, found)
            outcomes.append(outcome)
            if isinstance(outcome, int):
                versions[write.task] = outcome
                changes.append(Change(_key(write.task), write.record))
        if changes:
            self._write(changes)
        return outcomes

    def tasks(self) -> list[str]:
        return [key.removeprefix(TASK_PREFIX) for key in self.state.keys(TASK_PREFIX)]

    def load_settings(self) -> dict[str, str]:
        found = self.state.get(SETTINGS_KEY)
        try:
            value = json.loads(found[0].decode() or "{}") if found else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            return {}  # unreadable: the defaults hold (the next save replaces it)
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def save_settings(self, settings: dict[str, str]) -> None:
        data = json.dumps(settings, sort_keys=True).encode()
        self._write([Change(SETTINGS_KEY, data)])


def _check(write: TaskWrite, found: int) -> Outcome:
    """The write's new version, or why it cannot be made against `found` (-1: no record)."""
    if write.record is None:
        if found < 0 or (write.version >= 0 and found != write.version):
            return StaleWrite(f"{write.task} (delete) changed")
        return -1
    if write.version < 0:
        return Exists(f"{write.task} (write): exists") if found >= 0 else 0
    if found != write.version:
        return StaleWrite(f"{write.task} (write) changed (version {found}, not {write.version})")
    return found + 1
