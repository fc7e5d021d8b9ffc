"""The control port of a child process (monitor B+5, exchange F+2): PING/PONG with the child's
STATUS, SHUTDOWN, and REPLICAS (monitor → exchange). docs/protocol.md, "Child control".

STATUS is what `roq status` shows: `MonitorStatus` or `ExchangeStatus`, by the child asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from roq import limits
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import (
    INT64_MAX,
    Document,
    field_bool,
    field_doc,
    field_docs,
    field_endpoint,
    field_float,
    field_int,
    field_str,
    field_strs,
)
from roq.protocol.commands import ChildCommand
from roq.protocol.epoch import EPOCH, field_epoch
from roq.protocol.messages.kpi import ScalingEvent
from roq.protocol.messages.monitor import COPIES_MAX, EXCHANGES_MAX, CopyEnd, DeadLog
from roq.protocol.names import EXCHANGE_ID_CHARS_MAX, check_exchange_id


@dataclass(frozen=True)
class Ping:
    """1020 PING: are you up? Answered with `Pong`."""

    def encode(self) -> Document:
        return {"CMD": int(ChildCommand.PING)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class Shutdown:
    """1100 SHUTDOWN: leave the main loop (an exchange first tells its monitor it is leaving);
    answered `COMMENT: "stopping"`."""

    def encode(self) -> Document:
        return {"CMD": int(ChildCommand.SHUTDOWN)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class Pong:
    """The reply to PING: `NAME` ("monitor q1", "exchange q1/<id>") and `STATUS`."""

    name: str
    status: Mapping[str, Any]  # MonitorStatus or ExchangeStatus, encoded

    def encode(self) -> Document:
        return bsonmsg.ok("PONG", NAME=self.name, STATUS=dict(self.status))

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_str(doc, "NAME"), field_doc(doc, "STATUS"))


@dataclass(frozen=True)
class ReplicaAssignment:
    replica_id: str  # Id
    endpoint: str  # Endpoint: tcp://ip:F+3 of the replica

    def fields(self) -> Document:
        return {"Id": self.replica_id, "Endpoint": self.endpoint}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix), field_endpoint(doc, "Endpoint", prefix=prefix)
        )


@dataclass(frozen=True)
class CopySource:
    """Send your copy of the gone exchange `Leader`'s log to `Id` at `Endpoint` (its F+3)."""

    leader_id: str  # Leader
    target_id: str  # Id
    endpoint: str  # Endpoint

    def fields(self) -> Document:
        return {"Leader": self.leader_id, "Id": self.target_id, "Endpoint": self.endpoint}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            check_exchange_id(field_str(doc, "Leader", prefix=prefix)),
            check_exchange_id(field_str(doc, "Id", prefix=prefix)),
            field_endpoint(doc, "Endpoint", prefix=prefix),
        )


@dataclass(frozen=True)
class Replicas:
    """1030 REPLICAS, monitor → exchange: the exchanges that copy your log are these (the set
    replaces the previous one), and, with `Leaders`, the exchanges whose logs you copy (you
    refuse every other's writes; absent: the set you had stands); with `Sources`, the copies of
    gone exchanges' logs you send to other exchanges (the set replaces the previous one; absent:
    none); with `Retire` (to a log keeper only), every log it holds has replicationFactor
    complete copies on live exchanges: it marks its logs retired and exits; with
    `DropStateBefore` N (optional), the monitor's state log of epoch N holds everything the
    older ones did and is copied: the copies of `state.<e>`, e < N, are deleted; with
    `ConsumedBefore` N (optional, an HTTP gateway's queue: TOPIC_FLOOR 57), no reader needs
    this log before offset N: its whole segments before N go, and its copies follow; answered
    `COMMENT: "assigned"`, or refused `ERROR: stale_epoch` when its `Epoch` is older than one
    the exchange has seen (a monitor that was re-placed)."""

    replicas: tuple[ReplicaAssignment, ...]
    leaders: tuple[str, ...] | None = None  # Leaders: exchange ids
    sources: tuple[CopySource, ...] = ()  # Sources
    epoch: int = 0  # Epoch: the sending monitor's assignment epoch
    retire: bool = False  # Retire (optional, false when absent)
    drop_state_before: int = 0  # DropStateBefore (optional, 0 when absent)
    consumed_before: int = 0  # ConsumedBefore (optional, 0 when absent)

    def encode(self) -> Document:
        doc: Document = {
            "CMD": int(ChildCommand.REPLICAS), "Replicas": [r.fields() for r in self.replicas],
            EPOCH: self.epoch,
        }  # fmt: skip
        if self.leaders is not None:
            doc["Leaders"] = list(self.leaders)
        if self.sources:
            doc["Sources"] = [s.fields() for s in self.sources]
        if self.retire:
            doc["Retire"] = True
        if self.drop_state_before:
            doc["DropStateBefore"] = self.drop_state_before
        if self.consumed_before:
            doc["ConsumedBefore"] = self.consumed_before
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        replicas = field_docs(doc, "Replicas", ReplicaAssignment.decode, max_items=EXCHANGES_MAX)
        sources: tuple[CopySource, ...] = ()
        if doc.get("Sources") is not None:
            sources = field_docs(doc, "Sources", CopySource.decode, max_items=EXCHANGES_MAX)
        epoch = field_epoch(doc)
        retire = field_bool(doc, "Retire", default=False)
        drop = field_int(doc, "DropStateBefore", default=0, hi=INT64_MAX)
        consumed = field_int(doc, "ConsumedBefore", default=0, hi=INT64_MAX)
        if doc.get("Leaders") is None:
            return cls(replicas, None, sources, epoch, retire, drop, consumed)
        leaders = field_strs(
            doc, "Leaders", max_items=EXCHANGES_MAX, max_chars=EXCHANGE_ID_CHARS_MAX
        )
        leaders_ok = tuple(check_exchange_id(leader) for leader in leaders)
        return cls(replicas, leaders_ok, sources, epoch, retire, drop, consumed)


@dataclass(frozen=True)
class MonitorMoved:
    """1031 MONITOR_MOVED, host → exchange: report to the monitor at `Monitor` (tcp://ip:B) and
    send statistics to `Stat` (tcp://ip:S) from now on; answered `COMMENT: "moved"`, or
    refused `ERROR: stale_epoch` when its `Epoch` (the new monitor's) is older than one the
    exchange has seen."""

    monitor: str  # Monitor
    stat: str  # Stat
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return {
            "CMD": int(ChildCommand.MONITOR_MOVED), "Monitor": self.monitor, "Stat": self.stat,
            EPOCH: self.epoch,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_endpoint(doc, "Monitor"), field_endpoint(doc, "Stat"), field_epoch(doc))


def _offset_or_null(doc: Mapping[str, Any], name: str, lo: int = 0) -> int | None:
    """An offset that is `null` when the exchange keeps no log."""
    return None if doc.get(name) is None else field_int(doc, name, lo=lo)


# --- an exchange's STATUS ----------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaStatus:
    """One replica of the exchange's log, as its leader sees it (-1: not known yet)."""

    replica_id: str  # Id
    acked: int  # Acked: where the replica's copy ends, as it last said
    sent: int  # Sent: where the next batch sent to it starts
    in_sync: bool  # InSync

    def fields(self) -> Document:
        return {"Id": self.replica_id, "Acked": self.acked, "Sent": self.sent,
                "InSync": self.in_sync}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix),
            field_int(doc, "Acked", lo=-1, prefix=prefix),
            field_int(doc, "Sent", lo=-1, prefix=prefix),
            field_bool(doc, "InSync", prefix=prefix),
        )


@dataclass(frozen=True)
class ExchangeStatus:
    queue: str  # Queue
    exchange_id: str  # Id
    total_msgs: int  # TotalMsgs
    bad: int  # Bad: refused frames
    subscriptions: int  # Subscriptions
    leaving: bool  # Leaving
    log_start: int | None  # LogStart: null with useLog=false
    log_end: int | None  # LogEnd
    replicas: tuple[ReplicaStatus, ...]  # Replicas
    committed: int | None  # Committed: every in-sync replica holds the log below it
    epoch: int = 0  # Epoch: the highest assignment epoch of its queue it has seen
    stale: int = 0  # StaleEpochs: REPLICAS and MONITOR_MOVED refused for an older epoch

    def encode(self) -> Document:
        return {
            "Queue": self.queue, "Id": self.exchange_id, "TotalMsgs": self.total_msgs,
            "Bad": self.bad, "Subscriptions": self.subscriptions, "Leaving": self.leaving,
            "LogStart": self.log_start, "LogEnd": self.log_end,
            "Replicas": [r.fields() for r in self.replicas], "Committed": self.committed,
            EPOCH: self.epoch, "StaleEpochs": self.stale,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_str(doc, "Queue"),
            field_str(doc, "Id"),
            field_int(doc, "TotalMsgs"),
            field_int(doc, "Bad"),
            field_int(doc, "Subscriptions"),
            field_bool(doc, "Leaving"),
            _offset_or_null(doc, "LogStart"),
            _offset_or_null(doc, "LogEnd"),
            field_docs(doc, "Replicas", ReplicaStatus.decode, max_items=EXCHANGES_MAX),
            _offset_or_null(doc, "Committed"),
            field_epoch(doc),
            field_int(doc, "StaleEpochs", default=0),
        )


# --- a monitor's STATUS ------------------------------------------------------------------------
@dataclass(frozen=True)
class MonitoredExchange:
    """One exchange as its monitor knows it: rates per second as last reported (corrected by
    the monitor's own placements since, so `Bytes` and `Producers` may dip below 0)."""

    exchange_id: str  # Id
    front: str
    back: str
    msgs_rate: float  # Msgs
    bytes_rate: float  # Bytes
    producers: int
    cpu: float  # CPU: share of one core
    rss: int  # RSS, bytes
    leaving: bool
    subscriptions: int
    placeable: bool  # Placeable: takes publishers (joined, or past its warm-up)
    replicas: tuple[str, ...]  # Replicas: ids of the exchanges that copy its log
    copies: tuple[CopyEnd, ...]  # Copies: the copies of other logs it holds
    age_s: float  # Age: since the monitor first heard of it
    # Refusing: why its log refuses appends (then not Placeable), "" while it takes them;
    # optional (a monitor of an older version never sends it)
    refusing: str = ""
    # InSync / InSyncMin: copies of its log in sync and the min.insync.copies acks=all needs
    # (optional; 0: not reported)
    in_sync: int = 0
    in_sync_min: int = 0
    follower: bool = False  # Follower: a log follower, holding copies only (optional)

    def fields(self) -> Document:
        doc = {
            "Id": self.exchange_id, "Front": self.front, "Back": self.back,
            "Msgs": self.msgs_rate, "Bytes": self.bytes_rate, "Producers": self.producers,
            "CPU": self.cpu, "RSS": self.rss, "Leaving": self.leaving,
            "Subscriptions": self.subscriptions, "Placeable": self.placeable,
            "Replicas": list(self.replicas), "Copies": [c.fields() for c in self.copies],
            "Age": self.age_s,
        }  # fmt: skip
        if self.refusing:
            doc["Refusing"] = self.refusing
        if self.in_sync:
            doc.update(InSync=self.in_sync, InSyncMin=self.in_sync_min)
        if self.follower:
            doc["Follower"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        p = prefix
        return cls(
            field_str(doc, "Id", prefix=p),
            field_endpoint(doc, "Front", prefix=p),
            field_endpoint(doc, "Back", prefix=p),
            field_float(doc, "Msgs", prefix=p),
            field_float(doc, "Bytes", prefix=p),
            field_int(doc, "Producers", lo=-INT64_MAX, prefix=p),
            field_float(doc, "CPU", lo=0.0, prefix=p),
            field_int(doc, "RSS", prefix=p),
            field_bool(doc, "Leaving", prefix=p),
            field_int(doc, "Subscriptions", prefix=p),
            field_bool(doc, "Placeable", prefix=p),
            field_strs(doc, "Replicas", max_items=EXCHANGES_MAX, prefix=p),
            field_docs(doc, "Copies", CopyEnd.decode, prefix=p),
            field_float(doc, "Age", lo=0.0, prefix=p),
            field_str(doc, "Refusing", default="", prefix=p),
            field_int(doc, "InSync", hi=COPIES_MAX, default=0, prefix=p),
            field_int(doc, "InSyncMin", hi=COPIES_MAX, default=0, prefix=p),
            field_bool(doc, "Follower", default=False, prefix=p),
        )


@dataclass(frozen=True)
class RulesInForce:
    """The rules the monitor applies (a zero limit: that check is off)."""

    name: str
    host_cpu: float
    host_ram: float
    exchange_throughput: float
    queue_producers: float
    queue_throughput: float
    stored: bool  # Stored: stored rules (else the implicit one)
    version: int

    def fields(self) -> Document:
        return {
            "Name": self.name, "HostCPU": self.host_cpu, "HostRAM": self.host_ram,
            "ExchangeThroughput": self.exchange_throughput,
            "QueueProducers": self.queue_producers, "QueueThroughput": self.queue_throughput,
            "Stored": self.stored, "Version": self.version,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        def limit(name: str) -> float:
            return field_float(doc, name, lo=0.0, prefix=prefix)

        return cls(
            field_str(doc, "Name", empty_ok=True, prefix=prefix),
            limit("HostCPU"),
            limit("HostRAM"),
            limit("ExchangeThroughput"),
            limit("QueueProducers"),
            limit("QueueThroughput"),
            field_bool(doc, "Stored", prefix=prefix),
            field_int(doc, "Version", prefix=prefix),
        )


@dataclass(frozen=True)
class ScalingStatus:
    """The queue's elasticity: policy, rules, limits, state and recent events (oldest first)."""

    policy: str
    rules: RulesInForce
    min_exchanges: int  # Min
    max_exchanges: int  # Max: 0 = as many as the hosts have slots for
    in_flight: str  # InFlight: "out", "in" or ""
    cooldown_left_s: float  # CooldownLeft
    low_for_s: float  # LowFor: below the low-water mark this long
    scaled_out: int
    scaled_in: int
    events: tuple[ScalingEvent, ...]

    def fields(self) -> Document:
        return {
            "Policy": self.policy, "Rules": self.rules.fields(), "Min": self.min_exchanges,
            "Max": self.max_exchanges, "InFlight": self.in_flight,
            "CooldownLeft": self.cooldown_left_s, "LowFor": self.low_for_s,
            "ScaledOut": self.scaled_out, "ScaledIn": self.scaled_in,
            "Events": [e.entry() for e in self.events],
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        p = prefix
        return cls(
            field_str(doc, "Policy", prefix=p),
            RulesInForce.decode(field_doc(doc, "Rules", prefix=p), f"{p}Rules."),
            field_int(doc, "Min", prefix=p),
            field_int(doc, "Max", prefix=p),
            field_str(doc, "InFlight", empty_ok=True, prefix=p),
            field_float(doc, "CooldownLeft", lo=0.0, prefix=p),
            field_float(doc, "LowFor", lo=0.0, prefix=p),
            field_int(doc, "ScaledOut", prefix=p),
            field_int(doc, "ScaledIn", prefix=p),
            field_docs(doc, "Events", _event_entry, prefix=p),
        )


def _event_entry(doc: Mapping[str, Any], prefix: str) -> ScalingEvent:
    return ScalingEvent.decode_entry(doc, prefix=prefix)


@dataclass(frozen=True)
class MonitorStatus:
    queue: str  # Queue
    relocations: int  # Relocations: publishers moved since start
    bad_frames: int  # BadFrames: malformed reports and statistics dropped
    scaling: ScalingStatus
    exchanges: tuple[MonitoredExchange, ...]
    copies: tuple[DeadLog, ...]  # Copies: dead exchanges' logs subscribers are told about
    short_logs: tuple[ShortLog, ...] = ()  # ShortLogs (absent from an older monitor: none)
    epoch: int = 0  # Epoch: the assignment epoch it acts under
    state: StateLogStatus | None = None  # State: its state log (delivery.state=log only)
    # Publishers: their KPIs (11, 12) as last heard; PublishersUntracked: heard past the bound
    publishers: tuple[PublisherStat, ...] = ()
    publishers_untracked: int = 0

    def encode(self) -> Document:
        doc = {
            "Queue": self.queue, "Relocations": self.relocations, "BadFrames": self.bad_frames,
            "Scaling": self.scaling.fields(),
            "Exchanges": [x.fields() for x in self.exchanges],
            "Copies": [c.fields() for c in self.copies],
            "ShortLogs": [s.fields() for s in self.short_logs],
            EPOCH: self.epoch,
        }  # fmt: skip
        if self.state is not None:
            doc["State"] = self.state.fields()
        doc["Publishers"] = [p.fields() for p in self.publishers]
        doc["PublishersUntracked"] = self.publishers_untracked
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        short: tuple[ShortLog, ...] = ()
        if doc.get("ShortLogs") is not None:
            short = field_docs(doc, "ShortLogs", ShortLog.decode, max_items=EXCHANGES_MAX)
        return cls(
            field_str(doc, "Queue"),
            field_int(doc, "Relocations"),
            field_int(doc, "BadFrames"),
            ScalingStatus.decode(field_doc(doc, "Scaling"), "Scaling."),
            field_docs(doc, "Exchanges", MonitoredExchange.decode, max_items=EXCHANGES_MAX),
            field_docs(doc, "Copies", DeadLog.decode),
            short,
            field_epoch(doc),
            None if doc.get("State") is None
            else StateLogStatus.decode(field_doc(doc, "State"), "State."),
            *_publishers(doc),
        )  # fmt: skip


@dataclass(frozen=True)
class StateLogStatus:
    """The monitor's delivery-state log (`delivery.state=log`, docs/architecture.md §12), as
    `roq status` shows it."""

    leader_id: str  # Id: state.<epoch>
    records: int  # Records: live keys
    start: int  # Start, End: the log's offsets
    end: int
    committed: int  # Committed: below it, on min.insync.copies copies
    in_sync: int  # InSync: copies in sync, the monitor's own counted
    in_sync_min: int  # InSyncMin: min.insync.copies
    copies: tuple[str, ...]  # Copies: the exchanges copying it
    waiting: int  # Waiting: replies held for its copies
    refused: int  # Refused: replies refused after waiting too long (since start)
    recovering: str = ""  # Recovering: what it reads before serving ("" when it serves)

    def fields(self) -> Document:
        return {"Id": self.leader_id, "Records": self.records, "Start": self.start,
                "End": self.end, "Committed": self.committed, "InSync": self.in_sync,
                "InSyncMin": self.in_sync_min, "Copies": list(self.copies),
                "Waiting": self.waiting, "Refused": self.refused,
                "Recovering": self.recovering}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        def number(name: str) -> int:
            return field_int(doc, name, hi=INT64_MAX, prefix=prefix)

        return cls(
            field_str(doc, "Id", max_chars=EXCHANGE_ID_CHARS_MAX, prefix=prefix),
            number("Records"), number("Start"), number("End"), number("Committed"),
            field_int(doc, "InSync", hi=COPIES_MAX, prefix=prefix),
            field_int(doc, "InSyncMin", hi=COPIES_MAX, prefix=prefix),
            field_strs(doc, "Copies", max_items=COPIES_MAX, prefix=prefix),
            number("Waiting"), number("Refused"),
            field_str(doc, "Recovering", empty_ok=True, default="", prefix=prefix),
        )  # fmt: skip


@dataclass(frozen=True)
class CopyProgress:
    """An exchange receiving a copy of a gone exchange's log, and where its copy ends."""

    exchange_id: str  # Id
    end: int  # End (-1: it holds none yet)

    def fields(self) -> Document:
        return {"Id": self.exchange_id, "End": self.end}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(field_str(doc, "Id", prefix=prefix), field_int(doc, "End", lo=-1, prefix=prefix))


@dataclass(frozen=True)
class ShortLog:
    """A gone exchange's log with fewer than `Wanted` (replicationFactor) complete copies on
    live exchanges, and the copies under way (`roq status` shows it)."""

    leader_id: str  # Id
    end: int  # End: where its longest copy ends
    copies: int  # Copies: complete copies on live exchanges
    wanted: int  # Wanted
    source: str  # Source: the exchange sending its copy
    targets: tuple[CopyProgress, ...]  # Targets: none when no exchange can take a copy

    def fields(self) -> Document:
        return {"Id": self.leader_id, "End": self.end, "Copies": self.copies,
                "Wanted": self.wanted, "Source": self.source,
                "Targets": [t.fields() for t in self.targets]}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix),
            field_int(doc, "End", prefix=prefix),
            field_int(doc, "Copies", prefix=prefix),
            field_int(doc, "Wanted", prefix=prefix),
            field_str(doc, "Source", prefix=prefix),
            field_docs(doc, "Targets", CopyProgress.decode, max_items=EXCHANGES_MAX, prefix=prefix),
        )


# --- publisher KPIs in a monitor's STATUS (CMD 11, 12; docs/protocol.md) ---------------------
@dataclass(frozen=True)
class PublisherStat:
    """A publisher's KPIs as its monitor last heard them: `TotalSent` (11), `Rate` (msg/s: 12's
    `Total` over its `Period`), `Age` (s since heard)."""

    publisher_id: str  # PublisherID
    total_sent: int  # TotalSent
    rate: float  # Rate
    age_s: float  # Age

    def fields(self) -> Document:
        return {"PublisherID": self.publisher_id, "TotalSent": self.total_sent,
                "Rate": self.rate, "Age": self.age_s}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "PublisherID", max_chars=limits.producer_id_chars_max, prefix=prefix),
            field_int(doc, "TotalSent", hi=INT64_MAX, prefix=prefix),
            field_float(doc, "Rate", lo=0.0, prefix=prefix),
            field_float(doc, "Age", lo=0.0, prefix=prefix),
        )


def _publishers(doc: Mapping[str, Any]) -> tuple[tuple[PublisherStat, ...], int]:
    """`Publishers` and `PublishersUntracked`, absent from an older monitor: none."""
    if doc.get("Publishers") is None:
        return (), 0
    rows = field_docs(
        doc, "Publishers", PublisherStat.decode, max_items=limits.monitor_publisher_kpis_max
    )
    return rows, field_int(doc, "PublishersUntracked", hi=INT64_MAX, default=0)
