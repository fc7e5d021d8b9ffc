"""Request/response through a queue: what requesters and workers ask the queue's monitor (B+1,
commands 40–45), the task view it answers with, and the request message workers take from the
queue. docs/requests.md has the flow.

A task is named by its id: the requester's request id, or a fresh one. The monitor keeps one
record per task (monitor/tasks.py); the request itself travels as a message of the queue, keyed
`<service>/`, so the workers of one service take it as a consumer group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import bson
from bson.errors import BSONError

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_bool, field_int, field_str
from roq.protocol.commands import MonitorCommand
from roq.protocol.names import check_queue_name

# accepted: stored, waiting for a worker; in_progress: a worker runs it; done: its result is
# stored; failed: its error is stored; expired: no result in time, or its result was not fetched
# in time (then collected); no_worker: no worker of its service for the delegator's repeats.
STATES = ("accepted", "in_progress", "done", "failed", "expired", "no_worker")
FINAL = frozenset({"done", "failed", "expired", "no_worker"})
# the error of the view the monitor answers for a task id it holds no record of
GONE = "no such task: never submitted, acknowledged, or collected"
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_ATTEMPTS = 1_000_000


def check_task_id(task: str) -> str:
    """A task id names a znode: letters, digits, `_`, `.`, `:`, `-`, at most 64 characters."""
    if not task or len(task) > limits.task_id_chars_max or not _TASK_ID.match(task):
        raise DecodeError(
            f"task id {task[:80]!r} must be 1 to {limits.task_id_chars_max} letters, digits, "
            "'_', '.', ':' or '-', starting with a letter or digit"
        )
    return task


def service_key(service: str) -> bytes:
    """The routing key of a service's requests; '/' never occurs in a name, so a group taking
    the key prefix `a/` never takes service `ab`'s requests."""
    return f"{service}/".encode()


def request_of(key: bytes, payload: bytes) -> RequestMessage | None:
    """The request a message of a queue is, or None when it is not one: keyed
    `service_key(service)` of the service it names, its payload a request's BSON document."""
    if not key.endswith(b"/") or len(payload) < 5 or payload[-1] != 0:
        return None  # a BSON document ends with a NUL: a text line does not
    try:
        request = RequestMessage.decode(bson.decode(payload))
    except (DecodeError, BSONError, TypeError, ValueError, IndexError, OverflowError):
        return None
    return request if service_key(request.service) == key else None


def service_group(service: str) -> str:
    return f"svc.{service}"[: limits.work_group_name_chars_max]


def _task(doc: Mapping[str, Any]) -> str:
    return check_task_id(field_str(doc, "Task", max_chars=limits.task_id_chars_max))


def _acks(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """`Acks`: task ids a requester acknowledges along with this request (optional)."""
    value = doc.get("Acks", [])
    if not isinstance(value, list) or len(value) > limits.task_acks_per_request_max:
        raise DecodeError(
            f"the Acks field must be a list of at most {limits.task_acks_per_request_max} task ids"
        )
    if not all(bsonmsg.is_text(task) for task in value):
        raise DecodeError("the Acks field must hold task ids (strings)")
    return tuple(check_task_id(task) for task in value)


def _with_acks(doc: Document, acks: tuple[str, ...]) -> Document:
    return {**doc, "Acks": list(acks)} if acks else doc


def _service(doc: Mapping[str, Any]) -> str:
    name = field_str(doc, "Service", max_chars=limits.work_group_name_chars_max - 4)
    return check_queue_name(name)


def _bytes(doc: Mapping[str, Any], name: str, max_bytes: int) -> bytes:
    value = doc.get(name, b"")
    if not isinstance(value, bytes) or len(value) > max_bytes:
        raise DecodeError(f"the {name} field must be binary of at most {max_bytes} bytes")
    return value


@dataclass(frozen=True)
class TaskSubmit:
    """40: claim `Task` for `Service`. The claim is the task's record: a second submit of the
    same id finds it and is answered with the existing task (`Created` false) — unless it
    carries the same `Claim` (one submit() call's token) while the task is still accepted:
    that is the same submission asked again because its answer was lost or late, and it is
    answered `Created` true, so that its maker publishes the request (once: the claim is
    answered before the publish, and a submit() that got its answer does not ask again).
    `Acks` (optional): tasks whose results the requester has, acknowledged along the way."""

    task: str
    service: str
    claim: str = ""
    acks: tuple[str, ...] = ()

    def encode(self) -> Document:
        doc = {"CMD": int(MonitorCommand.TASK_SUBMIT), "Task": self.task, "Service": self.service}
        return _with_acks({**doc, "Claim": self.claim} if self.claim else doc, self.acks)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        claim = field_str(doc, "Claim", max_chars=limits.task_claim_chars_max, default="")
        return cls(_task(doc), _service(doc), claim, _acks(doc))


@dataclass(frozen=True)
class TaskStart:
    """41: worker `Worker` took attempt `Attempt` of `Task`, handed out `Deliveries` times.
    `Expired`: its request message was past its expiry (TTL) when the worker took it: the
    task ends `expired`, not run."""

    task: str
    attempt: int
    deliveries: int
    worker: str
    expired: bool = False

    def encode(self) -> Document:
        doc: Document = {"CMD": int(MonitorCommand.TASK_START), "Task": self.task,
                         "Attempt": self.attempt, "Deliveries": self.deliveries,
                         "Worker": self.worker}  # fmt: skip
        if self.expired:  # absent otherwise: a start as before
            doc["Expired"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            _task(doc),
            field_int(doc, "Attempt", hi=_ATTEMPTS),
            field_int(doc, "Deliveries", hi=_ATTEMPTS),
            field_str(doc, "Worker", max_chars=limits.producer_id_chars_max),
            field_bool(doc, "Expired", default=False),
        )


@dataclass(frozen=True)
class TaskFinish:
    """42: attempt `Attempt` of `Task` ended: `Ok` with `Result`, or not with `Error`."""

    task: str
    attempt: int
    ok: bool
    result: bytes = b""
    error: str = ""

    def encode(self) -> Document:
        return {"CMD": int(MonitorCommand.TASK_FINISH), "Task": self.task,
                "Attempt": self.attempt, "Ok": self.ok, "Result": self.result,
                "Error": self.error}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            _task(doc),
            field_int(doc, "Attempt", hi=_ATTEMPTS),
            field_bool(doc, "Ok"),
            _bytes(doc, "Result", limits.task_result_bytes_max),
            field_str(doc, "Error", empty_ok=True, default="",
                      max_chars=limits.task_error_chars_max),
        )  # fmt: skip


@dataclass(frozen=True)
class TaskRef:
    """43 (TASK_GET) and 44 (TASK_ACK): one task by id. A TASK_GET with `Wait` (ms, a long
    poll) is answered once the task is final or gone, or after that long (at most
    `limits.task_watch_max_ms`: a reply stream's subscription; a REQ client asks for at most
    `limits.task_wait_max_ms`, within its request timeout), whichever comes first; without
    it, at once. `Acks` (optional),
    as in TASK_SUBMIT: other tasks acknowledged first."""

    command: int
    task: str
    wait_ms: int = 0
    acks: tuple[str, ...] = ()

    def encode(self) -> Document:
        doc: Document = {"CMD": self.command, "Task": self.task}
        if self.wait_ms > 0:  # absent otherwise: a monitor of an older version answers at once
            doc["Wait"] = self.wait_ms
        return _with_acks(doc, self.acks)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        wait_ms = min(field_int(doc, "Wait", default=0), limits.task_watch_max_ms)
        return cls(bsonmsg.command(doc), _task(doc), wait_ms, _acks(doc))


@dataclass(frozen=True)
class TaskConfig:
    """45: set the queue's request settings named in `Settings` (key → text; empty: read only).
    Answered with every setting, as text (`Settings`)."""

    settings: Mapping[str, str]

    def encode(self) -> Document:
        return {"CMD": int(MonitorCommand.TASK_CONFIG), "Settings": dict(self.settings)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        raw = bsonmsg.field_doc(doc, "Settings") if "Settings" in doc else {}
        if len(raw) > 32 or not all(
            bsonmsg.is_text(k) and bsonmsg.is_text(v) and len(v) <= limits.task_pattern_chars_max
            for k, v in raw.items()
        ):
            raise DecodeError("the Settings field must map at most 32 keys to short strings")
        return cls({str(k): str(v) for k, v in raw.items()})


@dataclass(frozen=True)
class TaskSettings:
    """The reply to 45: every request setting of the queue, as text (`Settings`)."""

    settings: Mapping[str, str]

    def encode(self) -> Document:
        return bsonmsg.ok(Settings=dict(self.settings))

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        raw = bsonmsg.field_doc(doc, "Settings")
        if not all(bsonmsg.is_text(k) and bsonmsg.is_text(v) for k, v in raw.items()):
            raise DecodeError("the Settings field must map keys to strings")
        return cls(dict(raw))


@dataclass(frozen=True)
class TaskView:
    """A task as the monitor answers: its state, and its result or error once final. `Run`
    (TASK_START): the worker runs it; `Retry` (TASK_FINISH): the error matched the queue's
    exceptionStringToRepeat, and attempt `Attempt` is to be published again."""

    task: str
    service: str
    state: str
    attempt: int = 1
    result: bytes = b""
    error: str = ""
    created: bool = False
    run: bool = False
    retry: bool = False
    age_ms: int = 0  # since it was accepted
    wait_ms: int = 0  # TASK_START, not run yet: delaySendProcessTaskToExecuteInMillis left

    @property
    def gone(self) -> bool:
        """No record of the task: it ends as expired for a waiter, but there is none to show."""
        return self.state == "expired" and self.error == GONE

    def encode(self) -> Document:
        return bsonmsg.ok(
            Task=self.task, Service=self.service, State=self.state, Attempt=self.attempt,
            Result=self.result, Error=self.error, Created=self.created, Run=self.run,
            Retry=self.retry, AgeMs=self.age_ms, WaitMs=self.wait_ms,
        )  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        state = field_str(doc, "State", max_chars=16)
        if state not in STATES:
            raise DecodeError(f"unknown task state {state!r}")
        return cls(
            _task(doc),
            _service(doc),
            state,
            field_int(doc, "Attempt", hi=_ATTEMPTS),
            _bytes(doc, "Result", limits.task_result_bytes_max),
            field_str(doc, "Error", empty_ok=True, max_chars=limits.task_error_chars_max),
            field_bool(doc, "Created"),
            field_bool(doc, "Run"),
            field_bool(doc, "Retry"),
            field_int(doc, "AgeMs"),
            field_int(doc, "WaitMs", default=0),
        )


@dataclass(frozen=True)
class RequestMessage:
    """A request as a message of the queue (BSON), keyed `service_key(service)`."""

    task: str
    service: str
    attempt: int
    payload: bytes

    def encode(self) -> Document:
        return {"Task": self.task, "Service": self.service, "Attempt": self.attempt,
                "Payload": self.payload}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            _task(doc),
            _service(doc),
            field_int(doc, "Attempt", lo=1, hi=_ATTEMPTS),
            _bytes(doc, "Payload", limits.task_payload_bytes_max),
        )
