"""The HTTP gateway's topics (docs/http.md): what a gateway asks the monitor of a topic's queue
(B+1, commands 50–57), and what it answers. The monitor keeps them in its state log
(monitor/topics.py); the messages themselves are in the queue's message logs.

One request class serves the seven commands: `Topic` and `Name` (the owner or the subscriber,
as the command says) with `Count` (a publish's messages), `Index` (the message acknowledged) or
`Limit` (the most topics, or subscribers of the topic, the request may bring the count to). An
import (56, a topic kept in ZooKeeper before, docs/http.md "Migration") names the owner and the
head (`Index`), or a `Subscriber` and its next index. A floor (57) names no topic: `Floors`
maps exchange ids to log offsets (docs/http.md, "Retention").

The owners and subscribers a gateway names are its callers' (issue 31, finding 3): `Principal`
is the calling principal, whose names the monitor records and checks (none: security off, or
a gateway from before, which records and checks nothing); `Override` says the caller may act
on any principal's names (it holds `admin` on the topic). An import's `Principal` is the one the
record held in ZooKeeper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_bool, field_int, field_str
from roq.protocol.commands import MonitorCommand
from roq.protocol.principals import NAME_CHARS_MAX

TOPIC_COMMANDS = frozenset(range(MonitorCommand.TOPIC_REGISTER, MonitorCommand.TOPIC_FLOOR + 1))
_NAMED = frozenset(TOPIC_COMMANDS - {MonitorCommand.TOPIC_COUNT, MonitorCommand.TOPIC_FLOOR})


@dataclass(frozen=True)
class Caller:
    """Whose names a gateway request's owner or subscriber are: `principal` ("": nobody's,
    security off), and whether it may act on another principal's (`override`: admin)."""

    principal: str = ""
    override: bool = False

    def uses(self, held: str) -> str | None:
        """The principal a record held by `held` ("": none) holds once this caller used it (an
        unclaimed record becomes the caller's, unless it is an admin's override); None when the
        caller may not use it: another principal's."""
        if not held:
            return "" if self.override else self.principal
        if self.override or not self.principal or held == self.principal:
            return held  # an admin; security off (or a gateway from before): nothing to check
        return None


NOBODY = Caller()


def quota_refusal(principal: str, quota: int) -> str:
    """The gateway's 403 for a principal at its quota of topics (issue 31, finding 7)."""
    return (
        f"principal {principal} holds {quota} topics: its quota (http.topics.per.principal); "
        "other principals may still register"
    )


@dataclass(frozen=True)
class TopicAsk:
    """50–57: a topic command. Names are checked here for length (the configuration's
    `maxNameLen` is the gateway's to check); a count and an index are at least 1."""

    command: MonitorCommand
    topic: str = ""
    name: str = ""  # the owner (50, 51) or the subscriber (52–54)
    count: int = 0  # 51: messages published
    index: int = 0  # 54: the message acknowledged
    limit: int = 0  # 50: topics this queue may hold; 52: subscribers the topic may have
    subscriber: str = ""  # 56: the subscriber whose position is imported ("": the topic)
    floors: tuple[tuple[str, int], ...] = ()  # 57: (exchange id, log offset)
    caller: Caller = NOBODY  # 50–56: whose names these are (55: whose topics to count too)
    quota: int = 0  # 50: topics of the caller's principal this queue may then hold (0: any)

    def encode(self) -> Document:
        doc: Document = {"CMD": int(self.command)}
        if self.command == MonitorCommand.TOPIC_FLOOR:
            doc["Floors"] = dict(self.floors)
        if self.command in _NAMED:
            doc.update(Topic=self.topic, Name=self.name)
        if self.command == MonitorCommand.TOPIC_PUBLISH:
            doc["Count"] = self.count
        if self.command in (MonitorCommand.TOPIC_ACK, MonitorCommand.TOPIC_IMPORT):
            doc["Index"] = self.index
        if self.subscriber:
            doc["Subscriber"] = self.subscriber
        if self.caller.principal:
            doc["Principal"] = self.caller.principal
        if self.caller.override:
            doc["Override"] = True
        if self.command in (MonitorCommand.TOPIC_REGISTER, MonitorCommand.TOPIC_SUBSCRIBE):
            doc["Limit"] = self.limit
        if self.quota:
            doc["Quota"] = self.quota
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        command = MonitorCommand(field_int(doc, "CMD"))
        if command not in TOPIC_COMMANDS:
            raise DecodeError(f"command {int(command)} is not a topic command")
        if command == MonitorCommand.TOPIC_FLOOR:
            return cls(command, floors=_floors(doc.get("Floors")))
        if command not in _NAMED:
            return cls(command, caller=_caller(doc))
        chars = limits.http_name_chars_max
        topic = field_str(doc, "Topic", max_chars=chars)
        name = field_str(doc, "Name", max_chars=chars)
        count = index = limit = 0
        if command == MonitorCommand.TOPIC_PUBLISH:
            count = field_int(doc, "Count", lo=1, hi=limits.http_batch_messages_max)
        if command == MonitorCommand.TOPIC_ACK:
            index = field_int(doc, "Index", lo=1)
        if command in (MonitorCommand.TOPIC_REGISTER, MonitorCommand.TOPIC_SUBSCRIBE):
            limit = field_int(doc, "Limit", lo=0, hi=limits.http_limit_max)
        subscriber = ""
        if command == MonitorCommand.TOPIC_IMPORT:
            index = field_int(doc, "Index", lo=0)
            subscriber = field_str(doc, "Subscriber", max_chars=chars, default="")
        quota = 0
        if command == MonitorCommand.TOPIC_REGISTER:
            quota = field_int(doc, "Quota", lo=0, hi=limits.http_limit_max, default=0)
        caller = _caller(doc)
        return cls(
            command, topic, name, count, index, limit, subscriber, caller=caller, quota=quota
        )


def _caller(doc: Mapping[str, Any]) -> Caller:
    return Caller(
        field_str(doc, "Principal", max_chars=NAME_CHARS_MAX, default=""),
        field_bool(doc, "Override", default=False),
    )


def _floors(value: Any) -> tuple[tuple[str, int], ...]:
    """57's `Floors`: at most `monitor_exchanges_max` exchange ids, each to an offset."""
    if not isinstance(value, Mapping) or len(value) > limits.monitor_exchanges_max:
        raise DecodeError(f"Floors must be a document of at most {limits.monitor_exchanges_max} "
                          "exchange ids")  # fmt: skip
    floors = []
    for exchange_id, offset in value.items():
        if len(exchange_id) > limits.exchange_id_request_chars_max:
            raise DecodeError(f"Floors: exchange id of {len(exchange_id)} characters")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise DecodeError(f"Floors: {exchange_id}: not an offset: {offset!r}")
        floors.append((exchange_id, offset))
    return tuple(floors)


@dataclass(frozen=True)
class TopicState:
    """The answer to a topic command: the topic's `Head` (its newest message's index, 0: none),
    `First` (51: the first index taken), `Next` (52–54: the subscriber's next index) and
    `Topics` (55, and 50: how many this queue holds), `Mine` (55: how many of them the
    caller's principal registered); 0 where the command says nothing."""

    head: int = 0
    first: int = 0
    next: int = 0
    topics: int = 0
    mine: int = 0

    def encode(self) -> Document:
        return bsonmsg.ok(Head=self.head, First=self.first, Next=self.next, Topics=self.topics,
                          Mine=self.mine)  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        fields = ("Head", "First", "Next", "Topics", "Mine")
        return cls(*(field_int(doc, name, default=0) for name in fields))
