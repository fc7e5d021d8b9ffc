"""A queue's delivery state moved from ZooKeeper into its monitor's state log (docs/architecture.md
§12, "Migration"): a queue that kept its tasks and groups in ZooKeeper (`delivery.state=
zookeeper`, the only store before 26 Nov) keeps them when its monitor starts with the state log.

When the monitor begins a state log with nothing to read from (no copy of an older one), it reads
the queue's task records, request settings, groups and slots from ZooKeeper and writes them as
the log's first records; once they are copied (committed), it deletes the znodes. The log's origin
record follows them in the log, so a successor never imports twice: it reads the log. A znode
delete that fails leaves the znodes behind (logged); they are never read again, since this
queue's monitors read their log from then on.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from roq import limits
from roq.coordination.groupstore import GroupStore, delete_queue_groups
from roq.coordination.paths import Paths
from roq.coordination.session import SharedSession
from roq.coordination.taskstore import TaskStore
from roq.log.statelog import Change
from roq.monitor import deadletters
from roq.monitor.grouplog import GROUP_PREFIX, SLOT_PREFIX
from roq.monitor.slots import REDRIVEN, slot_id
from roq.monitor.tasklog import SETTINGS_KEY, TASK_PREFIX

log = logging.getLogger(__name__)


class Migration:
    """The queue's ZooKeeper state, read once for its first state log, then deleted."""

    def __init__(self, zk: SharedSession, paths: Paths, queue: str):
        self.zk, self.paths, self.queue = zk, paths, queue
        self.end = -1  # where the imported records end in the state log (-1: none imported)

    def read(self) -> list[Change]:
        """Every task record, the request settings, every group and slot record, as state log
        changes (CoordinationError: ZooKeeper could not be read; the caller tries again)."""
        tasks = TaskStore(self.zk, self.paths, self.queue)
        changes = []
        settings = tasks.load_settings()
        if settings:
            changes.append(Change(SETTINGS_KEY, json.dumps(settings, sort_keys=True).encode()))
        for task in tasks.tasks()[: limits.task_records_max]:
            found = tasks.get(task)
            if found is not None:
                changes.append(Change(f"{TASK_PREFIX}{task}", found[0]))
        for record, slots in GroupStore(self.zk, self.paths, self.queue).load():
            name = str(record.get("name", ""))
            changes.append(Change(f"{GROUP_PREFIX}{name}", _dump(record)))
            for data, _ in slots:
                changes.append(Change(f"{SLOT_PREFIX}{name}/{_record_key(data)}", _dump(data)))
        return changes

    def forget(self) -> None:
        """Delete the imported znodes (called once the records are copied)."""
        delete_queue_groups(self.zk.client(), self.paths, self.queue)
        log.info("queue %s: delivery state moved from ZooKeeper into the state log; its znodes "
                 "are deleted", self.queue)  # fmt: skip
        self.end = -1


def _record_key(data: dict[str, Any]) -> str:
    """A slot's id, or a dead-letter step's (monitor/deadletters.py)."""
    if deadletters.is_chunk(data):
        return deadletters.record_id(data)
    found = slot_id(str(data.get("exchange", "")), int(data.get("start", 0)),
                    int(data.get("first", 0)), int(data.get("part", -1)))  # fmt: skip
    return f"{found}{REDRIVEN}" if data.get("letter") else found


def _dump(record: dict[str, object]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()
