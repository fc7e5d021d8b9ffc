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

Reads come from a cache: this monitor makes every write to its queue's records (another monitor
serves the queue only once this one is fenced or gone), so what it read or wrote last is what
ZooKeeper holds. A write that fails drops the record from the cache (the next read goes to
ZooKeeper); a monitor started or re-placed begins with an empty cache. A TASK_GET with `Wait`
is held (a long poll) until a write makes its task final or removes it, or its wait ends: the
requester hears its result as soon as it is stored instead of polling for it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import bson

from roq import limits
from roq.config.components import MonitorSettings, RequestSettings
from roq.coordination.paths import Paths
from roq.coordination.session import SharedSession
from roq.coordination.taskstore import RolledBack, StaleWrite, TaskStore, TaskWrite
from roq.errors import ConfigError, CoordinationError
from roq.monitor.tasklog import TaskLog
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Answer, Done, Encodable, Refused, Route
from roq.protocol.messages.tasks import (
    FINAL,
    GONE,
    TaskConfig,
    TaskFinish,
    TaskRef,
    TaskSettings,
    TaskStart,
    TaskSubmit,
    TaskView,
    service_group,
)
from roq.transport.rpc import Envelope

Reply = Callable[[Envelope, Encodable], None]  # answers a held request (service.py)
TaskRequest = TaskSubmit | TaskStart | TaskFinish | TaskRef | TaskConfig
T = TypeVar("T", bound=TaskRequest)

log = logging.getLogger(__name__)

TASK_COMMANDS = frozenset(range(MonitorCommand.TASK_SUBMIT, MonitorCommand.TASK_CONFIG + 1))


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
    claim: str = ""  # the token of the submit() call that created it (TaskSubmit)
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


def _view_of(task: str, record: Record | None) -> TaskView:
    """A task's answer to a TASK_GET; a record that is gone answers expired."""
    if record is None:
        return TaskView(task, "unknown", "expired", error=GONE)
    return record.view(_now_ms())


def _zookeeper(error: CoordinationError) -> Refused:
    return Refused(Reason.BUSY, f"tasks: {error}")  # ZooKeeper's path, or "state log: …"


@dataclass
class _Staged:
    """A request's write, made with the others of the monitor's turn (one multi), and its
    reply: sent once the write is in ZooKeeper, never before."""

    write: TaskWrite
    record: Record | None  # None: a deletion
    envelope: Envelope | None  # None: a write no one waits for (an acknowledgement carried along)
    reply: Encodable | None = None
    redo: Callable[[], Encodable] | None = None  # the request again, unstaged, if it failed


def _cost(record: Record) -> int:
    """What a cached record holds, roughly, in bytes (its result and error dominate)."""
    return len(record.result) + len(record.error) + 256


class TaskCache:
    """The records this monitor read or wrote last, with their versions: an LRU bounded by
    `limits.task_cache_records_max` records and `limits.task_cache_bytes_max` bytes. It hands
    out copies, so a change made before its write is never seen by another request."""

    def __init__(self) -> None:
        self._records: OrderedDict[str, tuple[Record, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, task: str) -> bool:
        return task in self._records

    def get(self, task: str) -> tuple[Record, int] | None:
        found = self._records.get(task)
        if found is None:
            return None
        self._records.move_to_end(task)
        return replace(found[0]), found[1]

    def put(self, task: str, record: Record, version: int) -> None:
        self.drop(task)
        self._records[task] = (replace(record), version)
        self.bytes += _cost(record)
        while self._records and (len(self._records) > limits.task_cache_records_max
                                 or self.bytes > limits.task_cache_bytes_max):  # fmt: skip
            _, (old, _) = self._records.popitem(last=False)
            self.bytes -= _cost(old)

    def states(self) -> dict[str, int]:
        """How many of the cached records are in each state."""
        counts: dict[str, int] = {}
        for record, _ in self._records.values():
            counts[record.state] = counts.get(record.state, 0) + 1
        return counts

    def drop(self, task: str) -> None:
        found = self._records.pop(task, None)
        if found is not None:
            self.bytes -= _cost(found[0])

    def clear(self) -> None:
        self._records.clear()
        self.bytes = 0


class TaskManager:
    def __init__(
        self,
        queue: str,
        settings: MonitorSettings,
        zk: SharedSession,  # the monitor's one ZooKeeper session, which it closes
        live_workers: Callable[[str, float], int | None],
        reply: Reply | None = None,
        published: Callable[[str], None] | None = None,
        store: TaskLog | None = None,  # the state log's (delivery.state=log), else ZooKeeper's
    ):
        self.queue, self.name = queue, f"monitor {queue}"
        zk_store = TaskStore(zk, Paths(settings.zk.namespace), queue) if store is None else None
        self.store: TaskStore | TaskLog = store or zk_store  # type: ignore[assignment]
        self.defaults = settings.requests
        self.settings = settings.requests
        # (service's group, within s: 0 for a lease) → its consumers heard from within it
        # (None: the monitor cannot know yet)
        self._live_workers = live_workers
        self._overrides: dict[str, str] | None = None  # None: not read from ZooKeeper yet
        self._gc_ids: list[str] = []
        self._next_gc = 0.0
        self.collected = 0
        self.cache = TaskCache()
        self._reply = reply  # None: no TASK_GET is held (answered at once)
        # a requester waits for an accepted task: its request is on the log (service's group)
        self._published = published
        # held TASK_GETs: task → {number: envelope}, and (deadline, number, task) by deadline
        self._waiters: dict[str, dict[int, Envelope]] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._numbers = itertools.count()
        self.waiting = 0
        # the writes of this turn's requests, committed by `flush` (one multi) before replying
        self._staging: Envelope | None = None  # the request being handled may stage its write
        self._staged: list[_Staged] = []
        self._staged_tasks: set[str] = set()
        self.commits = 0

    # --- requests: their routes in the placement socket's table (service.py) ------------------
    def routes(self) -> dict[int, Route[Any, Envelope | None]]:
        """Each task command's message class and handler: a handler is given the typed request
        and returns the typed reply (a TASK_GET its envelope too: None when it may not be held).
        A request whose write is staged is answered once it is in ZooKeeper (`flush`)."""
        return {
            MonitorCommand.TASK_SUBMIT: Route(TaskSubmit.decode, self._serving(self._submit)),
            MonitorCommand.TASK_START: Route(TaskStart.decode, self._serving(self._start)),
            MonitorCommand.TASK_FINISH: Route(TaskFinish.decode, self._serving(self._finish)),
            MonitorCommand.TASK_GET: Route(TaskRef.decode, self._get),
            MonitorCommand.TASK_ACK: Route(TaskRef.decode, self._serving(self._ack)),
            MonitorCommand.TASK_CONFIG: Route(TaskConfig.decode, self._serving(self._config)),
        }

    def _get(self, ask: TaskRef, envelope: Envelope | None) -> Answer:
        """43: the task now; with `Wait`, held (None) until it is final or gone, or its wait
        ends, when `envelope` is given."""
        if envelope is None:
            return self._serve(self._view, ask, None)
        try:
            self._load_settings()
            self._ack_along(ask.acks)
            if ask.task in self._staged_tasks:
                self.flush()  # its acknowledgement came along: gone, not handed out again
            return self._get_or_hold(ask, envelope)
        except CoordinationError as error:
            return _zookeeper(error)

    def _serving(self, handler: Callable[[T], Encodable]) -> Callable[[T, Envelope | None], Answer]:
        return lambda message, envelope: self._serve(handler, message, envelope)

    def _serve(
        self, handler: Callable[[T], Encodable], ask: T, envelope: Envelope | None
    ) -> Answer:
        """The reply; None when the handler staged a write (its reply waits for `flush`)."""
        if isinstance(ask, TaskSubmit | TaskRef) and ask.acks:
            try:
                self._load_settings()
                self._ack_along(ask.acks)
            except CoordinationError as error:
                return _zookeeper(error)
        if not isinstance(ask, TaskConfig) and ask.task in self._staged_tasks:
            self.flush()  # a request about a task written this turn sees that write's outcome
        staged = len(self._staged)
        self._staging = envelope if self._reply is not None else None
        try:
            self._load_settings()
            reply = handler(ask)
        except CoordinationError as error:  # StaleWrite too: the client asks again
            return _zookeeper(error)
        finally:
            self._staging = None
        if len(self._staged) == staged:
            return reply
        self._staged[-1].reply, self._staged[-1].redo = reply, lambda: handler(ask)
        if len(self._staged) >= limits.task_writes_per_commit_max:
            self.flush()
        return None

    # --- group commit -------------------------------------------------------------------------
    # The writes of a request (a claim, a state change, an acknowledgement's deletion) are not
    # made one by one, each its own ZooKeeper round trip and fsync with the monitor's loop
    # waiting: each request's write is staged, and at the end of the loop's turn `flush` makes
    # all of them in one multi, then sends their replies. A reply is never sent before its
    # write is in ZooKeeper; a write that fails (the record changed, or a claimed id exists)
    # has its request handled again, unstaged, against what ZooKeeper holds.
    def _stage(self, task: str, record: Record | None, version: int) -> bool:
        """Stage the write if the request being handled may (True), else make it now."""
        if self._staging is None:
            return False
        data = None if record is None else record.encode()
        self._staged.append(_Staged(TaskWrite(task, data, version), record, self._staging))
        self._staged_tasks.add(task)
        return True

    def _ack_along(self, tasks: tuple[str, ...]) -> None:
        """Acknowledgements carried by a requester's next request: each final task's record
        goes with this turn's writes, answered to no one (the requester sends an id again
        until a request carrying it is answered: a second acknowledgement finds nothing)."""
        for task in tasks:
            if task in self._staged_tasks:
                continue
            found = self._read(task)
            if found is None or found[0].state not in FINAL:
                continue
            self._staged.append(_Staged(TaskWrite(task, None, found[1]), None, None))
            self._staged_tasks.add(task)
            if len(self._staged) >= limits.task_writes_per_commit_max:
                self.flush()  # the multi's bound holds for these too (64 ride on each request)

    def flush(self) -> None:
        """Make the staged writes (one multi, again without any that failed) and reply."""
        pending, self._staged = self._staged, []
        self._staged_tasks.clear()
        for _ in range(limits.task_commit_rounds_max):
            if not pending:
                return
            try:
                outcomes = self.store.commit([item.write for item in pending])
            except CoordinationError as error:
                self._refuse(pending, error)
                return
            self.commits += 1
            again = []
            for item, outcome in zip(pending, outcomes, strict=True):
                if isinstance(outcome, RolledBack):
                    again.append(item)
                else:
                    self._settle(item, outcome)
            pending = again
        self._refuse(pending, CoordinationError("too many failed multis in a row"))

    def _settle(self, item: _Staged, outcome: int | CoordinationError) -> None:
        task = item.write.task
        reply: Encodable
        if isinstance(outcome, CoordinationError):
            self.cache.drop(task)
            try:  # as before staging: read, decide and write again, now
                reply = item.redo() if item.redo is not None else Refused(Reason.BUSY, "")
            except CoordinationError as error:
                reply = _zookeeper(error)
        else:
            reply = item.reply or Done()
            if item.record is None:
                self.cache.drop(task)
                self._wake(task, None)
            else:
                self.cache.put(task, item.record, outcome)
                if item.record.state in FINAL:
                    self._wake(task, item.record)
        if self._reply is not None and item.envelope is not None:
            self._reply(item.envelope, reply)

    def _refuse(self, pending: list[_Staged], error: CoordinationError) -> None:
        """Not known to be written (a lost connection may have made them): the clients ask
        again, and the cache forgets those tasks (ZooKeeper's copy is read again)."""
        for item in pending:
            self.cache.drop(item.write.task)
            if self._reply is not None and item.envelope is not None:
                self._reply(item.envelope, _zookeeper(error))

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
        found = self.cache.get(task) or self._load(task)
        if found is None:
            return None
        record, version = found
        if self._apply_deadlines(record, _now_ms()):
            version = self._put(task, record, version)
        return record, version

    def _load(self, task: str) -> tuple[Record, int] | None:
        found = self.store.get(task)
        if found is None:
            return None
        record = Record.decode(found[0])
        if record is None:
            self._delete(task, found[1])
            return None
        self.cache.put(task, record, found[1])
        return record, found[1]

    # Every write goes through these three: the cache follows what ZooKeeper took, and the
    # requests held for a task are answered once it is final or gone.
    def _claim(self, task: str, record: Record, staged: bool = False) -> bool:
        if task in self.cache:
            return False  # it exists: the cache holds what ZooKeeper does
        if staged and self._stage(task, record, -1):
            return True  # its reply waits for the create (the redo reads an existing record)
        if not self.store.claim(task, record.encode()):
            self.cache.drop(task)  # someone else's: read it from ZooKeeper
            return False
        self.cache.put(task, record, 0)
        return True

    def _put(self, task: str, record: Record, version: int, staged: bool = False) -> int:
        if staged and self._stage(task, replace(record), version):
            return version  # unused: the request's handling ends with this write
        try:
            version = self.store.put(task, record.encode(), version)
        except CoordinationError:  # StaleWrite too: ZooKeeper's copy is read again
            self.cache.drop(task)
            raise
        self.cache.put(task, record, version)
        if record.state in FINAL:
            self._wake(task, record)
        return version

    def _delete(self, task: str, version: int = -1, staged: bool = False) -> bool:
        if staged and self._stage(task, None, version):
            return True
        self.cache.drop(task)
        deleted = self.store.delete(task, version)
        if deleted:
            self._wake(task, None)
        return deleted

    def _submit(self, ask: TaskSubmit) -> Encodable:
        now = _now_ms()
        for _ in range(2):  # a record deleted between our claim and our read: claim again
            record = Record(ask.task, ask.service, accepted_ms=now, changed_ms=now)
            record.claim = ask.claim
            if self._claim(ask.task, record, staged=True):
                return record.view(now, created=True)
            found = self._read(ask.task)
            if found is not None:
                mine = bool(ask.claim) and found[0].claim == ask.claim
                again = mine and found[0].state == "accepted"  # its first answer was lost
                return found[0].view(now, created=again)
        return Refused(Reason.BUSY, f"task {ask.task} is being removed; submit again")

    def _start(self, ask: TaskStart) -> Encodable:
        now = _now_ms()
        found = self._read(ask.task)
        if found is None:  # acknowledged or collected: the message outlived its task
            return TaskView(ask.task, "unknown", "expired", error=GONE)
        record, version = found
        if record.state in FINAL or ask.attempt != record.attempt:
            return record.view(now)
        if ask.expired:
            record.become("expired", now, "its request message expired (its expires_at_us) "
                          "before a worker took it")  # fmt: skip
            self._put(ask.task, record, version, staged=True)
            return record.view(now)
        wait_ms = record.accepted_ms + round(self.settings.delay_s * 1000) - now
        if wait_ms > 0:  # delaySendProcessTaskToExecuteInMillis
            return record.view(now, wait_ms=wait_ms)
        # Counted here, not by the group's delivery count: a hand-out put off by the delay
        # (a nack) is not a probe; a worker that died with the request is.
        if record.probes >= self.settings.send_probes:
            record.become("failed", now, f"handed to a worker {record.probes} times without "
                          f"a result (maxSendProbeAmount {self.settings.send_probes})")  # fmt: skip
        else:
            record.become("in_progress", now)
            record.runs += 1
            record.probes += 1
        self._put(ask.task, record, version, staged=True)
        return record.view(now, run=record.state == "in_progress")

    def _finish(self, ask: TaskFinish) -> Encodable:
        now = _now_ms()
        ask = self._bounded(ask)
        found = self._read(ask.task)
        if found is None:
            return TaskView(ask.task, "unknown", "expired", error=GONE)
        record, version = found
        if record.state == "expired" and not record.late and not record.collected:
            record.late = True  # stored once, for `roq task show`; never handed to the client
            record.result = ask.result if ask.ok else ask.error.encode()
            self._put(ask.task, record, version)
            return record.view(now)
        if record.state in FINAL or ask.attempt != record.attempt:
            return record.view(now)  # a second result: the first one stands
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
        self._put(ask.task, record, version, staged=True)
        return record.view(now, retry=retry)

    def _bounded(self, ask: TaskFinish) -> TaskFinish:
        """A result the store cannot keep is the task's error, saying so: a znode keeps
        `limits.task_result_zk_bytes_max` (delivery.state=zookeeper), a state-log record up to
        `limits.task_result_bytes_max` (the decoder's bound)."""
        if isinstance(self.store, TaskLog) or len(ask.result) <= limits.task_result_zk_bytes_max:
            return ask
        error = (f"result of {len(ask.result)} bytes: more than the "
                 f"{limits.task_result_zk_bytes_max} bytes a task keeps with "
                 f"delivery.state=zookeeper (delivery.state=log keeps up to "
                 f"{limits.task_result_bytes_max})")  # fmt: skip
        log.warning("%s: task %s: %s", self.name, ask.task, error)
        return TaskFinish(ask.task, ask.attempt, False, error=error)

    def _retried(self, record: Record, error: str) -> bool:
        """exceptionStringToRepeat + maxAcceptExceptionAmount."""
        pattern = self.settings.retry_pattern
        if not pattern or record.retries >= self.settings.retry_max:
            return False
        return re.search(pattern, error[: limits.task_error_chars_max]) is not None

    def _view(self, ask: TaskRef) -> TaskView:
        return self._answer(ask.task)

    def _answer(self, task: str) -> TaskView:
        found = self._read(task)
        return _view_of(task, None if found is None else found[0])

    # --- long polls ---------------------------------------------------------------------------
    def _get_or_hold(self, ask: TaskRef, envelope: Envelope) -> TaskView | None:
        found = self._read(ask.task)
        record = None if found is None else found[0]
        if (record is None or record.state in FINAL or ask.wait_ms <= 0 or self._reply is None
                or self.waiting >= limits.task_waiters_max):  # fmt: skip
            return _view_of(ask.task, record)
        if record.state == "accepted" and self._published is not None:
            self._published(service_group(record.service))  # a worker may take it now
        number = next(self._numbers)
        self._waiters.setdefault(ask.task, {})[number] = envelope
        heapq.heappush(self._deadlines, (time.monotonic() + ask.wait_ms / 1000, number, ask.task))
        self.waiting += 1
        return None

    def _wake(self, task: str, record: Record | None) -> None:
        """Answer every request held for `task` (final now, or gone: None)."""
        held = self._waiters.pop(task, None)
        if not held or self._reply is None:
            return
        self.waiting -= len(held)
        reply = _view_of(task, record)
        for envelope in held.values():
            self._reply(envelope, reply)

    def expire_waits(self) -> None:
        """Answer the held requests whose wait ended, with the task as it is now (a deadline
        that passed meanwhile is applied by the read): the client asks again."""
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, number, task = heapq.heappop(self._deadlines)
            held = self._waiters.get(task)
            envelope = None if held is None else held.pop(number, None)
            if envelope is None:
                continue  # answered already
            if not held:
                del self._waiters[task]
            self.waiting -= 1
            reply: Encodable
            try:
                reply = self._answer(task)
            except CoordinationError as error:
                reply = _zookeeper(error)
            if self._reply is not None:
                self._reply(envelope, reply)

    def release(self, reply: Encodable) -> None:
        """Answer every held request with `reply` (the monitor is fenced), and forget the
        cache: while it did not act, another monitor may have written."""
        held = [e for waiters in self._waiters.values() for e in waiters.values()]
        self._waiters.clear()
        self._deadlines.clear()
        self.waiting = 0
        self.cache.clear()
        if self._reply is not None:
            for envelope in held:
                self._reply(envelope, reply)

    def _ack(self, ask: TaskRef) -> Encodable:
        """The client has the outcome: the record goes (a task still running stays)."""
        found = self._read(ask.task)
        if found is None:
            return Done("already removed")
        record, version = found
        if record.state not in FINAL:
            return Refused(Reason.BAD_REQUEST, f"task {ask.task} is {record.state}")
        if not self._delete(ask.task, version, staged=True):
            return Refused(Reason.BUSY, f"task {ask.task} changed; acknowledge again")
        return Done("removed")

    def _config(self, ask: TaskConfig) -> Encodable:
        if ask.settings:
            try:
                merged = {**(self._overrides or {}), **ask.settings}
                self.settings = self.defaults.overridden(merged, f"queue {self.queue}")
            except ConfigError as error:
                return Refused(Reason.BAD_REQUEST, str(error))
            self.store.save_settings(merged)
            self._overrides = merged
            log.info("%s: request settings now %s", self.name, merged)
        return TaskSettings(self.settings.as_text())

    # --- deadlines and the collector ----------------------------------------------------------
    def _apply_deadlines(self, record: Record, now: int) -> bool:
        """Move the record on if a deadline passed; True if it changed."""
        s: RequestSettings = self.settings
        if record.state in ("accepted", "in_progress"):
            if now - record.accepted_ms > s.input_ttl_s * 1000:
                why = "howLongTaskInputShouldBeOnQueueWithoutResultItInMillis"
                record.become("expired", now, f"no result within {s.input_ttl_s:g} s ({why})")
                return True
            if record.state == "accepted" and self._transient_too_long(record, now):
                why = "howLongTaskStatusWillBeInATransientStateInMillis"
                record.become(
                    "expired",
                    now,
                    f"not started within {s.transient_s:g} s of being "
                    f"accepted or retried: its request never reached a worker ({why})",
                )
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

    def _transient_too_long(self, record: Record, now: int) -> bool:
        """`request.transient.ms` (0: off) passed since accepted or the last retry."""
        limit_ms = self.settings.transient_s * 1000
        return limit_ms > 0 and now - record.changed_ms > limit_ms

    def _no_worker(self, record: Record, now: int) -> bool:
        looked_ms = self.settings.repeats * self.settings.repeat_wait_s * 1000
        if now - record.changed_ms < looked_ms:
            return False
        # request.delegator.check.ms (JLupin howOftenCheckingServerInMillisByDelegator)
        live = self._live_workers(service_group(record.service), self.settings.check_s)
        return live == 0  # None: not a look

    def tick(self) -> None:
        """One collector pass over at most `limits.task_gc_batch` records."""
        now = time.monotonic()
        if now < self._next_gc:
            return
        self._next_gc = now + self.settings.gc_period_s  # request.gc.period.ms
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
        if record.collected and old and self._delete(task, version):
            self.collected += 1
