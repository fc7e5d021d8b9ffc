"""A queue's monitor: what its exchanges report on B+0, placement on B+1, the notices it
publishes to publishers (B+2) and subscribers (B+3), and the rules the GCM pushes to B+4.

Field names and types are RoQ's where RoQ had the message (docs/protocol.md, "Monitor").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import (
    REQUIRED,
    Document,
    field_bool,
    field_doc,
    field_docs,
    field_endpoint,
    field_float,
    field_int,
    field_str,
)
from roq.protocol.commands import AdminCommand, MonitorCommand, PublisherNotice, Result
from roq.protocol.commands import SubscriberNotice as Notice
from roq.protocol.epoch import EPOCH, field_epoch
from roq.protocol.names import check_queue_name
from roq.protocol.rules import RuleSet

COPIES_MAX = 16  # replicationFactor's bound (config/keys.py): InSync never says more

EXCHANGES_MAX: Final = limits.monitor_exchanges_max  # in one list: a monitor tracks no more
# An exchange's ports are F..F+3: its `Front` (F) and `Back` (F+1) leave room for the rest, so
# the log port (F+3) derived from either is a port too.
FRONT_ROOM: Final = 3
BACK_ROOM: Final = 2


# --- B+0: exchange reports, pulses and subscription counts -----------------------------------
@dataclass(frozen=True)
class ExchangeIdentity:
    """Who reports: every 5, 6 and 8 carries it. `Front` is the key the monitor files the
    exchange under; a new `Started` under the same `Front` is a restarted exchange."""

    queue: str  # QName
    exchange_id: str  # Id
    front: str  # tcp://ip:F, where publishers send
    back: str  # tcp://ip:F+1, where subscribers connect
    period_s: float  # Period: the exchange's heartbeat period
    started: float  # Started: the process's start time, epoch seconds
    logged: bool  # Log: it keeps a message log subscribers can read on F+3
    host: str  # Host: host.name, or its address
    # Keeper: a keeper of a lost exchange's log (host/keepers.py), not an exchange: it serves
    # reads of its log and copies and sends them to live exchanges, and takes no publishers
    keeper: bool = False
    # Follower: a log follower (log.followers), not an exchange: it holds copies of the queue's
    # logs on a host without its exchanges, and takes no publishers and no subscribers' stream
    follower: bool = False

    def fields(self) -> Document:
        return {
            "QName": self.queue, "Id": self.exchange_id, "Front": self.front, "Back": self.back,
            "Period": self.period_s, "Started": self.started, "Log": self.logged,
            "Host": self.host, "Keeper": self.keeper, "Follower": self.follower,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            queue=field_str(doc, "QName", max_chars=limits.queue_name_chars_max),
            exchange_id=field_str(doc, "Id"),
            front=field_endpoint(doc, "Front", room=FRONT_ROOM),
            back=field_endpoint(doc, "Back", room=BACK_ROOM),
            period_s=field_float(doc, "Period", lo=0.0),
            started=field_float(doc, "Started", lo=0.0),
            logged=field_bool(doc, "Log"),
            host=field_str(doc, "Host"),
            keeper=field_bool(doc, "Keeper", default=False),
            follower=field_bool(doc, "Follower", default=False),
        )


@dataclass(frozen=True)
class ProducerRate:
    """One entry of `Top`: a busy producer's rates, per second over the last period."""

    producer: str  # ID, hex
    msgs_rate: float  # Msgs
    bytes_rate: float  # Bytes (payload)

    def fields(self) -> Document:
        return {"ID": self.producer, "Msgs": self.msgs_rate, "Bytes": self.bytes_rate}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "ID", max_chars=limits.producer_id_chars_max, prefix=prefix),
            field_float(doc, "Msgs", lo=0.0, prefix=prefix),
            field_float(doc, "Bytes", lo=0.0, prefix=prefix),
        )


@dataclass(frozen=True)
class CopyEnd:
    """A copy of another exchange's log held here: the leader's id and where the copy ends."""

    leader_id: str  # Id
    end: int  # End, a log offset

    def fields(self) -> Document:
        return {"Id": self.leader_id, "End": self.end}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(field_str(doc, "Id", prefix=prefix), field_int(doc, "End", prefix=prefix))


@dataclass(frozen=True)
class ReportedLoad:
    """The load part of a report: rates per second over the last period, totals since start."""

    msgs_rate: float  # Msgs
    bytes_rate: float  # Bytes (payload)
    producers: int  # Producers that sent during the period
    top: tuple[ProducerRate, ...]  # Top: the busiest producers first
    cpu: float  # CPU: the process's share of one core
    rss: int  # RSS, bytes
    load: float  # Load: the machine's 1-minute load average
    bad: int  # Bad: refused frames since start
    total_msgs: int  # TotalMsgs
    total_bytes: int  # TotalBytes
    copies: tuple[CopyEnd, ...]  # Copies
    subscriptions: int  # Subs: (subscriber connection, key prefix) pairs on its XPUB
    # Work queues: End, its log's end offset; Cuts, the most recent slot boundaries (offsets
    # after every `work.slot.messages` messages), repeated in every report so a lost report
    # loses none (the monitor keeps those past what it knows)
    end: int = 0
    cuts: tuple[int, ...] = ()
    # Refusing: why its log refuses appends (a full or read-only disk), "" while they succeed;
    # optional (an exchange of an older version never sends it)
    refusing: str = ""
    # InSync / InSyncMin: copies of its own log in sync, the leader included, and the
    # min.insync.copies acks=all needs; optional (0: no log, or an older exchange)
    in_sync: int = 0
    in_sync_min: int = 0

    NAMES: ClassVar[tuple[str, ...]] = (
        "Msgs", "Bytes", "Producers", "Top", "CPU", "RSS", "Load", "Bad", "TotalMsgs",
        "TotalBytes", "Copies", "Subs", "End", "Cuts", "Refusing", "InSync", "InSyncMin",
    )  # fmt: skip

    def fields(self) -> Document:
        doc = {
            "Msgs": self.msgs_rate, "Bytes": self.bytes_rate, "Producers": self.producers,
            "Top": [p.fields() for p in self.top], "CPU": self.cpu, "RSS": self.rss,
            "Load": self.load, "Bad": self.bad, "TotalMsgs": self.total_msgs,
            "TotalBytes": self.total_bytes, "Copies": [c.fields() for c in self.copies],
            "Subs": self.subscriptions, "End": self.end, "Cuts": list(self.cuts),
        }  # fmt: skip
        if self.refusing:
            doc["Refusing"] = self.refusing
        if self.in_sync:
            doc.update(InSync=self.in_sync, InSyncMin=self.in_sync_min)
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            msgs_rate=field_float(doc, "Msgs", lo=0.0),
            bytes_rate=field_float(doc, "Bytes", lo=0.0),
            producers=field_int(doc, "Producers"),
            top=field_docs(
                doc, "Top", ProducerRate.decode, max_items=limits.exchange_producers_reported_max
            ),
            cpu=field_float(doc, "CPU", lo=0.0),
            rss=field_int(doc, "RSS"),
            load=field_float(doc, "Load", lo=0.0),
            bad=field_int(doc, "Bad"),
            total_msgs=field_int(doc, "TotalMsgs"),
            total_bytes=field_int(doc, "TotalBytes"),
            copies=field_docs(
                doc, "Copies", CopyEnd.decode, max_items=limits.monitor_copies_announced_max
            ),
            subscriptions=field_int(doc, "Subs"),
            end=field_int(doc, "End", hi=limits.log_offset_max, default=0),
            cuts=_cuts(doc),
            refusing=field_str(doc, "Refusing", default=""),
            in_sync=field_int(doc, "InSync", hi=COPIES_MAX, default=0),
            in_sync_min=field_int(doc, "InSyncMin", hi=COPIES_MAX, default=0),
        )


def _cuts(doc: Mapping[str, Any]) -> tuple[int, ...]:
    values = bsonmsg.field_list(doc, "Cuts", max_items=limits.work_cuts_reported_max, default=[])
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DecodeError("the Cuts field must hold offsets")
        if not 0 <= value < limits.log_offset_max:
            raise DecodeError(f"the Cuts field holds {value}, beyond any log")
    return tuple(values)


@dataclass(frozen=True)
class ExchangeReport:
    """5 EXCHANGE_REPORT, the heartbeat with the load; or 6 EXCHANGE_LEAVING once the exchange
    is shutting down, whose first one carries only the identity (`load` None)."""

    identity: ExchangeIdentity
    load: ReportedLoad | None
    leaving: bool = False

    def __post_init__(self) -> None:
        assert self.leaving or self.load is not None, "a report (5) carries the load"

    def encode(self) -> Document:
        command = (
            MonitorCommand.EXCHANGE_LEAVING if self.leaving else MonitorCommand.EXCHANGE_REPORT
        )
        doc = {"CMD": int(command), **self.identity.fields()}
        if self.load is not None:
            doc.update(self.load.fields())
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        leaving = bsonmsg.command(doc) == MonitorCommand.EXCHANGE_LEAVING
        with_load = not leaving or any(name in doc for name in ReportedLoad.NAMES)
        load = ReportedLoad.decode(doc) if with_load else None
        return cls(ExchangeIdentity.decode(doc), load, leaving)


@dataclass(frozen=True)
class ExchangePulse:
    """7 EXCHANGE_PULSE, from the exchange's pulse thread: the process is up, and its main loop
    last turned `LoopAge` seconds ago. It counts only for a known `Front` with that `Started`."""

    exchange_id: str  # Id
    front: str
    started: float
    loop_age_s: float  # LoopAge

    def encode(self) -> Document:
        return {
            "CMD": int(MonitorCommand.EXCHANGE_PULSE), "Id": self.exchange_id,
            "Front": self.front, "Started": self.started, "LoopAge": self.loop_age_s,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_str(doc, "Id"),
            field_endpoint(doc, "Front", room=FRONT_ROOM),
            field_float(doc, "Started", lo=0.0),
            field_float(doc, "LoopAge", lo=0.0),
        )


@dataclass(frozen=True)
class ExchangeSubscriptions:
    """8 EXCHANGE_SUBSCRIPTIONS: the exchange's count of subscriptions changed."""

    identity: ExchangeIdentity
    subscriptions: int  # Subs

    def encode(self) -> Document:
        return {
            "CMD": int(MonitorCommand.EXCHANGE_SUBSCRIPTIONS),
            **self.identity.fields(),
            "Subs": self.subscriptions,
        }

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(ExchangeIdentity.decode(doc), field_int(doc, "Subs"))


ExchangeMessage = ExchangeReport | ExchangePulse | ExchangeSubscriptions


def decode_exchange_message(doc: Mapping[str, Any]) -> ExchangeMessage:
    """Whatever an exchange sent to B+0; DecodeError names the exchange (by its `Front`) and the
    field."""
    front = field_str(doc, "Front")
    command = bsonmsg.command(doc)
    try:
        if command == MonitorCommand.EXCHANGE_PULSE:
            return ExchangePulse.decode(doc)
        if command == MonitorCommand.EXCHANGE_SUBSCRIPTIONS:
            return ExchangeSubscriptions.decode(doc)
        if command in (MonitorCommand.EXCHANGE_REPORT, MonitorCommand.EXCHANGE_LEAVING):
            return ExchangeReport.decode(doc)
    except DecodeError as error:
        raise DecodeError(f"exchange at {front}: {error}") from None
    raise DecodeError(f"exchange at {front}: unknown report command {command}")


# --- B+1: placement ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SubscriberInit:
    """1 SUBSCRIBER_INIT: every live exchange, answered with an `ExchangeList` reply."""

    def encode(self) -> Document:
        return {"CMD": int(MonitorCommand.SUBSCRIBER_INIT)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class PublisherInit:
    """2 PUBLISHER_INIT; or 3 PUBLISHER_PANIC (`panic`) from a publisher that lost the exchange
    at `Lost` and must not be placed there again, unless it is the only one left."""

    producer: str  # ProducerID, hex
    lost: str = ""  # Lost: "" in a 2
    panic: bool = False

    def encode(self) -> Document:
        command = MonitorCommand.PUBLISHER_PANIC if self.panic else MonitorCommand.PUBLISHER_INIT
        return {"CMD": int(command), "ProducerID": self.producer, "Lost": self.lost}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        panic = bsonmsg.command(doc) == MonitorCommand.PUBLISHER_PANIC
        producer = field_str(doc, "ProducerID", max_chars=limits.producer_id_chars_max)
        lost = field_endpoint(doc, "Lost", empty_ok=True, default=REQUIRED if panic else "")
        return cls(producer, lost, panic)


@dataclass(frozen=True)
class Placed:
    """The reply to 2 and 3: the exchange to send to (`Exchange: {Id, Front}`), and the
    monitor's assignment `Epoch` (protocol/epoch.py), as in every reply and notice it sends."""

    exchange_id: str
    front: str
    epoch: int = 0

    def encode(self) -> Document:
        return bsonmsg.ok(Exchange={"Id": self.exchange_id, "Front": self.front}, Epoch=self.epoch)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        exchange = field_doc(doc, "Exchange")
        return cls(
            field_str(exchange, "Id", prefix="Exchange."),
            field_endpoint(exchange, "Front", prefix="Exchange."),
            field_epoch(doc),
        )


@dataclass(frozen=True)
class ExchangeEntry:
    """A live exchange as subscribers see it: `{Id, Back, Log}`."""

    exchange_id: str
    back: str
    logged: bool  # Log: its log can be read on F+3

    def fields(self) -> Document:
        return {"Id": self.exchange_id, "Back": self.back, "Log": self.logged}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix),
            field_endpoint(doc, "Back", room=BACK_ROOM, prefix=prefix),
            field_bool(doc, "Log", prefix=prefix),
        )


@dataclass(frozen=True)
class ReplicaCopy:
    """A live exchange holding a copy of a dead one's log: `{Id, Log: tcp://ip:F+3, End}`."""

    replica_id: str
    log: str
    end: int

    def fields(self) -> Document:
        return {"Id": self.replica_id, "Log": self.log, "End": self.end}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix),
            field_endpoint(doc, "Log", prefix=prefix),
            field_int(doc, "End", prefix=prefix),
        )


@dataclass(frozen=True)
class DeadLog:
    """The log of an exchange that is gone, with the copies of it, the longest first."""

    leader_id: str  # Id
    replicas: tuple[ReplicaCopy, ...]

    def fields(self) -> Document:
        return {"Id": self.leader_id, "Replicas": [r.fields() for r in self.replicas]}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix),
            field_docs(doc, "Replicas", ReplicaCopy.decode, max_items=EXCHANGES_MAX, prefix=prefix),
        )


@dataclass(frozen=True)
class ExchangeList:
    """Every live exchange and the dead exchanges' logs that can still be read (`Copies`): the
    reply to 1, and the 2 EXCHANGE_LIST notice to subscribers (B+3)."""

    exchanges: tuple[ExchangeEntry, ...]
    copies: tuple[DeadLog, ...]
    epoch: int = 0  # Epoch

    def fields(self) -> Document:
        return {
            "Exchanges": [x.fields() for x in self.exchanges],
            "Copies": [c.fields() for c in self.copies],
            EPOCH: self.epoch,
        }

    def encode(self) -> Document:
        """As the reply to 1 (`notice` for B+3)."""
        return bsonmsg.ok(**self.fields())

    def notice(self) -> Document:
        return {"CMD": int(Notice.EXCHANGE_LIST), **self.fields()}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_docs(doc, "Exchanges", ExchangeEntry.decode, max_items=EXCHANGES_MAX),
            field_docs(doc, "Copies", DeadLog.decode),
            field_epoch(doc),
        )


# --- B+2: notices to publishers ([topic][BSON]) ------------------------------------------------
EVERY_PUBLISHER: Final = b"*"  # the topic of a notice to every publisher


@dataclass(frozen=True)
class Relocate:
    """1 RELOCATE, to one publisher (topic: its id in hex): drain, then send to `Exchange`."""

    producer: str  # ProducerID
    exchange_id: str  # Exchange.Id
    front: str  # Exchange.Front
    source: str  # From: the front it is moved away from
    epoch: int = 0  # Epoch

    @property
    def topic(self) -> bytes:
        return self.producer.encode()

    def encode(self) -> Document:
        return {
            "CMD": int(PublisherNotice.RELOCATE),
            "ProducerID": self.producer,
            "Exchange": {"Id": self.exchange_id, "Front": self.front},
            "From": self.source,
            EPOCH: self.epoch,
        }

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        placed = Placed.decode(doc)
        return cls(
            field_str(doc, "ProducerID", max_chars=limits.producer_id_chars_max),
            placed.exchange_id,
            placed.front,
            field_endpoint(doc, "From"),
            placed.epoch,
        )


@dataclass(frozen=True)
class ExchangeLost:
    """2 EXCHANGE_LOST, to every publisher: the exchange at `Front` is dead (`Dead`), or
    leaving cleanly, or alive but refusing batches (`Why`: its disk refuses appends); the
    publishers sending there drain it if they can and ask again (3)."""

    front: str
    dead: bool
    epoch: int = 0  # Epoch
    why: str = ""  # Why: why a live exchange is to be left ("": it is leaving); optional

    topic: ClassVar[bytes] = EVERY_PUBLISHER

    def encode(self) -> Document:
        doc = {
            "CMD": int(PublisherNotice.EXCHANGE_LOST), "Front": self.front, "Dead": self.dead,
            EPOCH: self.epoch,
        }  # fmt: skip
        if self.why:
            doc["Why"] = self.why
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_endpoint(doc, "Front"),
            field_bool(doc, "Dead"),
            field_epoch(doc),
            field_str(doc, "Why", default=""),
        )


def decode_publisher_notice(doc: Mapping[str, Any]) -> Relocate | ExchangeLost:
    command = bsonmsg.command(doc)
    if command == PublisherNotice.RELOCATE:
        return Relocate.decode(doc)
    if command == PublisherNotice.EXCHANGE_LOST:
        return ExchangeLost.decode(doc)
    raise DecodeError(f"unknown publisher notice {command}")


# --- B+3: notices to subscribers ---------------------------------------------------------------
@dataclass(frozen=True)
class NewExchange:
    """1 NEW_EXCHANGE: connect to `Back` now (the periodic list would add it later)."""

    entry: ExchangeEntry
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return {"CMD": int(Notice.NEW_EXCHANGE), **self.entry.fields(), EPOCH: self.epoch}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(ExchangeEntry.decode(doc), field_epoch(doc))


def decode_subscriber_notice(doc: Mapping[str, Any]) -> NewExchange | ExchangeList:
    command = bsonmsg.command(doc)
    if command == Notice.NEW_EXCHANGE:
        return NewExchange.decode(doc)
    if command == Notice.EXCHANGE_LIST:
        return ExchangeList.decode(doc)
    raise DecodeError(f"unknown subscriber notice {command}")


# --- B+4: rules pushed by the GCM --------------------------------------------------------------
@dataclass(frozen=True)
class RulesUpdate:
    """What the GCM pushes to a rules listener (registered with 2008) after each 2006: the
    stored rules with their `Version`, as `{CMD: 2006, RESULT: 0, QName, …}`."""

    queue: str  # QName
    rules: RuleSet

    def encode(self) -> Document:
        return {
            "CMD": int(AdminCommand.ADD_AUTOSCALING_RULE),
            "RESULT": int(Result.OK),
            "QName": self.queue,
            **self.rules.fields(),
        }

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(check_queue_name(field_str(doc, "QName")), RuleSet.decode(doc))
