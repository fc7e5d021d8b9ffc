"""The HTTP API: the mq seed's five calls under /v1 (its answers: 200, 230, 231, 400 with a JSON
reason), the same under /v2 with batch publish, a long-polling get and errors as
application/problem+json (RFC 9457), and GET /metrics. docs/http.md documents both.

Every call first shows a bearer token (auth.py): none or an unknown one is a 401 before the body
is read, and so is a 403 for a principal that holds the call's permission on no topic at all; a
principal without the permission on the body's topic is a 403 naming it, and so is one that
names another principal's owner or subscriber (the monitor refuses it). A principal with
`http.requests.per.principal` requests in progress gets a 429 (issue 31, finding 5), and so does
one past its `http.publish.bytes.per.principal` (finding 7: `Rate`).

Every request body is refused by its declared length past what its call can need (`body_max`:
names alone but for a publish) before a byte is read, then read in chunks within
`limits.http_body_read_s`, parsed as JSON (on a worker thread when large) and checked field by
field before anything else happens; whatever is wrong with it is a 4xx with
the reason, never an exception that reaches the server. Each call's body is read once into its
request class (`Register`, `Publish`, `Subscribe`, `Get`, `Ack`), after the topic's permission
is checked, and the call (`Calls`) is given that typed request, never the JSON document.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Self, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from roq import limits
from roq.config import HttpSettings
from roq.errors import CoordinationError, RoqError, TopicForbidden, TopicRefused
from roq.http.auth import Access, Refused
from roq.http.gateway import EVICTED, NO_MESSAGE, OK, Gateway, Got, Unavailable
from roq.http.metrics import CONTENT_TYPE, Metrics
from roq.log.format import RecordMeta, encode_meta
from roq.log.metatext import after_ms, message_id_from_text, message_id_text, now_us
from roq.protocol.principals import Permission, Principal

Doc = dict[str, Any]  # a JSON body, as read or as answered
Parse = Callable[[bytes], Awaitable[Any]]  # json.loads, on a worker thread
Answer = tuple[int, Doc]
M = TypeVar("M")
PROBLEM = "application/problem+json"
META_FIELDS = ("headers", "id", "ttl", "delay")  # a v2 message's meta, beside `msg` or in `msgs`
TITLES = {
    400: "bad request",
    401: "unauthorized",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    408: "request timeout",
    413: "request body too large",
    429: "too many requests",
    EVICTED: "message evicted",
    NO_MESSAGE: "no message",
    503: "unavailable",
}


class BadRequest(Exception):
    def __init__(self, reason: str, status: int = 400, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.reason, self.status, self.headers = reason, status, headers


# --- reading a request -----------------------------------------------------------------------
async def read_json(request: Request, most: int, parse: Parse) -> Doc:
    """The body as a JSON object: refused by its declared length before a byte is read, read
    whole within `limits.http_body_read_s`, a large one parsed off the event loop."""
    declared = request.headers.get("content-length")
    too_large = BadRequest(f"body larger than {most} bytes", 413)
    if declared is not None and (not declared.isdigit() or int(declared) > most):
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(limits.http_body_read_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > most:  # chunked: no length declared
                    raise too_large
    except TimeoutError:
        late = f"the body did not arrive within {limits.http_body_read_s:.0f} s"
        raise BadRequest(late, 408) from None
    try:
        if len(body) > limits.http_parse_inline_bytes_max:
            doc = await parse(bytes(body))
        else:
            doc = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    return doc


class Share:
    """Requests in progress per principal: past `http.requests.per.principal`, a 429, so that one
    token (leaked, or a client gone wrong) cannot take every request the gateway serves. The
    cluster's own principal (security off) is not counted."""

    def __init__(self, most: int):
        self.most = most
        self.busy: Counter[str] = Counter()

    @contextmanager
    def held(self, principal: Principal) -> Iterator[None]:
        if principal.superuser:
            yield
            return
        name = principal.name
        if self.busy[name] >= self.most:
            raise BadRequest(f"principal {name} has {self.most} requests in progress: its quota "
                             "(http.requests.per.principal) on this gateway", 429)  # fmt: skip
        self.busy[name] += 1
        try:
            yield
        finally:
            self.busy[name] -= 1
            if not self.busy[name]:
                del self.busy[name]

    def total(self) -> int:
        return sum(self.busy.values())


class Rate:
    """Message bytes a principal publishes per second through this gateway (a quota, issue 31,
    finding 7: `http.publish.bytes.per.principal`): a bucket of one second's bytes, refilled as
    time passes. A publish goes through while the bucket is not empty and takes its bytes (a
    batch larger than the bucket borrows ahead: the next publishes wait until it is paid back),
    else a 429 with Retry-After. Not for the cluster, nor a principal holding admin on every
    topic. Per gateway: N gateways let a principal publish N times as much."""

    def __init__(self, per_s: int):
        self.per_s = per_s
        self.buckets: dict[str, tuple[float, float]] = {}  # principal -> (bytes left, when)

    def take(self, principal: Principal, size: int) -> None:
        if not self.per_s or Access.unbounded(principal):
            return
        now, name = time.monotonic(), principal.name
        left, then = self.buckets.get(name, (self.per_s, now))
        left = min(float(self.per_s), left + (now - then) * self.per_s)
        if left <= 0:
            wait = -left / self.per_s
            raise BadRequest(
                f"principal {name} publishes past its quota of {self.per_s} bytes per second "
                f"(http.publish.bytes.per.principal) on this gateway: retry in {wait:.1f} s",
                429,
                {"Retry-After": str(math.ceil(wait))},
            )
        self.buckets[name] = (left - size, now)

    def refund(self, principal: Principal, size: int) -> None:
        """A publish refused or failed stored nothing: its bytes go back."""
        if principal.name in self.buckets:
            left, then = self.buckets[principal.name]
            self.buckets[principal.name] = (left + size, then)


class Fields:
    """The checks of a request's fields against the configured limits."""

    def __init__(self, settings: HttpSettings):
        self.settings = settings

    def body_max(self, endpoint: str, v2: bool) -> int:
        """The largest body `endpoint` can need: a v2 publish's batch, a v1 publish's one
        message (each byte up to 6 as a JSON escape), names alone for every other call."""
        if endpoint != "message/publish":
            return limits.http_small_body_bytes_max
        if v2:
            return limits.http_body_bytes_max
        one = limits.http_small_body_bytes_max + 6 * self.settings.max_msg_size
        return min(one, limits.http_body_bytes_max)

    def name(self, doc: Doc, field: str) -> str:
        value = doc.get(field)
        if not isinstance(value, str) or not value:
            raise BadRequest(f"'{field}' must be a non-empty string")
        if len(value) > self.settings.max_name_len:
            raise BadRequest(f"'{field}' is longer than maxNameLen ({self.settings.max_name_len})")
        _utf8(value, field)
        return value

    def message(self, value: Any, field: str = "msg") -> bytes:
        if not isinstance(value, str):
            raise BadRequest(f"'{field}' must be a string")
        encoded = _utf8(value, field)
        if len(encoded) > self.settings.max_msg_size:
            raise BadRequest(
                f"'{field}' is {len(encoded)} bytes, over maxMsgSize ({self.settings.max_msg_size})"
            )
        return encoded

    def messages(self, doc: Doc) -> tuple[list[bytes], tuple[bytes, ...]]:
        """v2: `msg`, or `msgs`, each a string or an object with `msg` and its own meta fields;
        and each message's meta (() when none has any)."""
        if "msgs" not in doc:
            return [self.message(doc.get("msg"))], self.metas(doc, [doc])
        values = doc["msgs"]
        if not isinstance(values, list) or not 1 <= len(values) <= limits.http_batch_messages_max:
            raise BadRequest(f"'msgs' must be a list of 1 to {limits.http_batch_messages_max}")
        texts = [
            self.message(value.get("msg"), f"msgs[{n}].msg")
            if isinstance(value, dict) else self.message(value, "msgs[]")
            for n, value in enumerate(values)
        ]  # fmt: skip
        return texts, self.metas(doc, values)

    def metas(self, doc: Doc, items: list[Any]) -> tuple[bytes, ...]:
        """Each message's meta (records.py): a field of its own object, named `msgs[n].field`
        in a refusal, else the body's; () when no message has any (version 1 records)."""
        own = [item if isinstance(item, dict) and item is not doc else {} for item in items]
        if not any(field in where for where in (doc, *own) for field in META_FIELDS):
            return ()
        if "id" in doc and len(items) > 1:
            raise BadRequest(f"'id' names one message: give each of the {len(items)} messages "
                             "of 'msgs' an 'id' of its own")  # fmt: skip
        now = now_us()
        return tuple(self.meta(doc, mine, f"msgs[{n}].", now) for n, mine in enumerate(own))

    def meta(self, doc: Doc, mine: Doc, prefix: str, now: int) -> bytes:
        """One message's meta: each field from `mine` if it has it, else from the body."""
        found = {field: (mine[field], prefix + field) if field in mine else (doc.get(field), field)
                 for field in META_FIELDS}  # fmt: skip
        ttl = _milliseconds(*found["ttl"], limits.message_ttl_ms_max)
        delay = _milliseconds(*found["delay"], limits.message_delay_ms_max)
        if ttl is not None and delay is not None and delay >= ttl:
            raise BadRequest(f"'{found['delay'][1]}' ({delay} ms) is not shorter than "
                             f"'{found['ttl'][1]}' ({ttl} ms): the message would expire before "
                             "it is due")  # fmt: skip
        value, name = found["id"]
        try:
            message_id = None if value is None else message_id_from_text(_string(value, name))
        except ValueError as error:
            raise BadRequest(f"'{name}': {error}") from None
        headers, name = found["headers"]
        if headers is not None and not isinstance(headers, dict):
            raise BadRequest(f"'{name}' must be an object of strings")
        if headers and not all(isinstance(text, str) for text in headers.values()):
            raise BadRequest(f"'{name}' must be an object of strings: a value is not one")
        try:
            return encode_meta(headers, message_id, None if ttl is None else after_ms(ttl, now),
                               None if delay is None else after_ms(delay, now))  # fmt: skip
        except ValueError as error:  # a bound of limits.record_headers_*, or not Unicode
            raise BadRequest(f"'{name}': {error}") from None

    @staticmethod
    def index(doc: Doc) -> int:
        value = doc.get("msgIdx")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**62:
            raise BadRequest("'msgIdx' must be a positive integer")
        return value

    @staticmethod
    def wait(doc: Doc) -> float:
        value = doc.get("wait", 0)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise BadRequest("'wait' must be a number of seconds")
        if not 0 <= value <= limits.http_wait_s_max:
            raise BadRequest(f"'wait' must be between 0 and {limits.http_wait_s_max:.0f} s")
        return float(value)


def _milliseconds(value: Any, field: str, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BadRequest(f"'{field}' must be a whole number of milliseconds from 1 to {most}")
    return value


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"'{field}' must be a string")
    return value


def meta_fields(meta: RecordMeta | None) -> Doc:
    """A v2 get's fields for a message's meta, each only when the message has it: `headers`
    (name -> value), `id` (32 hex digits), `expiresAt` and `notBefore` (ms since the epoch)."""
    if meta is None:
        return {}
    doc: Doc = {}
    if meta.headers:
        doc["headers"] = {name: value.decode(errors="replace") for name, value in meta.headers}
    if meta.message_id is not None:
        doc["id"] = message_id_text(meta.message_id)
    if meta.expires_at_us is not None:
        doc["expiresAt"] = meta.expires_at_us // 1000
    if meta.not_before_us is not None:
        doc["notBefore"] = meta.not_before_us // 1000
    return doc


def _utf8(value: str, field: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800") is no text
        raise BadRequest(f"'{field}' is not valid Unicode text") from None


# --- the requests: each call's body, read once (its fields in the order they are checked) ---
@dataclass(frozen=True)
class Register:
    owner: str
    topic: str

    @classmethod
    def read(cls, fields: Fields, doc: Doc, _v2: bool) -> Self:
        return cls(fields.name(doc, "owner"), fields.name(doc, "topic"))


@dataclass(frozen=True)
class Publish:
    owner: str
    topic: str
    messages: list[bytes]  # v1: `msg`, one; v2: `msg` or `msgs`, a batch
    metas: tuple[bytes, ...] = ()  # v2: each message's meta (records.py); (): none has any

    @classmethod
    def read(cls, fields: Fields, doc: Doc, v2: bool) -> Self:
        owner, topic = fields.name(doc, "owner"), fields.name(doc, "topic")
        if not v2:
            return cls(owner, topic, [fields.message(doc.get("msg"))])
        return cls(owner, topic, *fields.messages(doc))


@dataclass(frozen=True)
class Subscribe:
    subscriber: str
    topic: str

    @classmethod
    def read(cls, fields: Fields, doc: Doc, _v2: bool) -> Self:
        return cls(fields.name(doc, "subscriber"), fields.name(doc, "topic"))


@dataclass(frozen=True)
class Get:
    subscriber: str
    topic: str
    wait: float  # v2's long poll; v1 does not wait

    @classmethod
    def read(cls, fields: Fields, doc: Doc, v2: bool) -> Self:
        subscriber, topic = fields.name(doc, "subscriber"), fields.name(doc, "topic")
        return cls(subscriber, topic, fields.wait(doc) if v2 else 0.0)


@dataclass(frozen=True)
class Ack:
    subscriber: str
    topic: str
    index: int  # msgIdx

    @classmethod
    def read(cls, fields: Fields, doc: Doc, _v2: bool) -> Self:
        subscriber, topic = fields.name(doc, "subscriber"), fields.name(doc, "topic")
        return cls(subscriber, topic, fields.index(doc))


# --- the calls -------------------------------------------------------------------------------
class Calls:
    """Each call with its caller's principal: whose owners and subscribers its names are
    (`Access.names`), and the quotas it is held to."""

    def __init__(self, gateway: Gateway, metrics: Metrics):
        self.gateway, self.metrics = gateway, metrics
        self.rate = Rate(gateway.settings.bytes_quota)

    async def register(self, wanted: Register, _v2: bool, principal: Principal) -> Answer:
        caller, most = Access.names(principal, wanted.topic), self.gateway.settings.topics_quota
        quota = 0 if Access.unbounded(principal) else most
        await self.gateway.register(wanted.owner, wanted.topic, caller, quota)
        return OK, {}

    async def publish(self, wanted: Publish, v2: bool, principal: Principal) -> Answer:
        messages, caller = wanted.messages, Access.names(principal, wanted.topic)
        size = sum(map(len, messages)) + sum(map(len, wanted.metas))  # meta bytes count too
        self.rate.take(principal, size)
        try:
            first = await self.gateway.publish(
                wanted.owner, wanted.topic, messages, caller, wanted.metas
            )
        except RoqError:  # refused (400, 403) or not stored (503)
            self.rate.refund(principal, size)
            raise
        self.metrics.published.inc(len(messages))
        return OK, {"msgIdx": first, "count": len(messages)} if v2 else {"msgIdx": first}

    async def subscribe(self, wanted: Subscribe, _v2: bool, principal: Principal) -> Answer:
        caller = Access.names(principal, wanted.topic)
        following = await self.gateway.subscribe(wanted.subscriber, wanted.topic, caller)
        return OK, {"nextIdx": following}

    async def get(self, wanted: Get, v2: bool, principal: Principal) -> Answer:
        caller = Access.names(principal, wanted.topic)
        got = await self.gateway.get(wanted.subscriber, wanted.topic, wanted.wait, caller)
        if got.status == OK:
            message = {"msgIdx": got.index, "msg": got.message}
            return OK, {**message, **meta_fields(got.meta)} if v2 else message
        if not v2 or got.meta is None:  # v1: the seed's answers, whatever the message's meta
            return got.status, {"msgIdx": got.index}
        return got.status, _withheld(wanted.topic, got)

    async def ack(self, wanted: Ack, _v2: bool, principal: Principal) -> Answer:
        caller = Access.names(principal, wanted.topic)
        following = await self.gateway.ack(wanted.subscriber, wanted.topic, wanted.index, caller)
        return OK, {"nextIdx": following}


def _withheld(topic: str, got: Got) -> Doc:
    """v2's problem fields for a message a get did not return: expired (230, a type of its
    own) or not due yet (231)."""
    meta, index = got.meta, got.index
    assert meta is not None
    if got.status == EVICTED and meta.expires_at_us is not None:
        return {"type": "urn:roq:mq:message-expired", "title": "message expired",
                "detail": f"message {index} of topic {topic!r} expired at "
                          f"{_when(meta.expires_at_us)}",
                "msgIdx": index, "expiresAt": meta.expires_at_us // 1000}  # fmt: skip
    if meta.not_before_us is not None:
        return {"detail": f"message {index} of topic {topic!r} is not due before "
                          f"{_when(meta.not_before_us)}",
                "msgIdx": index, "notBefore": meta.not_before_us // 1000}  # fmt: skip
    return {"msgIdx": index}


def _when(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds")


# --- answers ---------------------------------------------------------------------------------
def answer(
    v2: bool, status: int, body: Doc, reason: str = "", headers: dict[str, str] | None = None
) -> Response:
    if status == OK:
        return JSONResponse(body)
    title = TITLES.get(status, "error")
    if not v2:
        return JSONResponse({"error": reason or title, **body}, status, headers)
    slug = title.replace(" ", "-")
    problem = {"type": f"urn:roq:mq:{slug}", "title": title, "status": status, **body}
    if reason:
        problem["detail"] = reason
    return JSONResponse(problem, status, headers, media_type=PROBLEM)


def refused_answer(v2: bool, refused: Refused) -> Response:
    return answer(v2, refused.status, {}, refused.reason, {"WWW-Authenticate": refused.challenge})


@dataclass(frozen=True)
class Endpoint(Generic[M]):
    name: str  # the path under /v1 or /v2, the metrics' label
    read: Callable[[Fields, Doc, bool], M]  # the body, once, as the call's request
    call: Callable[[M, bool, Principal], Awaitable[Answer]]
    needs: Permission  # on the topic


@dataclass(frozen=True)
class Guards:
    """What every call passes before its body is read: who calls (access), whether it may
    call more now (share); and how a large body is parsed."""

    access: Access
    share: Share
    parse: Parse


def endpoint(
    route: Endpoint[Any], v2: bool, guards: Guards, fields: Fields, metrics: Metrics
) -> Callable[[Request], Awaitable[Response]]:
    access, most = guards.access, fields.body_max(route.name, v2)

    async def handle(request: Request) -> Response:
        started = time.monotonic()
        try:
            principal = access.caller(request.headers.get("authorization"))
            access.check_any(principal, route.needs)  # no body for a token without the grant
            with guards.share.held(principal):
                doc = await read_json(request, most, guards.parse)
                access.check(principal, route.needs, fields.name(doc, "topic"))
                status, body = await route.call(route.read(fields, doc, v2), v2, principal)
            response = answer(v2, status, body)
        except Refused as refused:
            response = refused_answer(v2, refused)
        except BadRequest as error:
            status = error.status if v2 or error.status in (408, 429) else 400  # v1: the seed's
            response = answer(v2, status, {}, error.reason, error.headers)
        except TopicForbidden as forbidden:
            response = answer(v2, 403, {}, str(forbidden))
        except TopicRefused as refused:
            response = answer(v2, 400, {}, str(refused))
        except (Unavailable, CoordinationError) as error:
            response = answer(v2, 503, {}, str(error))
        metrics.observe(route.name, response.status_code, time.monotonic() - started)
        return response

    return handle


def build(
    gateway: Gateway, settings: HttpSettings, on_ready: Callable[[], object] = lambda: None
) -> Starlette:
    share = Share(settings.requests_quota)
    metrics = Metrics(gateway.index, lambda: gateway.replaced, gateway.read_from_logs, share.total,
                      lambda: gateway.expired, lambda: gateway.read_back)  # fmt: skip
    fields, access = Fields(settings), gateway.access
    guards = Guards(access, share, gateway.parse_json)
    calls = Calls(gateway, metrics)

    async def render_metrics(request: Request) -> Response:
        try:
            access.caller(request.headers.get("authorization"))  # Prometheus shows its token
        except Refused as refused:
            headers = {"WWW-Authenticate": refused.challenge}
            return Response(f"{refused.reason}\n", refused.status, headers, "text/plain")
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    serving = asyncio.Event()  # set once the lifespan started the log consumers

    async def healthz(_: Request) -> Response:  # answered: the event loop turns
        return PlainTextResponse("ok\n")

    async def readyz(_: Request) -> Response:
        problems = gateway.problems() + ([] if serving.is_set() else ["still starting"])
        return PlainTextResponse("\n".join(problems or ["ready"]) + "\n", 503 if problems else 200)

    # /healthz and /readyz without a token, as for any load balancer's probe: they say no more
    routes = [
        Route("/metrics", render_metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    for version in ("v1", "v2"):
        for route in (
            Endpoint("topic/register", Register.read, calls.register, Permission.PUBLISH),
            Endpoint("message/publish", Publish.read, calls.publish, Permission.PUBLISH),
            Endpoint("topic/subscribe", Subscribe.read, calls.subscribe, Permission.SUBSCRIBE),
            Endpoint("message/get", Get.read, calls.get, Permission.SUBSCRIBE),
            Endpoint("message/ack", Ack.read, calls.ack, Permission.SUBSCRIBE),
        ):
            handle = endpoint(route, version == "v2", guards, fields, metrics)
            routes.append(Route(f"/{version}/{route.name}", handle, methods=["POST"]))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        gateway.start_consumers(asyncio.get_running_loop())
        on_ready()
        serving.set()
        yield
        await gateway.stop_consumers()  # and a last snapshot: the next start reads less log

    async def http_error(request: Request, error: Exception) -> Response:
        status = error.status_code if isinstance(error, HTTPException) else 400
        metrics.observe("other", status, 0.0)
        reason = f"{request.method} {request.url.path}: {TITLES.get(status, 'error')}"
        return answer(request.url.path.startswith("/v2/"), status, {}, reason)

    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
