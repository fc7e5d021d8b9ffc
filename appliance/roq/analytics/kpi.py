"""The KPI record: one BSON document per statistic, recorded durably as a log of its own.

Pure (no sockets): the exchange, monitor and subscriber build the stream's documents with the
schemas of `roq.protocol.messages.kpi` (the latency histogram comes from `roq.protocol.latency`)
and publish them; a `KpiRecorder` appends them as record batches to the system queue directory
`<directory>/_kpi/<source>/`, a message log written by roq.log like an exchange's. The Spark job
(roq.analytics.job) reads them back with `decode_kpi`. The record's contract (docs/analytics.md)
is looser than the stream's: the exchange's three frames merged into one document, `TS` (µs) for
`Time`, and only the fields the job reads checked. Field names keep RoQ's stat command numbers
(StatCommand) and, where RoQ had one, its field name.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import bson

from roq import limits
from roq.errors import CorruptRecord
from roq.log import FlushPolicy, Log, LogSettings
from roq.log import format as fmt
from roq.protocol.commands import StatCommand
from roq.protocol.latency import BUCKET_MAX

KPI_DIR = "_kpi"  # not a valid queue name (queue names start with a letter or digit)
KPI_KEY = b"kpi"

# The fields the job reads, per command, as the KPI stream carries them (exchange.py, monitor.py,
# client/subscriber.py); all are numbers and optional unless listed in REQUIRED.
NUMERIC_FIELDS: dict[int, tuple[str, ...]] = {
    StatCommand.PUBLISHER_TOTAL: ("TotalSent",),
    StatCommand.PUBLISHER_MINUTE: ("Total", "Period"),
    StatCommand.EXCHANGE_ID: (),
    StatCommand.EXCHANGE_MIN: (
        "Period", "Processed", "Throughput", "TotalProcessed", "TotalThroughput", "Producers",
        "CPU", "ProcessCPU", "MEMORY",
    ),
    StatCommand.EXCHANGE_OS_MIN: ("CPU", "ProcessCPU", "MEMORY"),
    StatCommand.QUEUE: ("XChanges", "Producers", "Throughput", "Msgs"),
    StatCommand.SUBSCRIBER_TOTAL: (
        "TotalReceived", "Lost", "Duplicates", "MeanLat", "P99Lat",
        "LatCount", "LatSumUs", "LatMinUs", "LatMaxUs",
    ),
}  # fmt: skip
REQUIRED: dict[int, tuple[str, ...]] = {
    StatCommand.EXCHANGE_MIN: ("X_ID",),
    StatCommand.SUBSCRIBER_TOTAL: ("SubscriberID",),
    StatCommand.PUBLISHER_TOTAL: ("PublisherID",),
    StatCommand.PUBLISHER_MINUTE: ("PublisherID",),
}


def merge_frames(frames: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One KPI document from one KPI-stream message. The exchange's 3-frame envelope (20, 21, 22)
    becomes one CMD 21 document holding the fields of all three; a 1-frame message is kept."""
    merged: dict[str, Any] = {}
    for frame in frames:
        merged.update(frame)
    cmds = [frame.get("CMD") for frame in frames]
    if StatCommand.EXCHANGE_ID in cmds:
        merged["CMD"] = int(StatCommand.EXCHANGE_MIN)
    return merged


def ts_us(doc: Mapping[str, Any]) -> int:
    """When the statistic was taken, in µs since the epoch: `TS` (µs) or the stream's `Time` (s)."""
    if "TS" in doc:
        return int(doc["TS"])
    return int(float(doc["Time"]) * 1_000_000)


def queue_name(doc: Mapping[str, Any]) -> str:
    """The queue: CMD 23 says "<queue>:<port>" (RoQ's form); queue names hold no ':'."""
    return str(doc["QName"]).split(":", 1)[0]


def encode_kpi(doc: Mapping[str, Any]) -> bytes:
    """Check a KPI document's contract and encode it as BSON."""
    check_kpi(doc)
    return bytes(bson.encode(dict(doc)))


def decode_kpi(data: bytes) -> dict[str, Any]:
    """Decode and check one KPI record payload; CorruptRecord says what is wrong."""
    if len(data) > limits.frame_bytes_max:
        raise CorruptRecord(f"KPI document of {len(data)} bytes is too large")
    try:
        doc: dict[str, Any] = bson.decode(data)
    except Exception as error:  # bson raises several types (InvalidBSON, ValueError, ...)
        raise CorruptRecord(f"KPI payload is not BSON: {error}") from None
    check_kpi(doc)
    return doc


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_kpi(doc: Mapping[str, Any]) -> None:
    """Raise CorruptRecord naming the first field that breaks the contract in docs/analytics.md."""
    cmd = doc.get("CMD")
    if not isinstance(cmd, int) or isinstance(cmd, bool) or cmd not in NUMERIC_FIELDS:
        raise CorruptRecord(f"KPI CMD {cmd!r} is not one of {sorted(NUMERIC_FIELDS)}")
    if not isinstance(doc.get("QName"), str):
        raise CorruptRecord(f"KPI CMD {cmd} needs the string field 'QName'")
    stamp = doc.get("TS", doc.get("Time"))
    if not _is_number(stamp) or (isinstance(stamp, float) and not math.isfinite(stamp)):
        raise CorruptRecord(f"KPI CMD {cmd} needs a time: 'TS' (µs) or 'Time' (s), got {stamp!r}")
    for name in REQUIRED.get(cmd, ()):
        if not isinstance(doc.get(name), str):
            raise CorruptRecord(f"KPI CMD {cmd} needs the string field {name!r}")
    for name in NUMERIC_FIELDS[cmd]:
        if name in doc and not _is_number(doc[name]):
            raise CorruptRecord(f"KPI field {name!r} must be a number, got {doc[name]!r}")
    if cmd == StatCommand.SUBSCRIBER_TOTAL:
        _check_histogram(doc)


def _check_histogram(doc: Mapping[str, Any]) -> None:
    index = doc.get("LatIdx", [])
    count = doc.get("LatCnt", [])
    if not isinstance(index, list) or not isinstance(count, list) or len(index) != len(count):
        raise CorruptRecord("KPI LatIdx and LatCnt must be lists of the same length")
    for i, c in zip(index, count, strict=True):
        if not isinstance(i, int) or not 0 <= i <= BUCKET_MAX or not isinstance(c, int) or c < 0:
            raise CorruptRecord(f"KPI latency bucket {i!r} with count {c!r} is out of range")


class KpiRecorder:
    """Appends KPI documents to `<directory>/_kpi/<source>/` as record batches.

    The directory is a message log of its own (`roq.log.Log`, one implementation for both):
    segments named by their base offset, a new one once the current one exceeds
    `segment_bytes_max`, each batch stamped with its byte offset, and on open the log's recovery
    cuts a torn tail (a crash mid-write) so that appends stay readable. Flushing is left to the OS
    (`log.flush=os`) until `close`. One recorder per source (a host, or a process), used by one
    thread.
    """

    def __init__(self, directory: str | os.PathLike[str], source: str, segment_bytes_max: int):
        if not source or "/" in source or source in (".", ".."):
            raise ValueError(f"KPI source name {source!r} must be a plain file name")
        assert segment_bytes_max > 0
        self.path = Path(directory) / KPI_DIR / source
        self.producer_id = uuid.uuid5(uuid.NAMESPACE_URL, f"roq-kpi:{source}").bytes
        settings = LogSettings(segment_bytes_max, FlushPolicy("os"), memory_bytes=0)
        self.log = Log.open(self.path, settings, name=f"KPI log {self.path}")
        self.seq = 0  # continues after the newest batch kept
        for _, _, header in self.log.segments[-1].scan(verify=False):
            self.seq = header.last_seq + 1

    def append_message(self, frames: list[Mapping[str, Any]]) -> int:
        """Record one message of the KPI stream (its decoded frames) as one document."""
        return self.append([merge_frames(frames)])

    def append(self, docs: list[Mapping[str, Any]]) -> int:
        """Write `docs` as one batch; return its log offset."""
        # encode (and so check) first; then order by time: record timestamps may not decrease
        pairs = sorted(((encode_kpi(doc), ts_us(doc)) for doc in docs), key=lambda p: p[1])
        payloads = [payload for payload, _ in pairs]
        stamps = [stamp for _, stamp in pairs]
        batch = bytearray(fmt.encode_batch(self.producer_id, self.seq, KPI_KEY, payloads, stamps))
        offset = self.log.append(batch)
        self.seq += len(docs)
        return offset

    def close(self) -> None:
        """Flush what was appended to stable storage and close the files."""
        self.log.close()
