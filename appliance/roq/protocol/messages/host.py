"""What the leading GCM asks a host on its request socket (`hcm.port`), and the replies.
docs/protocol.md, "Host". Every request names its queue by `QName` (checked as a queue name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import (
    Document,
    field_bool,
    field_docs,
    field_endpoint,
    field_int,
    field_str,
)
from roq.protocol.commands import HostCommand
from roq.protocol.endpoints import check_host
from roq.protocol.epoch import EPOCH, field_epoch
from roq.protocol.names import check_exchange_id, check_queue_name

PORT_MAX: Final = 65_535  # TCP's, a fact of the format rather than a bound


def queue_field(doc: Mapping[str, Any]) -> str:
    """`QName`: a queue name (it becomes a znode and a directory name)."""
    return check_queue_name(field_str(doc, "QName"))


def _host_field(doc: Mapping[str, Any], name: str) -> str:
    """An address or host name (it becomes `tcp://<it>:<port>`)."""
    try:
        return check_host(field_str(doc, name, max_chars=253))
    except DecodeError as error:
        raise DecodeError(f"the {name} field: {error}") from None


def port_field(doc: Mapping[str, Any], name: str, prefix: str = "") -> int:
    return field_int(doc, name, lo=1, hi=PORT_MAX, prefix=prefix)


@dataclass(frozen=True)
class ExchangeInfo:
    """An exchange a host started: `{Id, Port, TransactionID, Front, Back}` (also 2004's reply).
    `TransactionID` is "" for the exchange a queue is created with."""

    exchange_id: str  # Id
    port: int  # Port: F
    txid: str  # TransactionID
    front: str  # tcp://ip:F
    back: str  # tcp://ip:F+1
    follower: bool = False  # Follower: a log follower (log.followers), optional

    def fields(self) -> Document:
        doc: Document = {"Id": self.exchange_id, "Port": self.port, "TransactionID": self.txid,
                         "Front": self.front, "Back": self.back}  # fmt: skip
        if self.follower:
            doc["Follower"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", max_chars=limits.exchange_id_request_chars_max, prefix=prefix),
            port_field(doc, "Port", prefix),
            field_str(
                doc,
                "TransactionID",
                max_chars=limits.transaction_id_chars_max,
                empty_ok=True,
                prefix=prefix,
            ),
            field_endpoint(doc, "Front", prefix=prefix),
            field_endpoint(doc, "Back", prefix=prefix),
            field_bool(doc, "Follower", default=False, prefix=prefix),
        )


# --- queues ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreateQueueOnHost:
    """1002: start the queue's monitor and an exchange (idempotent: a queue already here is
    answered with its addresses), under the assignment `Epoch` the GCM records for this
    placement (a monitor already here under an older one is started again under it, unless it
    is the one the queue's record assigns to this host: then `busy`, and it stays)."""

    queue: str
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.CREATE_QUEUE), "QName": self.queue, EPOCH: self.epoch}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), field_epoch(doc))


@dataclass(frozen=True)
class StopMonitorOnHost:
    """1014: stop the queue's monitor if it runs here under exactly `Epoch` (the GCM started it
    for a re-placement it then called off: a returning host kept the queue); this host's
    exchanges of the queue go on. Idempotent: answered `COMMENT` either way."""

    queue: str
    epoch: int  # Epoch

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.STOP_MONITOR), "QName": self.queue, EPOCH: self.epoch}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), field_epoch(doc))


@dataclass(frozen=True)
class QueueOnHost:
    """The reply to 1002: where the monitor is, the epoch it acts under, and the queue's
    exchanges on this host."""

    monitor_host: str  # Monitor_host: tcp://ip:B
    stat_monitor_host: str  # Stat_Monitor_host: tcp://ip:S+1
    monitor_port: int  # Monitor_port: B
    stat_port: int  # Stat_port: S
    exchanges: tuple[ExchangeInfo, ...]
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return bsonmsg.ok(
            Monitor_host=self.monitor_host,
            Stat_Monitor_host=self.stat_monitor_host,
            Monitor_port=self.monitor_port,
            Stat_port=self.stat_port,
            Exchanges=[x.fields() for x in self.exchanges],
            Epoch=self.epoch,
        )

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_endpoint(doc, "Monitor_host"),
            field_endpoint(doc, "Stat_Monitor_host"),
            port_field(doc, "Monitor_port"),
            port_field(doc, "Stat_port"),
            field_docs(doc, "Exchanges", ExchangeInfo.decode),
            field_epoch(doc),
        )


@dataclass(frozen=True)
class StopQueueOnHost:
    """1012 STOP_QUEUE: stop the queue's exchanges, then its monitor; the logs stay. With
    `delete_logs`, 1008 REMOVE_QUEUE: its logs and the copies of its logs go too."""

    queue: str
    delete_logs: bool

    def encode(self) -> Document:
        command = HostCommand.REMOVE_QUEUE if self.delete_logs else HostCommand.STOP_QUEUE
        return {"CMD": int(command), "QName": self.queue}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), bsonmsg.command(doc) == HostCommand.REMOVE_QUEUE)


@dataclass(frozen=True)
class MonitorMovedOnHost:
    """1013 MONITOR_MOVED: the queue's monitor now runs at `Monitor_address` on `Monitor_port`
    (B) and `Stat_port` (S) under the assignment `Epoch`; the host tells each of its exchanges
    of the queue (1031, with the epoch) and starts them with that address and epoch from now on.
    Answered OK with how many exchanges it told."""

    queue: str
    monitor_port: int  # Monitor_port: B
    stat_port: int  # Stat_port: S
    monitor_address: str  # Monitor_address: the monitor's ip
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.MONITOR_MOVED), "QName": self.queue,
                "Monitor_port": self.monitor_port, "Stat_port": self.stat_port,
                "Monitor_address": self.monitor_address, EPOCH: self.epoch}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            queue_field(doc),
            port_field(doc, "Monitor_port"),
            port_field(doc, "Stat_port"),
            _host_field(doc, "Monitor_address"),
            field_epoch(doc),
        )


# --- exchanges ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreateExchangeOnHost:
    """1009: start an exchange of the queue whose monitor is at `Monitor_address`; a
    `TransactionID` already running here is answered with that exchange (`"exists"`). With an
    `ExchangeID` (optional), start that recorded exchange again under its id, so on its log
    (`roq queue start`); an id already running here is answered with it. `Epoch`: the
    monitor's assignment epoch, the oldest the exchange accepts from a monitor."""

    queue: str
    txid: str  # TransactionID
    monitor_port: int  # Monitor_port: B
    stat_port: int  # Stat_port: S
    monitor_address: str  # Monitor_address: the monitor's ip
    exchange_id: str = ""  # ExchangeID: "" = a new exchange
    epoch: int = 0  # Epoch
    follower: bool = False  # Follower: a log follower (log.followers), optional

    def encode(self) -> Document:
        doc: Document = {
            "CMD": int(HostCommand.CREATE_EXCHANGE), "QName": self.queue,
            "TransactionID": self.txid, "Monitor_port": self.monitor_port,
            "Stat_port": self.stat_port, "Monitor_address": self.monitor_address,
            EPOCH: self.epoch,
        }  # fmt: skip
        if self.exchange_id:
            doc["ExchangeID"] = self.exchange_id
        if self.follower:
            doc["Follower"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        exchange_id = _optional_exchange_id(doc)
        return cls(
            queue_field(doc),
            # a queue's first exchange has no transaction: it may be "" when re-attached
            field_str(
                doc,
                "TransactionID",
                max_chars=limits.transaction_id_chars_max,
                empty_ok=bool(exchange_id),
            ),
            port_field(doc, "Monitor_port"),
            port_field(doc, "Stat_port"),
            _host_field(doc, "Monitor_address"),
            exchange_id,
            field_epoch(doc),
            field_bool(doc, "Follower", default=False),
        )


def _optional_exchange_id(doc: Mapping[str, Any]) -> str:
    found = field_str(doc, "ExchangeID", max_chars=limits.exchange_id_request_chars_max, default="")
    return check_exchange_id(found) if found else ""


@dataclass(frozen=True)
class ExchangeOnHost:
    """The reply to 1009 (and 2004's): the exchange; `COMMENT` "created" or "exists"."""

    exchange: ExchangeInfo
    comment: str = "SUCCESS"

    def encode(self) -> Document:
        return bsonmsg.ok(self.comment, Exchange=self.exchange.fields())

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        found = bsonmsg.field_doc(doc, "Exchange")
        comment = field_str(doc, "COMMENT", empty_ok=True, max_chars=limits.reply_comment_chars_max)
        return cls(ExchangeInfo.decode(found, "Exchange."), comment)


@dataclass(frozen=True)
class RemoveExchangeOnHost:
    """1010: stop this exchange (OK also when it is not running here)."""

    queue: str
    exchange_id: str  # ExchangeID

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.REMOVE_EXCHANGE), "QName": self.queue,
                "ExchangeID": self.exchange_id}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            queue_field(doc),
            field_str(doc, "ExchangeID", max_chars=limits.exchange_id_request_chars_max),
        )


@dataclass(frozen=True)
class InfoExchange:
    """1011: how many exchanges run here (served; the GCM does not ask it)."""

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.INFO_EXCHANGE)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class ExchangeCount:
    """The reply to 1011: `Exchanges` running here, `Max` = exchange.max.perhost."""

    exchanges: int
    max_exchanges: int  # Max

    def encode(self) -> Document:
        return bsonmsg.ok(Exchanges=self.exchanges, Max=self.max_exchanges)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_int(doc, "Exchanges"), field_int(doc, "Max"))


# --- liveness ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostPing:
    """1020 PING."""

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.PING)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class HostPong:
    """The reply to PING: `COMMENT: "PONG"` and the host's name."""

    host: str

    def encode(self) -> Document:
        return bsonmsg.ok("PONG", Host=self.host)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_str(doc, "Host"))


@dataclass(frozen=True)
class HostShutdown:
    """1100 SHUTDOWN: declared, not served (a host answers `unknown_command` and stops on
    SIGTERM)."""

    def encode(self) -> Document:
        return {"CMD": int(HostCommand.SHUTDOWN)}
