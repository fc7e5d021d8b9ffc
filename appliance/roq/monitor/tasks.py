"""Request/response tasks of a queue (commands 40–45): JLupin's queue manager, kept by the queue's
monitor. docs/requests.md has the flow; docs/guarantees.md, "Request/response", what it promises.

The monitor keeps one record per task in ZooKeeper (coordination/taskstore.py), never the
request itself: that is a message of the queue, which the service's workers take as a consumer
group (monitor/groups.py hands it out, redelivers it after a lease, counts its deliveries). A
worker asks here before it runs a request (TASK_START) and reports how it ended (TASK_FINISH);
the record decides whether it runs (a task already final, a stale attempt, or one handed out
more than maxSendProbeAmount times does not) and whether its result is stored (only the first
result of the current attempt is: exactly-once results).

Deadlines (input and result time-to-live, "no worker") are applied on every read of a record,
so a client asking is told at once; a collector also visits the records, a bounded batch per
pass, so that what nobody asks about is collected too.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bson

from roq import limits
from roq.config.components import MonitorSettings, RequestSettings
from roq.coordination.taskstore import StaleWrite, TaskStore
from roq.errors import ConfigError, CoordinationError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.messages.tasks import (
    FINAL,
    TaskConfig,
    TaskFinish,
    TaskRef,
    TaskStart,
    TaskSubmit,
    TaskView,
    service_group,
)
from roq.transport import security

log = logging.getLogger(__name__)

TASK_COMMANDS = frozenset(range(MonitorCommand.TASK_SUBMIT, MonitorCommand.TASK_CONFIG + 1))
GONE = "no such task: never submitted, acknowledged, or collected"


@dataclass
class Record:
    """A task's durable record (BSON in its znode). Times are wall-clock ms: the monitor that
    reads it may run on another host than the one that wrote it."""

    task: str
    service: str
    state: str = "accepted"
    attempt: int = 1
    accepted_ms: int = 0
    changed_ms: int = 0  # when the state last changed
    result: bytes = b""
    error: str = ""
    runs: int = 0  # executions started (TASK_START answered Run)
    probes: int = 0  # executions started of the current attempt (maxSendProbeAmount)
    retries: int = 0  # runs again after an error matching exceptionStringToRepeat
    late: bool = False  # a result arrived after the task expired (stored, never handed out)
    collected: bool = False  # its result (or error) was dropped: a tombstone answering expired

    def encode(self) -> bytes:
        return bson.encode(dict(self.__dict__))

    @classmethod
    def decode(cls, data: bytes) -> Record | None:
        """None for a record this version cannot read (it is then collected)."""
        try:
            doc = bson.decode(data)
            record = cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})
        except (bson.errors.BSONError, TypeError, ValueError):
            return None
        return record if isinstance(record.task, str) and isinstance(record.state, str) else None

    def view(self, now_ms: int, **extra: Any) -> TaskView:
        handed = self.state in ("done", "failed") and not self.collected
        return TaskView(
            self.task, self.service, self.state, self.attempt,
            self.result if handed else b"", self.error, age_ms=max(0, now_ms - self.accepted_ms),
            **extra,
        )  # fmt: skip

    def become(self, state: str, now_ms: int, error: str = "") -> None:
        self.state, self.changed_ms = state, now_ms
        if error:
            self.error = error[: limits.task_error_chars_max]


def _now_ms() -> int:
    return int(time.time() * 1000)


class TaskManager:
    def __init__(self, queue: str, settings: MonitorSettings, live_workers: Callable[[str], int]):
        self.queue, self.name = queue, f"monitor {queue}"
        zk = settings.zk
        self.store = TaskStore(
            zk.servers, zk.namespace, zk.session_timeout_ms, queue, security.zk_auth()
        )
        self.defaults = settings.requests
        self.settings = settings.requests
        self._live_workers = live_workers  # service's group → its consumers seen recently
        self._overrides: dict[str, str] | None = None  # None: not read from ZooKeeper yet
        self._gc_ids: list[str] = []
        self._next_gc = 0.0
        self.collected = 0

    # --- requests -----------------------------------------------------------------------------
    def handle(self, request: dict[str, Any]) -> Document:
        handlers: dict[int, Callable[[dict[str, Any]], Document]] = {
            MonitorCommand.TASK_SUBMIT: self._submit,
            MonitorCommand.TASK_START: self._start,
            MonitorCommand.TASK_FINISH: self._finish,
            MonitorCommand.TASK_GET: self._get,
            MonitorCommand.TASK_ACK: self._ack,
            MonitorCommand.TASK_CONFIG: self._config,
        }
        try:
            self._load_settings()
            return handlers[request["CMD"]](request)
        except CoordinationError as error:  # StaleWrite too: the client asks again
            return bsonmsg.fail(Reason.BUSY, f"tasks: ZooKeeper: {error}")

    def _load_settings(self) -> None:
        if self._overrides is None:
            overrides = self.store.load_settings()
            try:
                self.settings = self.defaults.overridden(overrides, f"queue {self.queue}")
            except ConfigError as error:  # written by an older version: the defaults hold
                log.warning("%s: request settings ignored: %s", self.name, error)
            self._overrides = overrides

    def _read(self, task: str) -> tuple[Record, int] | None:
        """The task's record with its deadlines applied (and written, when they changed it)."""
        found = self.store.get(task)
        if found is None:
            return None
        record = Record.decode(found[0])
        if record is None:
            self.store.delete(task, found[1])
            return None
        version = found[1]
        if self._apply_deadlines(record, _now_ms()):
            version = self.store.put(task, record.encode(), version)
        return record, version

    def _submit(self, request: dict[str, Any]) -> Document:
        ask = TaskSubmit.decode(request)
        now = _now_ms()
        for _ in range(2):  # a record deleted between our claim and our read: claim again
            record = Record(ask.task, ask.service, accepted_ms=now, changed_ms=now)
            if self.store.claim(ask.task, record.encode()):
                return record.view(now, created=True).reply()
            found = self._read(ask.task)
            if found is not None:
                return found[0].view(now).reply()
        return bsonmsg.fail(Reason.BUSY, f"task {ask.task} is being removed; submit again")

    def _start(self, request: dict[str, Any]) -> Document:
        ask = TaskStart.decode(request)
        now = _now_ms()
        found = self._read(ask.task)
        if found is None:  # acknowledged or collected: the message outlived its task
            return TaskView(ask.task, "unknown", "expired", error=GONE).reply()
        record, version = found
        if record.state in FINAL or ask.attempt != record.attempt:
            return record.view(now).reply()
        wait_ms = record.accepted_ms + round(self.settings.delay_s * 1000) - now
        if wait_ms > 0:  # delaySendProcessTaskToExecuteInMillis
            return record.view(now, wait_ms=wait_ms).reply()
        # Counted here, not by the group's delivery count: a hand-out put off by the delay
        # (a nack) is not a probe; a worker that died with the request is.
        if record.probes >= self.settings.send_probes:
            record.become("failed", now, f"handed to a worker {record.probes} times without "
                          f"a result (maxSendProbeAmount {self.settings.send_probes})")  # fmt: skip
        else:
            record.become("in_progress", now)
            record.runs += 1
            record.probes += 1
        self.store.put(ask.task, record.encode(), version)
        return record.view(now, run=record.state == "in_progress").reply()

    def _finish(self, request: dict[str, Any]) -> Document:
        ask = TaskFinish.decode(request)
        now = _now_ms()
        found = self._read(ask.task)
        if found is None:
            return TaskView(ask.task, "unknown", "expired", error=GONE).reply()
        record, version = found
        if record.state == "expired" and not record.late and not record.collected:
            record.late = True  # stored once, for `roq task show`; never handed to the client
            record.result = ask.result if ask.ok else ask.error.encode()
            self.store.put(ask.task, record.encode(), version)
            return record.view(now).reply()
        if record.state in FINAL or ask.attempt != record.attempt:
            return record.view(now).reply()  # a second result: the first one stands
        retry = not ask.ok and self._retried(record, ask.error)
        if retry:
            record.attempt += 1
            record.retries += 1
            record.probes = 0
            record.become("accepted", now, ask.error)
        elif ask.ok:
            record.result = ask.result
            record.become("done", now)
        else:
            record.become("failed", now, ask.error or "the worker failed")
        self.store.put(ask.task, record.encode(), version)
        return record.view(now, retry=retry).reply()

    def _retried(self, record: Record, error: str) -> bool:
        """exceptionStringToRepeat + maxAcceptExceptionAmount."""
        pattern = self.settings.retry_pattern
        if not pattern or record.retries >= self.settings.retry_max:
            return False
        return re.search(pattern, error[: limits.task_error_chars_max]) is not None

    def _get(self, request: dict[str, Any]) -> Document:
        ask = TaskRef.decode(request)
        found = self._read(ask.task)
        if found is None:
            return TaskView(ask.task, "unknown", "expired", error=GONE).reply()
        return found[0].view(_now_ms()).reply()

    def _ack(self, request: dict[str, Any]) -> Document:
        """The client has the outcome: the record goes (a task still running stays)."""
        ask = TaskRef.decode(request)
        found = self._read(ask.task)
        if found is None:
            return bsonmsg.ok("already removed")
        record, version = found
        if record.state not in FINAL:
            return bsonmsg.fail(Reason.BAD_REQUEST, f"task {ask.task} is {record.state}")
        if not self.store.delete(ask.task, version):
            return bsonmsg.fail(Reason.BUSY, f"task {ask.task} changed; acknowledge again")
        return bsonmsg.ok("removed")

    def _config(self, request: dict[str, Any]) -> Document:
        ask = TaskConfig.decode(request)
        if ask.settings:
            try:
                merged = {**(self._overrides or {}), **ask.settings}
                self.settings = self.defaults.overridden(merged, f"queue {self.queue}")
            except ConfigError as error:
                return bsonmsg.fail(Reason.BAD_REQUEST, str(error))
            self.store.save_settings(merged)
            self._overrides = merged
            log.info("%s: request settings now %s", self.name, merged)
        return bsonmsg.ok(Settings=self.settings.as_text())

    # --- deadlines and the collector ----------------------------------------------------------
    def _apply_deadlines(self, record: Record, now: int) -> bool:
        """Move the record on if a deadline passed; True if it changed."""
        s: RequestSettings = self.settings
        if record.state in ("accepted", "in_progress"):
            if now - record.accepted_ms > s.input_ttl_s * 1000:
                why = "howLongTaskInputShouldBeOnQueueWithoutResultItInMillis"
                record.become("expired", now, f"no result within {s.input_ttl_s:g} s ({why})")
                return True
            if record.state == "accepted" and self._no_worker(record, now):
                record.become("no_worker", now, f"no worker of service {record.service} in "
                              f"{s.repeats} looks {s.repeat_wait_s:g} s apart "
                              "(repeatsAmountByDelegator)")  # fmt: skip
                return True
            return False
        if not record.collected and now - record.changed_ms > s.result_ttl_s * 1000:
            record.collected, record.result = True, b""
            why = "howLongTaskResultShouldBeOnQueueWithoutDownloadingItInMillis"
            record.become("expired", now, f"not fetched within {s.result_ttl_s:g} s ({why})")
            return True
        return False

    def _no_worker(self, record: Record, now: int) -> bool:
        looked_ms = self.settings.repeats * self.settings.repeat_wait_s * 1000
        if now - record.changed_ms < looked_ms:
            return False
        return self._live_workers(service_group(record.service)) == 0

    def tick(self) -> None:
        """One collector pass over at most `limits.task_gc_batch` records."""
        now = time.monotonic()
        if now < self._next_gc:
            return
        self._next_gc = now + limits.task_gc_period_s
        try:
            if not self._gc_ids:
                self._gc_ids = self.store.tasks()[: limits.task_records_max]
                if not self._gc_ids:
                    return
                self._load_settings()
            batch, self._gc_ids = (
                self._gc_ids[: limits.task_gc_batch],
                self._gc_ids[limits.task_gc_batch :],
            )
            for task in batch:
                self._collect(task)
        except CoordinationError as error:
            log.warning("%s: task collector: %s", self.name, error)
            self._gc_ids = []

    def _collect(self, task: str) -> None:
        try:
            found = self._read(task)
        except StaleWrite:
            return  # changed while we looked: the next pass sees it
        if found is None:
            return
        record, version = found
        old = _now_ms() - record.changed_ms > limits.task_tombstone_s * 1000
        if record.collected and old and self.store.delete(task, version):
            self.collected += 1

    def close(self) -> None:
        self.store.close()
