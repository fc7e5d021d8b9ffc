"""Request/response through a queue (JLupin's reactive queues, docs/requests.md).

    with Requester("q1", gcm="127.0.0.1:5000") as requester:
        task = requester.submit("resize", b"...")          # returns once the request is durable
        print(task.id, task.status)                         # accepted, in_progress, done, ...
        print(task.result(timeout_s=30))                    # waits; acknowledges it (removed)
        requester.call("resize", b"...", timeout_s=30)      # the same, blocking
        requester.task(task_id).result(timeout_s=30)        # another process, by task id

    Worker("q1", "resize", handler, gcm=..., concurrency=4).run(stop)
                                                # handler(payload) -> result bytes, up to 4
                                                # at once; raising is the task's error
A task's record lives with the queue's monitor (in its replicated state log, monitor/tasks.py);
its request is a message of the queue, keyed `<service>/`, that the service's workers take as
consumer group `svc.<service>` (client/consumer.py, through its public API only). Requests and
results are up to 1 MiB (64 KiB results with delivery.state=zookeeper). Execution is at least once
(a worker that dies mid-task leaves the request to another after the group's lease); the result
is stored once (the first result of the task's current attempt) and handed out until the client
acknowledges it.

Threads: a Requester, a Task and a Worker, with their sockets, belong to the thread that made
them; `Task.on_done` callbacks run on one thread per Requester, with a link and a reply stream
of its own; a Worker runs up to `concurrency`
handlers on pool threads, each storing its outcome over a link of its own, while the thread in
`run` takes requests and renews their leases.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

import bson

from roq import limits
from roq.client.consumer import Consumer, Delivery
from roq.client.locate import MonitorAddress
from roq.client.monitorlink import Locate, MonitorLink, MonitorRefused
from roq.client.publisher import Publisher
from roq.errors import DecodeError, HandlerFailure, ProtocolError, RoqError, Stopped
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.messages.tasks import (
    FINAL,
    RequestMessage,
    TaskConfig,
    TaskFinish,
    TaskRef,
    TaskStart,
    TaskSubmit,
    TaskView,
    check_task_id,
    service_group,
    service_key,
)
from roq.protocol.ports import MonitorPort
from roq.transport.rpc import Stream

log = logging.getLogger(__name__)

Handler = Callable[[bytes], bytes]


class TaskFailed(RoqError):
    """The task ended without a result: `state` is failed, expired or no_worker; `error` why."""

    def __init__(self, view: TaskView):
        super().__init__(f"task {view.task} {view.state}: {view.error or 'no reason given'}")
        self.state, self.error, self.task = view.state, view.error, view.task


class TaskExpired(TaskFailed):
    """No result in time, or the result was not fetched in time (collected); or no such task."""


class NoWorker(TaskFailed):
    """No worker of the service for the queue's delegator repeats."""


class HandlerStopped(Exception):
    """Raised by a handler that its worker's stop ended (`roq serve --exec` on Ctrl-C or
    SIGTERM): no outcome is stored and the request is handed back (nack, no delay) to another
    worker at once; its run counts as a probe (request.send.probes), as a worker that died."""


class TaskTimeout(RoqError):
    """`Task.result(timeout_s)` ran out before the task ended (it goes on)."""


class _Link(MonitorLink):
    """Requests to the queue's monitor (client/monitorlink.py). It also carries the
    acknowledgements of results handed out (`defer_ack`): they ride along with the next
    TASK_SUBMIT or TASK_GET (`Acks`), so a call costs no round trip of its own for them; an id
    goes until a request carrying it is answered, and what is left is sent at `close`."""

    def __init__(self, queue: str, locate: Locate, monitor: MonitorAddress | None = None):
        super().__init__(queue, locate, monitor=monitor)
        self._acks: list[str] = []  # results handed out, not yet acknowledged

    def acked(self, task: str) -> bool:
        """Whether `task` is among the acknowledgements not sent yet."""
        return task in self._acks

    def defer_ack(self, task: str) -> None:
        self._acks.append(task)
        if len(self._acks) > limits.task_acks_per_request_max:
            self.flush_acks()

    def flush_acks(self) -> None:
        """Acknowledge every deferred result now (one TASK_ACK per `task_acks_per_request_max`)."""
        while self._acks:
            first, *rest = self._acks[: limits.task_acks_per_request_max + 1]
            self.ask(TaskRef(MonitorCommand.TASK_ACK, first, acks=tuple(rest)).encode())
            del self._acks[: len(rest) + 1]

    def view_acking(self, ask: TaskSubmit | TaskRef) -> TaskView:
        """`ask` answered, carrying the deferred acknowledgements: gone once it was."""
        carried = tuple(self._acks[: limits.task_acks_per_request_max])
        view = self.view(replace(ask, acks=carried).encode())
        del self._acks[: len(carried)]
        return view

    def view(self, doc: dict[str, Any]) -> TaskView:
        return TaskView.decode(self.ask(doc))

    def close(self) -> None:
        try:
            self.flush_acks()
        except RoqError as error:  # the results stay until request.result.ttl.ms collects them
            log.warning("queue %s: %d results not acknowledged: %s", self.queue,
                        len(self._acks), error)  # fmt: skip
        super().close()


class _Results:
    """The requester's reply stream: a DEALER to the monitor's placement socket on which it
    subscribes to each task's outcome (a TASK_GET held up to `limits.task_watch_max_ms`, sent
    without waiting as soon as the request is published); the monitor pushes each outcome on it
    the moment it is stored, in whatever order tasks end. Nothing is polled: a subscription
    whose wait ended is renewed; all of them are made again when the stream reconnects (the
    monitor restarted and lost them), and one not answered within its wait and a request
    timeout (the monitor moved) after asking the GCM where the monitor is. Outcomes of tasks
    nobody waits for yet are kept until `take` asks for them. Owned by the requester's thread.
    """

    def __init__(self, link: _Link):
        self._link = link
        self._stream: Stream | None = None
        self._base = ""  # the monitor the stream is connected to
        self._due: dict[str, float] = {}  # subscribed task → when to subscribe again
        self._sent: dict[str, float] = {}  # ... when its last subscription was made
        self._held: dict[str, int] = {}  # ... its subscriptions not answered yet
        self._ended: dict[str, TaskView] = {}  # final outcomes pushed, not yet taken
        # a busy (recovering) or fenced monitor: every subscription is made again after this
        # pause, doubled at each round of refusals up to task_wait_max_ms (bounded traffic to
        # a monitor that cannot serve yet), back to the shortest at its first answer
        self._backoff_ms = limits.work_poll_ms
        self._retry_at = -1.0  # refusals before it answer the round already counted

    def watching(self, task: str) -> bool:
        return task in self._due or task in self._ended

    def watch(self, task: str) -> bool:
        """Subscribe to `task`'s outcome; False when this stream holds as many as it may."""
        if self.watching(task):
            return True
        if len(self._due) + len(self._ended) >= limits.task_stream_watches_max:
            return False
        self._subscribe(task)
        return True

    def _subscribe(self, task: str) -> None:
        stream, wait_ms = self._socket(), limits.task_watch_max_ms
        self._sent[task] = now = time.monotonic()
        # not answered by then (its wait, a request timeout): lost, with a monitor that moved
        self._due[task] = now + (wait_ms + limits.work_request_timeout_ms) / 1000
        ask = TaskRef(MonitorCommand.TASK_GET, task, wait_ms).encode()
        if stream.send(ask):
            self._held[task] = self._held.get(task, 0) + 1
        else:  # its queue is full: the monitor is gone or slow
            self._due[task] = now + self._backoff_ms / 1000

    def _socket(self) -> Stream:
        monitor = self._link.monitor
        if self._stream is None or self._base != monitor.base:
            if self._stream is not None:  # the monitor moved: subscribe there, every task
                self._stream.close()
                self._due = dict.fromkeys(self._due, 0.0)
                self._held = dict.fromkeys(self._held, 0)
            self._stream = Stream(self._link.context, monitor.at(MonitorPort.PLACEMENT))
            self._base = monitor.base
        return self._stream

    def take(self, task: str, deadline: float | None) -> TaskView | None:
        """`task`'s final outcome once pushed (its subscription made if need be), or None at
        `deadline` (None: no deadline). MonitorRefused if the monitor refuses it for good."""
        self.watch(task)
        while task not in self._ended:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            self._step(now, deadline)
        return self._ended.pop(task)

    def ended(self, until: float) -> list[TaskView]:
        """The outcomes pushed by `until` (at once, if some were already), each handed once."""
        while not self._ended and time.monotonic() < until:
            self._step(time.monotonic(), until)
        ended = list(self._ended.values())
        self._ended.clear()
        return ended

    def forget(self, task: str) -> None:
        """No longer wait for `task` (its subscription, if held, is answered to no one)."""
        for kept in (self._due, self._sent, self._held, self._ended):
            kept.pop(task, None)

    def _step(self, now: float, deadline: float | None) -> None:
        """Make again what may be lost, then read the stream until the next thing is due."""
        self._renew(now)
        step = min([*self._due.values(), *([deadline] if deadline is not None else [])])
        self._receive(max(0, int((step - now) * 1000)) + 1)

    def _receive(self, wait_ms: int) -> None:
        try:
            reply = self._socket().receive(wait_ms)
            if reply is None:
                return
            outcome = Reply.decode(reply)
            if not outcome.ok:
                self._refused(outcome.error, outcome.comment)
                return
            view = TaskView.decode(reply)
        except ProtocolError as error:  # its subscription, not answered, is made again
            log.warning("queue %s: a malformed reply on the result stream: %s",
                        self._link.queue, error)  # fmt: skip
            return
        self._backoff_ms = limits.work_poll_ms
        task = view.task
        if task not in self._due:
            return  # a subscription answered twice (one made again after it seemed lost)
        if view.state in FINAL:
            del self._due[task], self._sent[task]
            self._held.pop(task, None)
            self._ended[task] = view
            return
        self._held[task] = max(0, self._held.get(task, 0) - 1)
        if self._held[task] == 0:  # its wait ended with the task still going
            now = time.monotonic()
            if now - self._sent[task] >= limits.task_watch_max_ms / 2000:
                self._subscribe(task)
            else:  # answered at once: a monitor that holds no more (or an older one)
                self._due[task] = now + limits.task_poll_ms / 1000

    def _refused(self, error: str, comment: str) -> None:
        """Which subscription a refusal answers is not said: all are made again, once per
        round of refusals, after the backoff."""
        if error not in (Reason.BUSY, Reason.FENCED):
            raise MonitorRefused(self._link.queue, error, comment)
        now = time.monotonic()
        if now < self._retry_at:
            return  # another answer of the round already counted
        if error == Reason.FENCED:
            self._link.follow()
        self._retry_at = now + self._backoff_ms / 1000
        self._due = dict.fromkeys(self._due, self._retry_at)
        self._held = dict.fromkeys(self._held, 0)  # refused, or answered as such soon
        self._backoff_ms = min(2 * self._backoff_ms, limits.task_wait_max_ms)

    def _renew(self, now: float) -> None:
        """Make again the subscriptions that may be lost."""
        if self._socket().reconnected():  # a new connection: the old one's are lost
            overdue = list(self._due)
        else:
            overdue = [task for task, due in self._due.items() if due <= now]
            lost = [task for task in overdue if self._held.get(task)]
            if lost:  # held, not answered in time: the monitor moved, or the stream is refused
                self._link.follow()
                self._ask_link(lost[0])
        for task in overdue:
            if task in self._due:
                self._held[task] = 0
                self._subscribe(task)

    def _ask_link(self, task: str) -> None:
        """Ask for `task` over the requester's REQ link, which says what the stream cannot
        (its key refused, the monitor refusing for good: raised) and may find it ended."""
        view = self._link.view(TaskRef(MonitorCommand.TASK_GET, task).encode())
        if view.state in FINAL:
            self.forget(task)
            self._ended[task] = view

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class Task:
    """A submitted request, by id: ask its state, wait for its result, acknowledge it."""

    def __init__(
        self,
        link: _Link,
        view: TaskView,
        locate: tuple[str | None, str | None, str],
        results: _Results | None = None,
        callbacks: _Callbacks | None = None,
    ):
        self.id, self.service = view.task, view.service
        self.created = view.created  # False: the request id was known (this is its task)
        self._link, self._view, self._locate = link, view, locate
        self._results = results  # the requester's reply stream (None: long polls of its own)
        self._callbacks = callbacks  # the requester's on_done thread (None: one of its own)

    @property
    def view(self) -> TaskView:
        """The task as last seen (`refresh()` asks again)."""
        return self._view

    @property
    def status(self) -> str:
        return self.refresh().state

    def refresh(self, wait_ms: int = 0) -> TaskView:
        """Ask the task's state; with `wait_ms`, the monitor answers once it is final (or after
        that long, at most `limits.task_wait_max_ms`: a long poll)."""
        ask = TaskRef(MonitorCommand.TASK_GET, self.id, wait_ms)
        self._view = self._link.view_acking(ask)
        return self._view

    def result(self, timeout_s: float | None = None, *, ack: bool = True) -> bytes:
        """Wait for the task to end: its result (acknowledged, so removed, unless `ack` is
        False: with the requester's next request to the monitor, or at its close); TaskFailed
        (TaskExpired, NoWorker) if it ended without one; TaskTimeout after `timeout_s` (None:
        until a deadline of the queue ends it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._link.acked(self.id):  # asked again: the answer is that it was acknowledged
            self._link.flush_acks()
        if self._results is not None and self._results.watch(self.id):
            pushed = self._results.take(self.id, deadline)
            if pushed is None:
                raise TaskTimeout(f"task {self.id} is {self._view.state} after {timeout_s} s")
            self._view = pushed
        else:
            self._poll(deadline, timeout_s)
        view = self._view
        if view.state == "done":
            if ack:
                self._link.defer_ack(self.id)
            return view.result
        raise _failure(view)

    def _poll(self, deadline: float | None, timeout_s: float | None) -> None:
        """Long polls of its own (no reply stream: a Task handed to an on_done callback, or a
        stream holding as many subscriptions as it may), until the task is final."""
        while True:
            wait_ms = limits.task_wait_max_ms
            if deadline is not None:
                wait_ms = min(wait_ms, int((deadline - time.monotonic()) * 1000))
            asked = time.monotonic()
            if self.refresh(max(wait_ms, 0)).state in FINAL:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeout(f"task {self.id} is {self._view.state} after {timeout_s} s")
            if time.monotonic() - asked < wait_ms / 2000:
                # answered well before its wait: a monitor that holds no more requests (or of
                # an older version): poll instead
                time.sleep(limits.task_poll_ms / 1000)

    def ack(self) -> None:
        """The client has the outcome: the task and its result are removed (now, with the
        results acknowledged but not yet sent)."""
        self._link.defer_ack(self.id)
        self._link.flush_acks()

    def on_done(self, callback: Callback, timeout_s: float | None = None) -> threading.Thread:
        """Call `callback(task, result, None)` once the task is done (the result acknowledged
        first), `callback(task, None, failure)` once it ended without one (TaskFailed) or after
        `timeout_s` (TaskTimeout; the task goes on). The callbacks of a requester's tasks run
        one after the other on one thread of its own (returned), which takes their outcomes
        from a reply stream of its own, as pushed; a callback that raises is logged."""
        if self._callbacks is None:
            self._callbacks = _Callbacks(self._link, self._locate)
        thread = self._callbacks.add(self._view, callback, timeout_s)
        if self._results is not None:
            self._results.forget(self.id)  # the callbacks' stream takes its outcome, not ours
        return thread


Callback = Callable[[Task, bytes | None, "TaskFailed | TaskTimeout | None"], None]


@dataclass
class _Waiting:
    """A task on_done waits for: its last view, its callback, until when (None: no bound)."""

    view: TaskView
    callback: Callback
    deadline: float | None


class _Callbacks:
    """`Task.on_done`'s thread for one requester (`roq-results-<queue>`, started at the first
    on_done): a link and a reply stream of its own, the tasks handed over through a bounded
    queue (`limits.task_stream_watches_max`: past it, on_done raises). It ends once its
    requester is closed and every task it took has had its callback."""

    def __init__(self, link: _Link, locate: Locate):
        self._queue, self._locate, self._monitor = link.queue, locate, link.monitor
        self._inbox: queue.Queue[_Waiting] = queue.Queue(limits.task_stream_watches_max)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, view: TaskView, callback: Callback, timeout_s: float | None) -> threading.Thread:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self._inbox.put_nowait(_Waiting(view, callback, deadline))
        except queue.Full:
            raise RoqError(f"queue {self._queue}: {limits.task_stream_watches_max} tasks wait "
                           "for their callbacks already on this requester") from None  # fmt: skip
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"roq-results-{self._queue}", daemon=True
            )
            self._thread.start()
        return self._thread

    def close(self) -> None:
        """The requester is closed: the thread ends once what it holds is called back."""
        self._closed.set()

    def _run(self) -> None:
        link = _Link(self._queue, self._locate, self._monitor)
        results = _Results(link)
        waiting: dict[str, _Waiting] = {}
        try:
            while waiting or not self._inbox.empty() or not self._closed.is_set():
                self._take_new(waiting, results, link)
                # back at least every poll interval: tasks handed over meanwhile wait for it
                deadlines = [w.deadline for w in waiting.values() if w.deadline is not None]
                until = min([*deadlines, time.monotonic() + limits.poll_interval_ms / 1000])
                for view in results.ended(until):
                    if view.task in waiting:
                        _call(link, self._locate, waiting.pop(view.task), view)
                _acknowledge(link)
                self._expire(waiting, results, link)
        except RoqError as error:  # the monitor refused for good: every waiting task is told
            log.warning("queue %s: callbacks: %s", self._queue, error)
        finally:
            results.close()
            link.close()

    def _take_new(self, waiting: dict[str, _Waiting], results: _Results, link: _Link) -> None:
        wait_s = 0.0 if waiting else limits.poll_interval_ms / 1000  # idle: block a little
        while len(waiting) < limits.task_stream_watches_max:
            try:
                new = self._inbox.get(timeout=wait_s) if wait_s else self._inbox.get_nowait()
            except queue.Empty:
                return
            wait_s = 0.0
            if new.view.state in FINAL:
                _call(link, self._locate, new, new.view)  # ended before on_done: at once
            else:
                waiting[new.view.task] = new
                results.watch(new.view.task)

    def _expire(self, waiting: dict[str, _Waiting], results: _Results, link: _Link) -> None:
        now = time.monotonic()
        for task, entry in list(waiting.items()):
            if entry.deadline is not None and now >= entry.deadline:
                del waiting[task]
                results.forget(task)
                timeout = TaskTimeout(f"task {task} is {entry.view.state} after its timeout")
                _notify(Task(link, entry.view, self._locate), entry, None, timeout)


def _call(link: _Link, locate: Locate, entry: _Waiting, view: TaskView) -> None:
    """`entry`'s callback for its task, ended with `view` (a done result acknowledged)."""
    task = Task(link, view, locate)
    if view.state == "done":
        link.defer_ack(view.task)
        _notify(task, entry, view.result, None)
    else:
        _notify(task, entry, None, _failure(view))


def _acknowledge(link: _Link) -> None:
    """The results called back, acknowledged now (nothing else of this thread's carries them)."""
    try:
        link.flush_acks()
    except RoqError as error:  # they stay until request.result.ttl.ms collects them
        log.warning("queue %s: results called back not acknowledged: %s", link.queue, error)


def _notify(
    task: Task, entry: _Waiting, result: bytes | None, failure: TaskFailed | TaskTimeout | None
) -> None:
    try:
        entry.callback(task, result, failure)
    except Exception:  # a callback's bug must not stop the others'
        log.exception("task %s: its on_done callback failed", task.id)


def _failure(view: TaskView) -> TaskFailed:
    if view.state == "expired":
        return TaskExpired(view)
    if view.state == "no_worker":
        return NoWorker(view)
    return TaskFailed(view)


class Requester:
    def __init__(
        self,
        queue: str,
        *,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        acks: str = "all",
    ):
        self.queue, self.acks = queue, acks
        self._locate = (gcm, zk, namespace)
        self._link = _Link(queue, self._locate)
        self._results = _Results(self._link)
        self._callbacks = _Callbacks(self._link, self._locate)
        self._publisher: Publisher | None = None

    def submit(
        self,
        service: str,
        payload: bytes,
        request_id: str | None = None,
        *,
        expires_at_us: int | None = None,
        not_before_us: int | None = None,
    ) -> Task:
        """Returns once the task is accepted: its record stored and its request published and
        confirmed (acks). A request id already known returns that task (its stored result, if
        it has one), without running it again. `expires_at_us` and `not_before_us` (µs since the
        epoch, this machine's clock) go on the request's message: a request still untaken at
        its expiry ends `expired` without running, and none is started before its not-before
        time (docs/guarantees.md, "TTL and delay")."""
        if len(payload) > limits.task_payload_bytes_max:
            raise RoqError(f"a request's payload is at most {limits.task_payload_bytes_max} bytes")
        task_id = check_task_id(request_id) if request_id else uuid.uuid4().hex
        # This call's token: asked again after a lost or late answer, the monitor knows it
        # for this call's own claim (Created), where another submit of the id is not.
        claim = uuid.uuid4().hex
        view = self._link.view_acking(TaskSubmit(task_id, service, claim))
        if view.created:
            # The claim came first: of concurrent submissions of one id only its maker
            # publishes. Dying between the two leaves a task without a request, which ends
            # "expired" after the input time-to-live; submit() never returned it as accepted.
            message = RequestMessage(task_id, service, 1, payload)
            publisher = self._get_publisher()
            publisher.send(bson.encode(message.encode()), service_key(service),
                           expires_at_us=expires_at_us, not_before_us=not_before_us)  # fmt: skip
            publisher.flush()
        if view.state not in FINAL:
            # subscribed now, the request on the log: the monitor wakes a worker held idle,
            # and pushes the outcome when it is stored, whether result() waits yet or not
            self._results.watch(task_id)
        return Task(self._link, view, self._locate, self._results, self._callbacks)

    def call(self, service: str, payload: bytes, timeout_s: float | None = None,
             request_id: str | None = None) -> bytes:  # fmt: skip
        """Submit and wait for the result (acknowledged)."""
        return self.submit(service, payload, request_id).result(timeout_s)

    def task(self, task_id: str) -> Task:
        """A task submitted before (by this process or another), by its id."""
        view = self._link.view(TaskRef(MonitorCommand.TASK_GET, check_task_id(task_id)).encode())
        return Task(self._link, view, self._locate, self._results, self._callbacks)

    def settings(self, changes: dict[str, str] | None = None) -> dict[str, str]:
        """The queue's request settings, after setting `changes` (key → value text)."""
        reply = self._link.ask(TaskConfig(changes or {}).encode())
        settings = reply.get("Settings")
        if not isinstance(settings, dict):
            raise RoqError("the monitor answered without its settings")
        return {str(k): str(v) for k, v in settings.items()}

    def _get_publisher(self) -> Publisher:
        if self._publisher is None:
            gcm, zk, namespace = self._locate
            self._publisher = Publisher(
                self.queue, gcm=gcm, zk=zk, namespace=namespace, acks=self.acks, linger_ms=0
            )
        return self._publisher

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
        self._results.close()
        self._callbacks.close()
        self._link.close()

    def __enter__(self) -> Requester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Run:
    """A request whose handler runs on the Worker's pool; its lease is renewed at `renew_at`."""

    message: RequestMessage
    delivery: Delivery
    renew_at: float
    renewing: bool = True


def failure_text(error: BaseException) -> str:
    """A failed task's error, which `request.retry.pattern` (JLupin's exceptionStringToRepeat)
    is searched in: `Type: message`, then the whole traceback (most recent call last), as
    JLupin matched the stack trace. Bounded by `limits.task_error_chars_max`: past it the
    traceback's oldest lines go first, so the summary and the failing frame stay."""
    bound = limits.task_error_chars_max
    if isinstance(error, HandlerFailure):
        return str(error)[:bound]
    head = f"{type(error).__name__}: {error}"[:bound]
    trace = "".join(traceback.format_exception(error)).rstrip()
    room = bound - len(head) - 2  # the newline, and the mark of a cut
    if room <= 0:
        return head
    if len(trace) > room:
        trace = "…" + trace[-room:]
    return f"{head}\n{trace}"


def _worker_repeats(link: _Link) -> tuple[int, float]:
    """The queue's request.worker.repeats and request.worker.wait.ms (JLupin's repeatsAmount,
    timeToWaitBetweenRepeatProbeInMillis) as its monitor says; a monitor of an older version,
    which has none (or refuses their read to a principal without admin), leaves what the link
    always did (limits.work_monitor_wait_s)."""
    try:
        settings = link.ask(TaskConfig({}).encode()).get("Settings")
    except MonitorRefused as refused:
        log.warning("queue %s: the worker's request settings were not read, the defaults hold: "
                    "%s", link.queue, refused)  # fmt: skip
        settings = {}
    found = settings if isinstance(settings, dict) else {}
    wait_s = int(found.get("request.worker.wait.ms", limits.work_poll_ms)) / 1000
    default = round(limits.work_monitor_wait_s / wait_s)
    return int(found.get("request.worker.repeats", default)), wait_s


class _Either:
    """Set once either of two events is (read-only: `is_set`)."""

    def __init__(self, first: threading.Event, second: threading.Event | None):
        self._events = (first, second)

    def is_set(self) -> bool:
        return any(event is not None and event.is_set() for event in self._events)


class _Availability:
    """What a Worker's availability check said last (JLupin's checkAvailableScript); a check
    that raises counts as "not available", logged with why."""

    def __init__(self) -> None:
        self.now = True
        self.changed = threading.Event()  # set at each change (the paused worker waits on it)

    def check(self, available: Callable[[], bool], name: str) -> None:
        why = "it said False"
        try:
            said = bool(available())
        except Exception as error:  # a user's check: its failure is "not available"
            said, why = False, f"{type(error).__name__}: {error}"
        if said != self.now:  # logged at each change, not at each check
            if not said:
                log.warning("%s: the availability check says not available: %s", name, why)
            self.now = said
            self.changed.set()
            self.changed.clear()

    def run(self, available: Callable[[], bool], name: str, period_s: float,
            done: threading.Event) -> None:  # fmt: skip
        while not done.wait(period_s):
            self.check(available, name)


class Worker:
    """Runs a service's requests: one consumer of the service's group, up to `concurrency`
    requests at once (JLupin's threadAmount). `prefetch` bounds the requests its consumer holds
    handed out (RabbitMQ's basic.qos; None: the group's work.inflight): fewer leave more to the
    service's other workers, at one more round trip to the monitor per request.

    The thread that calls `run` owns the consumer and a link to the monitor: it takes each
    request, asks the monitor whether to run it (TASK_START), renews the leases of the running
    ones and settles the finished ones. Each handler runs on a pool thread, which stores its
    outcome itself (TASK_FINISH, over a link of that thread's own), so a result reaches its
    requester without waiting for the owner's next turn.
    """

    def __init__(
        self,
        queue: str,
        service: str,
        handler: Handler,
        *,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        concurrency: int = 1,
        prefetch: int | None = None,
        available: Callable[[], bool] | None = None,
        check_period_s: float = limits.worker_check_period_s,
    ):
        """`available` (JLupin's checkAvailableScript), asked every `check_period_s` on a thread
        of its own: while it says False (or raises) the worker takes no request (see `run`)."""
        if not 1 <= concurrency <= limits.worker_concurrency_max:
            raise RoqError(
                f"concurrency is 1 to {limits.worker_concurrency_max} requests, not {concurrency}"
            )
        low, high = limits.worker_check_period_min_s, limits.worker_check_period_max_s
        if not low <= check_period_s <= high:
            raise RoqError(f"the availability check's period is {low} to {high} s, "
                           f"not {check_period_s}")  # fmt: skip
        self.queue, self.service, self.handler = queue, service, handler
        self.concurrency = concurrency
        self._locate = (gcm, zk, namespace)
        self._prefetch = prefetch
        self.consumer = self._join()
        self.name = f"worker {self.consumer.consumer_id[:8]} of {queue}/{service}"
        self._link = _Link(queue, self._locate)
        self._repeat = _worker_repeats(self._link)
        self._link.repeat(*self._repeat)
        self._results = _Results(self._link)
        self._callbacks = _Callbacks(self._link, self._locate)
        self._publisher: Publisher | None = None
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix=f"handler-{service}")
        self._running: dict[Future[TaskView], _Run] = {}
        self._local = threading.local()  # each pool thread's own link
        self._links: list[_Link] = []  # every pool thread's link, closed with the Worker
        self._links_lock = threading.Lock()
        self.executed = 0
        self.renewals = 0  # leases renewed while a handler ran (long handlers)
        self._available = available
        self._check_period_s = check_period_s
        self._availability = _Availability()
        self.pauses = 0  # times the check said "not available" and the worker left its group
        self._left = False  # its consumer closed: paused, stopped before joining again

    def _join(self) -> Consumer:
        gcm, zk, namespace = self._locate
        return Consumer(
            self.queue, service_group(self.service), gcm=gcm, zk=zk, namespace=namespace,
            prefix=service_key(self.service), held=True, inflight=self._prefetch,
            on_expired=self._expired,
        )  # fmt: skip

    def run(self, stop: threading.Event, count: int | None = None,
            idle_timeout_s: float | None = None,
            drain: threading.Event | None = None) -> int:  # fmt: skip
        """Take requests until `stop` (or `drain`, or `count` executed, or `idle_timeout_s`
        without a request), then let the running ones finish; the number executed. `drain`
        stops the taking alone: the consumer still settles however long the running ones take
        (`roq serve --memory-max` restarting its worker), where `stop` gives them its grace."""
        self.consumer.stop_with(stop)  # a gone monitor does not hold up the stop
        checked = threading.Event()  # ends the checks with the run
        self._start_checks(checked)
        try:
            self._take(stop, _Either(stop, drain), count, idle_timeout_s)
        finally:
            checked.set()
        return self.executed

    def _take(self, stop: threading.Event, ended: _Either, count: int | None,
              idle_timeout_s: float | None) -> None:  # fmt: skip
        idle_since = time.monotonic()
        while not ended.is_set():
            self._tend()
            if not self._availability.now and self._pause(stop, ended):
                idle_since = time.monotonic()
                continue
            started = self.executed + len(self._running)
            if count is not None and started >= count:
                if not self._running:
                    break
                self._wait_finished()
                continue
            if len(self._running) >= self.concurrency:
                self._wait_finished()
                continue
            try:
                delivery = self.consumer.next(timeout_s=self._next_wait_s())
            except RoqError:
                if stop.is_set():
                    break  # stopped while its monitor did not answer
                raise
            if delivery is not None:
                self._begin(delivery)
                idle_since = time.monotonic()
            elif (
                not self._running
                and idle_timeout_s is not None
                and (time.monotonic() - idle_since > idle_timeout_s)
            ):
                break
        while self._running:  # stopped: the running requests end and are settled
            self._wait_finished()
            self._tend()

    def _start_checks(self, done: threading.Event) -> None:
        """The first check before any request is taken, then one every period on a thread,
        until `done`."""
        if self._available is None:
            return
        self._availability.check(self._available, self.name)
        thread = threading.Thread(target=self._availability.run,
                                  args=(self._available, self.name, self._check_period_s, done),
                                  name=f"roq-check-{self.service}", daemon=True)  # fmt: skip
        thread.start()

    def _pause(self, stop: threading.Event, ended: _Either) -> bool:
        """Not available: once its running requests are settled, the worker leaves its group
        (its slots and unsettled requests go back, for the service's other workers: it counts
        as no worker) and joins again when a check says available. False while some run."""
        if self._running:
            self._wait_finished()
            return False
        self.pauses += 1
        log.warning("%s: not available (the check said so): it leaves its group and takes no "
                    "request until the check says available", self.name)  # fmt: skip
        self.consumer.close()
        self._left = True
        while not ended.is_set() and not self._availability.now:
            self._availability.changed.wait(limits.work_cli_stop_check_s)
        if ended.is_set():
            return True
        self.consumer = self._join()
        self.consumer.stop_with(stop)
        self._left = False
        log.warning("%s: available again: it takes requests", self.name)
        return True

    def _next_wait_s(self) -> float:
        if not self._running:
            return limits.worker_idle_poll_s
        return limits.worker_busy_poll_s

    def _wait_finished(self) -> None:
        """Until a handler ends or the next lease renewal is due."""
        if self._running:
            due = min(run.renew_at for run in self._running.values())
            wait(self._running, max(0.0, due - time.monotonic()), FIRST_COMPLETED)

    def _tend(self) -> None:
        """Settle the finished requests and renew the leases that are due."""
        for future in [f for f in self._running if f.done()]:
            self._settle(self._running.pop(future), future)
        now = time.monotonic()
        for run in self._running.values():
            if run.renew_at <= now:
                run.renew_at = now + self._renew_period_s()
                if run.renewing:
                    run.renewing = self._renew(run.message, run.delivery)

    def _begin(self, delivery: Delivery) -> None:
        """One request: ask the monitor, and start its handler (or settle it at once)."""
        try:
            message = RequestMessage.decode(bson.decode(delivery.payload))
        except (DecodeError, bson.errors.BSONError, TypeError, ValueError) as error:
            delivery.reject(f"not a request: {error}"[: limits.work_reason_chars_max])
            return
        start = TaskStart(message.task, message.attempt, delivery.deliveries, self.name)
        view = self._link.view(start.encode())
        if not view.run:
            if view.state in FINAL or view.attempt != message.attempt:
                delivery.ack()  # ended already, or a stale attempt: nothing to run
            else:  # delaySendProcessTaskToExecuteInMillis (or a concurrent change): later
                delivery.nack(delay_s=max(view.wait_ms, limits.task_poll_ms) / 1000)
            return
        future = self._pool.submit(self._execute_and_store, message)
        self._running[future] = _Run(message, delivery, time.monotonic() + self._renew_period_s())

    def _expired(self, delivery: Delivery) -> None:
        """The consumer dropped a request past its message's expiry: its task ends `expired`
        (not run). The consumer settles the message; a monitor that does not answer now leaves
        the task to its input time-to-live."""
        try:
            message = RequestMessage.decode(bson.decode(delivery.payload))
            start = TaskStart(message.task, message.attempt, delivery.deliveries, self.name,
                              expired=True)  # fmt: skip
            self._link.view(start.encode())
        except (DecodeError, bson.errors.BSONError, TypeError, ValueError, RoqError) as error:
            log.warning("%s: a request past its expiry was dropped; its task was not told: %s",
                        self.name, error)  # fmt: skip
        else:
            log.info("%s: task %s expired before it was taken: not run", self.name, message.task)

    def _execute_and_store(self, message: RequestMessage) -> TaskView:
        """On a pool thread: run the handler, store its outcome, return the monitor's answer.
        A handler that raised HandlerStopped stores none (raised again: `_settle` releases)."""
        try:
            finish = self._execute(message)
        except HandlerStopped:
            raise
        except BaseException:  # a handler's SystemExit is its task's error too
            finish = TaskFinish(message.task, message.attempt, False, error="the handler died")
        return self._thread_link().view(finish.encode())

    def _settle(self, run: _Run, future: Future[TaskView]) -> None:
        """A handler ended and its outcome was stored (or could not be): settle its request.
        A worker stopped meanwhile whose monitor does not answer (`Stopped`) leaves it to the
        lease: the request comes back, and an outcome stored answers it without a second run.
        Before, the `Stopped` escaped `run` from the worker's thread (CI of 27 Nov: the monitor
        killed while a requester waited)."""
        try:
            self._settle_run(run, future)
        except Stopped as error:
            log.info("%s: task %s not settled before the stop (%s): its lease returns it",
                     self.name, run.message.task, error)  # fmt: skip

    def _settle_run(self, run: _Run, future: Future[TaskView]) -> None:
        message, delivery = run.message, run.delivery
        self.executed += 1
        try:
            outcome = future.result()
        except HandlerStopped:  # its worker stops: the request goes to another one at once
            log.info("%s: task %s handed back (stopped while it ran)", self.name, message.task)
            delivery.nack(delay_s=0, reason="its worker was stopped while it ran")
            return
        except RoqError as error:  # the monitor did not answer: the request is run again
            log.warning("%s: task %s: its outcome was not stored: %s", self.name, message.task,
                        error)  # fmt: skip
            delivery.nack()
            return
        if outcome.retry:  # exceptionStringToRepeat: the next attempt, as a new message
            again = RequestMessage(message.task, message.service, outcome.attempt, message.payload)
            publisher = self._get_publisher()
            publisher.send(bson.encode(again.encode()), service_key(message.service))
            publisher.flush()
        delivery.ack()

    def _thread_link(self) -> _Link:
        link: _Link | None = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = _Link(self.queue, self._locate, self._link.monitor)
            link.repeat(*self._repeat)
            with self._links_lock:
                self._links.append(link)
        return link

    def _renew(self, message: RequestMessage, delivery: Delivery) -> bool:
        """Renew the delivery's lease if its task still waits for this run; False once not."""
        view = self._link.view(TaskRef(MonitorCommand.TASK_GET, message.task).encode())
        if view.state in FINAL or view.attempt != message.attempt:
            log.warning("%s: task %s is %s while its handler still runs: its lease is no longer "
                        "renewed", self.name, message.task, view.state)  # fmt: skip
            return False
        delivery.in_progress()
        self.renewals += 1
        return True

    def _renew_period_s(self) -> float:
        period_ms = self.consumer.settings.lease_ms * limits.task_lease_renew_share
        return max(period_ms, limits.task_lease_renew_min_ms) / 1000

    def _execute(self, message: RequestMessage) -> TaskFinish:
        try:
            result = self.handler(message.payload)
        except HandlerStopped:
            raise
        except Exception as error:  # the service's error is the task's outcome
            return TaskFinish(message.task, message.attempt, False, error=failure_text(error))
        if not isinstance(result, bytes | bytearray):  # typed bytes, but a user's callable
            kind = type(result).__name__  # type: ignore[unreachable]
            return TaskFinish(message.task, message.attempt, False, error=f"returned a {kind}")
        if len(result) > limits.task_result_bytes_max:
            return TaskFinish(message.task, message.attempt, False,
                              error=f"result of {len(result)} bytes: more than "
                              f"{limits.task_result_bytes_max}")  # fmt: skip
        return TaskFinish(message.task, message.attempt, True, result=bytes(result))

    def _get_publisher(self) -> Publisher:
        if self._publisher is None:
            gcm, zk, namespace = self._locate
            self._publisher = Publisher(self.queue, gcm=gcm, zk=zk, namespace=namespace,
                                        acks="all", linger_ms=0)  # fmt: skip
        return self._publisher

    def close(self) -> None:
        self._pool.shutdown(wait=True)  # `run` returned: no handler runs, no link is in use
        for link in self._links:
            link.close()
        if not self._left:
            self.consumer.close()
        if self._publisher is not None:
            self._publisher.close()
        self._link.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
