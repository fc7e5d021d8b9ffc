"""Serves reads of an exchange's message log on its port F+3 (replay, catch-up, seek by time).

Subscribers that start from the beginning, an offset or a time, that fell behind the live stream
(ZeroMQ dropped batches past `exchange.subscriber.hwm`), or that resume after a restart read
here at their own pace: the exchange never buffers for them. One request gets exactly one reply
of at most `dataplane.READ_BYTES_MAX` bytes (and at least one whole batch), so a reader bounds
the exchange's work per request. A batch damaged on disk (its CRC fails) is skipped: the reply
holds no data and a `next_offset` past the damage, so no reader is stuck on it. Runs in the
exchange's main thread, which owns the socket.
"""

from __future__ import annotations

import logging
from typing import Any

from roq import limits, replication
from roq.errors import CorruptRecord, InvalidOffset, LogError, ProtocolError
from roq.log import Log, ReadStatus
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.replication import ReplicaStore
from roq.transport import drained, security

log = logging.getLogger(__name__)


class LogServer:
    def __init__(self, sock: Any, message_log: Log, name: str, copies: ReplicaStore):
        self.sock, self.log, self.name, self.copies = sock, message_log, name, copies
        self.reads = 0

    def pump(self) -> None:
        """Answer what is waiting: log reads, and replication writes from leaders."""
        # Zero-copy receive for the sender's principal (replication is the cluster's alone).
        for received in drained(self.sock, limits.log_server_burst_requests, copy=False):
            peer, body = received[0].bytes, [frame.bytes for frame in received[1:]]
            if body and body[0] in replication.KINDS:
                refused = self._not_cluster(body, received[-1])
                self.sock.send_multipart([peer, *(refused or self._replicate(body))])
            else:
                self.sock.send_multipart([peer, *self._answer(body)])

    def _not_cluster(self, frames: list[bytes], last: Any) -> list[bytes] | None:
        """The refusal of a replication frame not sent by one of the cluster's own processes."""
        sender = security.principal_of(last)
        if sender is not None and sender.superuser:
            return None
        who = sender.name if sender else "a revoked principal"
        why = f"principal {who} lacks the cluster role that replication needs"
        log.warning("%s: refused a replication write: %s", self.name, why)
        leader = frames[1][: limits.replication_leader_id_bytes_max] if len(frames) > 1 else b""
        return [replication.WRITTEN, leader, replication.FAILED, b"\0" * 8, why.encode()]

    def _replicate(self, frames: list[bytes]) -> list[bytes]:
        try:
            return self.copies.handle(frames)
        except (ProtocolError, InvalidOffset, CorruptRecord, LogError) as error:
            log.warning("%s: refused a replication write: %s", self.name, error)
            leader = frames[1][: limits.replication_leader_id_bytes_max] if len(frames) > 1 else b""
            reason = str(error)[: limits.replication_refusal_chars_max].encode()
            return [replication.WRITTEN, leader, replication.FAILED, b"\0" * 8, reason]

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        start, end = self.log.start_offset, self.log.end_offset
        try:
            request = dataplane.parse_read_request(frames)
            source = self._source(request.leader)
            start, end = source.start_offset, source.end_offset
            if request.kind == dataplane.POSITION:
                return dataplane.read_reply(dataplane.READ_NOTHING_YET, end, start, end, b"")
            if request.kind == dataplane.SEEK_TIME:
                offset = self._seek(source, request.timestamp_us)
                return dataplane.read_reply(dataplane.READ_NOTHING_YET, offset, start, end, b"")
            return self._read(source, request.offset, request.max_bytes)
        except (ProtocolError, InvalidOffset, CorruptRecord, LogError) as error:
            log.warning("%s: refused a log read: %s", self.name, error)
            return dataplane.read_reply(dataplane.READ_ERROR, 0, start, end, str(error).encode())

    def _source(self, leader: str) -> Log:
        """This exchange's own log, or its copy of `leader`'s (same offsets: a dead leader's
        log is replayed from here)."""
        if leader and leader != self.copies.own_id:
            return self.copies.copy(leader)
        return self.log

    def _read(self, source: Log, offset: int, max_bytes: int) -> list[bytes]:
        self.reads += 1
        try:
            result = source.read(offset, max_bytes)
        except CorruptRecord as error:
            resume = source.next_sound_batch(offset)
            log.error("%s: %s: offsets %d..%d are damaged (%s); readers skip them",
                      self.name, source.name, offset, resume, error)  # fmt: skip
            start, end = source.start_offset, source.end_offset
            return dataplane.read_reply(dataplane.READ_BATCHES, resume, start, end, b"")
        status = {
            ReadStatus.BATCHES: dataplane.READ_BATCHES,
            ReadStatus.NO_MESSAGE_YET: dataplane.READ_NOTHING_YET,
            ReadStatus.EVICTED: dataplane.READ_EVICTED,
        }[result.status]
        return dataplane.read_reply(
            status, result.next_offset, result.start_offset, result.end_offset, result.data
        )

    @staticmethod
    def _seek(source: Log, timestamp_us: int) -> int:
        """The offset of the first batch whose first record is at or after `timestamp_us`
        (the end if none is). Segment heads are read newest first, so a seek for a recent time
        (a subscriber joining an exchange that appeared after it started) touches one or two
        segments; the scan then goes forward from the newest segment that starts before T.
        Timestamps are taken to grow with offsets across segments (producers' clocks agree)."""
        offset = _newest_segment_before(source, timestamp_us)
        for _ in range(limits.log_seek_reads_max):
            result = source.read(offset, dataplane.READ_BYTES_MAX)
            if result.status is not ReadStatus.BATCHES:
                return result.next_offset if result.status is ReadStatus.EVICTED else offset
            for position, header in batchfmt.iter_batches(result.data):
                if header.first_ts_us >= timestamp_us:
                    return offset + position
            offset = result.next_offset
        return source.end_offset


def _newest_segment_before(source: Log, timestamp_us: int) -> int:
    """The base of the newest segment whose first batch is older than `timestamp_us`, or the
    log's start when there is none."""
    for segment in reversed(source.segments):
        if segment.end == segment.base:
            continue  # empty
        head = source.read(segment.base, 1)  # answers one whole batch at least
        if head.status is ReadStatus.BATCHES and (
            batchfmt.read_header(head.data).first_ts_us < timestamp_us
        ):
            return segment.base
    return source.start_offset
