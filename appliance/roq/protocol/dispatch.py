"""One typed entry point per socket: a table from each command to its message class and handler.

A server socket's requests arrive as BSON documents (`transport/rpc.py` receives the frames and
decodes the BSON). The socket's `Table` then, once and here only:

1. reads `CMD` and finds its `Route`; a command the table does not hold is answered
   `unknown_command`, naming the socket;
2. decodes the whole document into the route's message class (`Message.decode`, which checks
   every field: a bad one is answered `bad_request` naming the field), so a handler is given a
   typed message and never a dict;
3. calls the handler with the message (and the table's context: a routed socket's `Envelope`,
   for a handler that holds a request and answers it later);
4. encodes the handler's typed reply (`Encodable`: a message class of protocol/messages/, or
   `Done`/`Refused` below) and `stamp`s it: what every reply of the socket carries (the
   monitor's `Epoch`) is added in this one place.

A handler returns None only on a routed socket, to hold the request (it answers it later, once).
Models: kazoo's protocol serialization (one class per request, both directions side by side) and
this repo's protocol/messages/tasks.py. No sockets here: the protocol layer stays pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import Reason

M = TypeVar("M")
C = TypeVar("C")


class Encodable(Protocol):
    """A typed reply: every message class of protocol/messages/ is one."""

    def encode(self) -> Document: ...


@dataclass(frozen=True)
class Done:
    """The plain success reply: `{RESULT: 0, COMMENT}`."""

    comment: str = "SUCCESS"

    def encode(self) -> Document:
        return bsonmsg.ok(self.comment)


@dataclass(frozen=True)
class Refused:
    """The plain refusal: `{RESULT: 1101, COMMENT, ERROR: reason}`."""

    reason: Reason
    comment: str

    def encode(self) -> Document:
        return bsonmsg.fail(self.reason, self.comment)


Answer = Encodable | None  # None: held (a routed socket's handler answers it later)


@dataclass(frozen=True)
class Route(Generic[M, C]):
    """A command's message class (its `decode`) and the handler it is served by."""

    decode: Callable[[Mapping[str, Any]], M]
    handler: Callable[[M, C], Answer]


def route(
    decode: Callable[[Mapping[str, Any]], M], handler: Callable[[M], Answer]
) -> Route[M, Any]:
    """A route whose handler needs only the message (the common case)."""
    return Route(decode, lambda message, _: handler(message))


def _unchanged(reply: Document) -> Document:
    return reply


def _bad(error: DecodeError) -> str:
    return str(error)


class Table(Generic[C]):
    """The dispatch table of one socket. `stamp` adds what every reply of the socket carries.
    `unknown` and `bad` word the COMMENT of its two refusals where the socket's wording is
    older than the table and documented (the GCM's admin API keeps RoQ's "INVALID CMD Value")."""

    def __init__(
        self,
        name: str,
        routes: Mapping[int, Route[Any, C]],
        stamp: Callable[[Document], Document] = _unchanged,
        *,
        unknown: Callable[[object], str] | None = None,
        bad: Callable[[DecodeError], str] = _bad,
    ):
        self.name, self.routes, self.stamp = name, dict(routes), stamp
        self.unknown = unknown or (lambda command: f"{name}: unknown command {command!r}")
        self.bad = bad

    @property
    def commands(self) -> frozenset[int]:
        return frozenset(self.routes)

    def __call__(self, request: Mapping[str, Any], context: C) -> Document | None:
        """The reply to `request`, encoded and stamped; None when its handler holds it."""
        command = request.get("CMD")
        found = self.routes.get(command) if isinstance(command, int) else None
        if found is None:
            refusal = Refused(Reason.UNKNOWN_COMMAND, self.unknown(command))
            return self.stamp(refusal.encode())
        try:
            message = found.decode(request)
        except DecodeError as error:
            return self.stamp(Refused(Reason.BAD_REQUEST, self.bad(error)).encode())
        answer = found.handler(message, context)
        return None if answer is None else self.stamp(answer.encode())
