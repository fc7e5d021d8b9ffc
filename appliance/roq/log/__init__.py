"""The message log (the thesis's Message Logging System). Standard library only (and bson, for
`statelog`'s records): no sockets, no ZooKeeper. `format` is the one place that packs and
unpacks log bytes; `segment` owns one file, `memory` the ring of recent batches, `log` the whole
log of one exchange, `statelog` a keyed state kept as a compacted log (imported by name)."""

from roq.log.log import (
    FlushPolicy,
    Log,
    LogSettings,
    ReadResult,
    ReadStatus,
    Retention,
    is_retired,
    log_directory,
    mark_retired,
    replica_directory,
    replica_root,
    state_directory,
    state_root,
)
from roq.log.memory import MemoryLog
from roq.log.segment import Segment, SegmentCorrupt, parse_segment_name, segment_name

__all__ = [
    "FlushPolicy",
    "Log",
    "LogSettings",
    "MemoryLog",
    "ReadResult",
    "ReadStatus",
    "Retention",
    "Segment",
    "SegmentCorrupt",
    "is_retired",
    "log_directory",
    "mark_retired",
    "parse_segment_name",
    "replica_directory",
    "replica_root",
    "segment_name",
    "state_directory",
    "state_root",
]
