"""The KPI stream (stat commands, docs/protocol.md "Statistics in and the KPI stream").

Exchanges send 20/21/22 as one 3-frame message, subscribers 31, publishers 11 and 12, the
monitor 23 and 40 (a scaling decision or its outcome); the stat monitor forwards what decodes
here, unchanged, on S+1. RoQ's numbers are kept, with numbers as numbers. The analytics job
records these messages (`roq.analytics.kpi`, whose record contract is looser: a merged
20/21/22, `TS` for `Time`).

The latency histogram of a 31 is built by `roq.protocol.latency` (bucket `i > 0` covers
[2^((i-1)/8), 2^(i/8)) µs, bucket 0 is [0, 1) µs); its fields are checked here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_float, field_int, field_list, field_str
from roq.protocol.commands import StatCommand
from roq.protocol.latency import BUCKET_MAX, histogram_fields

_QNAME_CHARS_MAX: Final = limits.queue_name_chars_max + 8  # 23 says "<queue>:<port>"


def _time(doc: Mapping[str, Any]) -> float:
    return field_float(doc, "Time", lo=0.0)


# --- exchange: 20, 21, 22 in one message -------------------------------------------------------
@dataclass(frozen=True)
class ExchangeKpi:
    """RoQ's 3-frame exchange envelope, per second instead of per minute: 20 EXCHANGE_ID
    (`X_ID`, `QName`, `Time`), 21 EXCHANGE_MIN (rates over `Period` and totals since start),
    22 EXCHANGE_OS_MIN (`CPU`: the machine's load average, `ProcessCPU`: a share of one core,
    `MEMORY`: RSS in MiB)."""

    exchange_id: str  # X_ID
    queue: str  # QName
    time: float  # Time, epoch seconds
    period_s: float  # Period
    total_processed: int  # TotalProcessed: messages since start
    processed: float  # Processed: msg/s
    total_throughput: int  # TotalThroughput: payload bytes since start
    throughput: float  # Throughput: B/s
    producers: int
    cpu: float  # CPU
    process_cpu: float  # ProcessCPU
    memory_mib: float  # MEMORY

    def frames(self) -> list[Document]:
        return [
            {"CMD": int(StatCommand.EXCHANGE_ID), "X_ID": self.exchange_id, "QName": self.queue,
             "Time": self.time},
            {"CMD": int(StatCommand.EXCHANGE_MIN), "Period": self.period_s,
             "TotalProcessed": self.total_processed, "Processed": self.processed,
             "TotalThroughput": self.total_throughput, "Throughput": self.throughput,
             "Producers": self.producers},
            {"CMD": int(StatCommand.EXCHANGE_OS_MIN), "CPU": self.cpu,
             "ProcessCPU": self.process_cpu, "MEMORY": self.memory_mib},
        ]  # fmt: skip

    @classmethod
    def decode(cls, docs: Sequence[Mapping[str, Any]]) -> Self:
        ids, mins, oss = _one_each(docs, StatCommand.EXCHANGE_ID, StatCommand.EXCHANGE_MIN,
                                   StatCommand.EXCHANGE_OS_MIN)  # fmt: skip
        return cls(
            exchange_id=field_str(ids, "X_ID"),
            queue=field_str(ids, "QName", max_chars=_QNAME_CHARS_MAX),
            time=_time(ids),
            period_s=field_float(mins, "Period", lo=0.0),
            total_processed=field_int(mins, "TotalProcessed"),
            processed=field_float(mins, "Processed", lo=0.0),
            total_throughput=field_int(mins, "TotalThroughput"),
            throughput=field_float(mins, "Throughput", lo=0.0),
            producers=field_int(mins, "Producers"),
            cpu=field_float(oss, "CPU", lo=0.0),
            process_cpu=field_float(oss, "ProcessCPU", lo=0.0),
            memory_mib=field_float(oss, "MEMORY", lo=0.0),
        )


def _one_each(docs: Sequence[Mapping[str, Any]], *commands: int) -> list[Mapping[str, Any]]:
    found = [bsonmsg.command(doc) for doc in docs]
    if found != list(commands):
        raise DecodeError(f"an exchange KPI message is the frames {list(commands)}, not {found}")
    return list(docs)


# --- monitor: 23, 40 ---------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueKpi:
    """23 QUEUE, from the monitor: the queue's exchanges summed, as last reported."""

    queue: str  # QName: "<queue>:<monitor port>" (RoQ's form)
    exchanges: int  # XChanges
    producers: int  # may dip below 0 for a moment: placement's optimistic moves count too
    throughput: float  # Throughput, B/s
    msgs: float  # Msgs, msg/s
    time: float

    def encode(self) -> Document:
        return {
            "CMD": int(StatCommand.QUEUE), "QName": self.queue, "XChanges": self.exchanges,
            "Producers": self.producers, "Throughput": self.throughput, "Msgs": self.msgs,
            "Time": self.time,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_str(doc, "QName", max_chars=_QNAME_CHARS_MAX),
            field_int(doc, "XChanges"),
            field_int(doc, "Producers", lo=-bsonmsg.INT64_MAX),
            field_float(doc, "Throughput"),
            field_float(doc, "Msgs"),
            _time(doc),
        )


@dataclass(frozen=True)
class ScalingEvent:
    """40 SCALING_EVENT: a scaling decision or its outcome (docs/elasticity.md). The monitor's
    STATUS lists its recent ones as `entry()`, without `CMD` and `QName`."""

    queue: str  # QName
    event: str  # Event: scale_out, exchange_added, follower_added, capacity_exhausted, …
    reason: str  # Reason
    policy: str  # Policy
    time: float
    exchanges: int | None = None  # Exchanges: how many, when scaling out
    exchange: str = ""  # Exchange: the one added, retired, or to retire
    action: str = ""  # Action: the action that failed ("out" or "in")
    producer: str = ""  # Producer: the publisher moved onto a new exchange

    def entry(self) -> Document:
        doc: Document = {"Event": self.event, "Reason": self.reason, "Policy": self.policy,
                         "Time": self.time}  # fmt: skip
        if self.exchanges is not None:
            doc["Exchanges"] = self.exchanges
        doc.update({name: value for name, value in (
            ("Exchange", self.exchange), ("Action", self.action), ("Producer", self.producer)
        ) if value})  # fmt: skip
        return doc

    def encode(self) -> Document:
        return {"CMD": int(StatCommand.SCALING_EVENT), "QName": self.queue, **self.entry()}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls.decode_entry(doc, field_str(doc, "QName", max_chars=_QNAME_CHARS_MAX))

    @classmethod
    def decode_entry(cls, doc: Mapping[str, Any], queue: str = "", prefix: str = "") -> Self:
        def optional(name: str) -> str:
            return field_str(doc, name, default="", prefix=prefix)

        exchanges = (
            field_int(doc, "Exchanges", prefix=prefix) if doc.get("Exchanges") is not None else None
        )
        return cls(
            queue,
            field_str(doc, "Event", prefix=prefix),
            field_str(
                doc,
                "Reason",
                max_chars=limits.reply_comment_chars_max,
                empty_ok=True,
                prefix=prefix,
            ),
            field_str(doc, "Policy", prefix=prefix),
            field_float(doc, "Time", lo=0.0, prefix=prefix),
            exchanges,
            optional("Exchange"),
            optional("Action"),
            optional("Producer"),
        )


# --- subscriber: 31 ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SubscriberKpi:
    """31 SUBSCRIBER_TOTAL, every second: totals since start, the period's latency (ms, from
    the batch's first timestamp to receipt) and its histogram (µs; `histogram_fields`). roq's
    subscribers always send the histogram; it is optional (empty) as in the KPI record's
    contract (docs/analytics.md), for subscribers that send only `MeanLat` and `P99Lat`."""

    subscriber_id: str  # SubscriberID
    queue: str  # QName
    total_received: int  # TotalReceived
    lost: int
    duplicates: int
    lat_count: int  # LatCount
    lat_sum_us: int  # LatSumUs
    lat_min_us: int  # LatMinUs
    lat_max_us: int  # LatMaxUs
    lat_idx: tuple[int, ...]  # LatIdx: the buckets that hold samples, ascending
    lat_cnt: tuple[int, ...]  # LatCnt: their counts
    mean_lat_ms: float  # MeanLat
    p99_lat_ms: float  # P99Lat
    time: float

    @classmethod
    def of_samples(
        cls, subscriber_id: str, queue: str, totals: tuple[int, int, int], samples_us: list[float],
        time: float,
    ) -> Self:  # fmt: skip
        """From the period's latency samples (µs, sorted; clock skew may make some negative:
        the histogram counts them as 0); totals: received, lost, duplicates."""
        h = histogram_fields([max(0, int(sample)) for sample in samples_us])
        p99 = samples_us[int(len(samples_us) * 0.99)] / 1000 if samples_us else 0.0
        return cls(subscriber_id, queue, *totals, h["LatCount"], h["LatSumUs"], h["LatMinUs"],
                   h["LatMaxUs"], tuple(h["LatIdx"]), tuple(h["LatCnt"]), h["MeanLat"], p99,
                   time)  # fmt: skip

    def encode(self) -> Document:
        return {
            "CMD": int(StatCommand.SUBSCRIBER_TOTAL), "SubscriberID": self.subscriber_id,
            "QName": self.queue, "TotalReceived": self.total_received, "Lost": self.lost,
            "Duplicates": self.duplicates, "LatCount": self.lat_count,
            "LatSumUs": self.lat_sum_us, "LatMinUs": self.lat_min_us,
            "LatMaxUs": self.lat_max_us, "LatIdx": list(self.lat_idx),
            "LatCnt": list(self.lat_cnt), "MeanLat": self.mean_lat_ms,
            "P99Lat": self.p99_lat_ms, "Time": self.time,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        index, count = _histogram(doc)
        return cls(
            field_str(doc, "SubscriberID"),
            field_str(doc, "QName", max_chars=limits.queue_name_chars_max),
            field_int(doc, "TotalReceived"),
            field_int(doc, "Lost"),
            field_int(doc, "Duplicates"),
            field_int(doc, "LatCount", default=0),
            field_int(doc, "LatSumUs", default=0),
            field_int(doc, "LatMinUs", default=0),
            field_int(doc, "LatMaxUs", default=0),
            index,
            count,
            field_float(doc, "MeanLat", lo=0.0),
            field_float(doc, "P99Lat"),
            _time(doc),
        )


def _histogram(doc: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    index = field_list(doc, "LatIdx", max_items=BUCKET_MAX + 1, default=[])
    count = field_list(doc, "LatCnt", max_items=BUCKET_MAX + 1, default=[])
    if len(index) != len(count):
        raise DecodeError("the LatIdx and LatCnt fields must be lists of the same length")
    as_doc = {f"LatIdx[{n}]": i for n, i in enumerate(index)}
    as_doc.update({f"LatCnt[{n}]": c for n, c in enumerate(count)})
    return (
        tuple(field_int(as_doc, f"LatIdx[{n}]", hi=BUCKET_MAX) for n in range(len(index))),
        tuple(field_int(as_doc, f"LatCnt[{n}]") for n in range(len(count))),
    )


# --- publisher: 11, 12 ------------------------------------------------------------------------
@dataclass(frozen=True)
class PublisherKpi:
    """11 PUBLISHER_TOTAL (`TotalSent`: messages sent since start) or 12 PUBLISHER_MINUTE
    (`Total`: messages sent in the last `Period` seconds), RoQ's numbers. A publisher sends both,
    one after the other, every `limits.publisher_stat_period_s` (RoQ: every minute). RoQ's 12
    named the publisher `SubscriberID`; both carry `PublisherID` here."""

    command: StatCommand
    publisher_id: str  # PublisherID: the producer id, hex
    queue: str  # QName
    total: int  # TotalSent (11) or Total (12)
    time: float
    period_s: float = 0.0  # Period (12 only): the seconds `Total` was counted over

    def _name(self) -> str:
        return "TotalSent" if self.command == StatCommand.PUBLISHER_TOTAL else "Total"

    def encode(self) -> Document:
        doc: Document = {
            "CMD": int(self.command), "PublisherID": self.publisher_id, "QName": self.queue,
            self._name(): self.total, "Time": self.time,
        }  # fmt: skip
        if self.command == StatCommand.PUBLISHER_MINUTE:
            doc["Period"] = self.period_s
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        command = StatCommand(bsonmsg.command(doc))
        minute = command == StatCommand.PUBLISHER_MINUTE
        return cls(
            command,
            field_str(doc, "PublisherID", max_chars=limits.producer_id_chars_max),
            field_str(doc, "QName", max_chars=limits.queue_name_chars_max),
            field_int(doc, "Total" if minute else "TotalSent"),
            _time(doc),
            field_float(doc, "Period", lo=0.0) if minute else 0.0,
        )

    @property
    def rate(self) -> float:
        """Messages per second over the period (12; 0 for an 11 or an empty period)."""
        return self.total / self.period_s if self.period_s > 0 else 0.0


KpiMessage = ExchangeKpi | QueueKpi | ScalingEvent | SubscriberKpi | PublisherKpi
_ONE_FRAME: dict[int, Any] = {
    StatCommand.QUEUE: QueueKpi,
    StatCommand.SCALING_EVENT: ScalingEvent,
    StatCommand.SUBSCRIBER_TOTAL: SubscriberKpi,
    StatCommand.PUBLISHER_TOTAL: PublisherKpi,
    StatCommand.PUBLISHER_MINUTE: PublisherKpi,
}


def decode_kpi_message(docs: Sequence[Mapping[str, Any]]) -> KpiMessage:
    """One message of the KPI stream, its frames decoded (`bsonmsg.decode`) one by one: the
    exchange's three frames, or one frame of another command."""
    if len(docs) == 3:
        return ExchangeKpi.decode(docs)
    if len(docs) != 1:
        raise DecodeError(f"a KPI message has 1 or 3 frames, not {len(docs)}")
    command = bsonmsg.command(docs[0])
    schema = _ONE_FRAME.get(command)
    if schema is None:
        raise DecodeError(f"CMD {command} is not a one-frame KPI message")
    message: KpiMessage = schema.decode(docs[0])
    return message


def encode_kpi_message(message: KpiMessage) -> list[Document]:
    """The frames of one KPI message, in order."""
    if isinstance(message, ExchangeKpi):
        return message.frames()
    return [message.encode()]
