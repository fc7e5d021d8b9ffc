"""One exchange as a subscriber sees it: its live stream and, behind it, its message log.

Every batch an exchange forwards carries its log offset (its byte position in that exchange's
log), so a feed knows exactly where it is. A live batch that starts where the feed expects is
delivered; one that starts before it is a duplicate; one that starts after it reveals a gap
(ZeroMQ dropped batches this subscriber did not read fast enough, or the subscriber started in the
past). A gap, or a start from the beginning / an offset / a time, puts the feed in catch-up: it
reads the log on the exchange's port F+3, one bounded request at a time, delivering whole batches
in offset order, and ignores the live stream until a read answers "nothing yet", at which point
it has caught up and takes the live stream again. Offsets make this exact: nothing is skipped
and nothing delivered twice (the sequencer still orders streams that moved between exchanges).

Key filtering. Offsets are only contiguous in the whole stream, so a feed on a logged exchange
subscribes to everything and filters by key prefix itself (one `startswith` per batch); the
price is that a narrow subscriber receives the exchange's whole stream. Exchanges without a log
(`useLog=false`) stamp no offsets: their feeds let ZeroMQ filter by prefix and deliver the live
stream as it comes (RoQ's at-most-once).

Owned by the subscriber's thread, like every socket here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from roq import limits
from roq.errors import CorruptRecord, ProtocolError
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.transport import NOBLOCK, Kind, WouldBlock, connect, open_socket

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = limits.request_timeout_ms / 1000
LOG_PORT_OFFSET = 2  # F+3 is back (F+1) + 2


class Feed:
    def __init__(
        self, context: Any, exchange_id: str, back: str, key: bytes, hwm: int, logged: bool
    ):
        self.exchange_id, self.back, self.logged, self.key = exchange_id, back, logged, key
        self.live = open_socket(context, Kind.SUB, rcvhwm=hwm, subscribe=b"" if logged else key)
        connect(self.live, back)
        self._context = context
        self.reader: Any = None
        self.next_offset: int | None = None  # None: take the live stream wherever it is
        self.catching_up = False
        self.evicted_bytes = 0
        self.read_batches = 0
        self._read_sent = 0.0
        self._pending = False
        self._seeking = False

    # --- positioning ---------------------------------------------------------------------------
    def start_at(self, offset: int) -> None:
        """Deliver from `offset` of this exchange's log (0 = the beginning)."""
        if not self.logged:
            log.warning("exchange %s keeps no log: starting from now", self.exchange_id)
            return
        self.next_offset = offset
        self._catch_up()

    def seek_time(self, timestamp_us: int) -> None:
        if not self.logged:
            return
        self.catching_up = self._seeking = True
        self._request(dataplane.seek_request(timestamp_us))

    # --- live stream ---------------------------------------------------------------------------
    def receive(self, burst: int) -> Iterator[tuple[batchfmt.BatchHeader, memoryview]]:
        """Live batches to deliver, in offset order (gaps switch to reading the log)."""
        for _ in range(burst):
            try:
                frames = self.live.recv_multipart(NOBLOCK, copy=False)
            except WouldBlock:
                return
            if len(frames) != 2:
                continue
            batch = frames[1].buffer
            try:
                header = batchfmt.read_header(batch)
            except CorruptRecord as error:
                log.warning("exchange %s: dropped a bad batch: %s", self.exchange_id, error)
                continue
            if self._admit_live(header) and header.key.startswith(self.key):
                yield header, batch

    def _admit_live(self, header: batchfmt.BatchHeader) -> bool:
        if not self.logged:
            return True
        if self.catching_up:
            return False  # the log read will reach it
        offset = header.base_offset
        if self.next_offset is None or offset == self.next_offset:
            self.next_offset = offset + header.size
            return True
        if offset < self.next_offset:
            return False  # already delivered
        log.info(
            "exchange %s: gap at offset %d (next live batch at %d): reading the log",
            self.exchange_id, self.next_offset, offset,
        )  # fmt: skip
        self._catch_up()
        return False

    # --- catch-up from the log -----------------------------------------------------------------
    def _catch_up(self) -> None:
        self.catching_up = True
        if not self._pending:
            assert self.next_offset is not None
            self._request(dataplane.read_request(self.next_offset))

    def _request(self, frames: list[bytes]) -> None:
        if self.reader is None:
            host, _, port = self.back.rpartition(":")
            self.reader = open_socket(self._context, Kind.DEALER, sndhwm=10, rcvhwm=10)
            connect(self.reader, f"{host}:{int(port) + LOG_PORT_OFFSET}")
        self.reader.send_multipart(frames, NOBLOCK)
        self._pending = True
        self._read_sent = time.monotonic()

    def on_reply(self) -> list[tuple[batchfmt.BatchHeader, memoryview]]:
        """Handle one log reply; the batches it delivers, in order."""
        try:
            reply = dataplane.parse_read_reply(self.reader.recv_multipart(NOBLOCK))
        except (WouldBlock, ProtocolError) as error:
            log.warning("exchange %s: bad log reply: %s", self.exchange_id, error)
            return []
        self._pending = False
        if self._seeking and reply.status != dataplane.READ_ERROR:
            self._seeking = False
            self.next_offset = reply.next_offset  # the first batch at or after the time
            self._catch_up()
            return []
        if reply.status == dataplane.READ_ERROR:
            log.error("exchange %s: log read refused: %s", self.exchange_id, reply.data[:200])
            self.catching_up = False  # take the live stream rather than retry a bad offset
            return []
        if reply.status == dataplane.READ_EVICTED:
            self.evicted_bytes += reply.next_offset - (self.next_offset or 0)
            log.warning("exchange %s: offsets below %d were evicted by retention",
                        self.exchange_id, reply.next_offset)  # fmt: skip
        self.next_offset = reply.next_offset
        if reply.status == dataplane.READ_NOTHING_YET:
            self.catching_up = False  # caught up: the live stream continues from here
            return []
        return list(self._split(reply.data))  # the subscriber asks for more (`read_more`)

    @property
    def reading(self) -> bool:
        """A log read is in flight."""
        return self._pending

    def wants_more(self) -> bool:
        return self.catching_up and not self._pending and self.next_offset is not None

    def read_more(self) -> None:
        self._catch_up()

    def _split(self, data: bytes) -> Iterator[tuple[batchfmt.BatchHeader, memoryview]]:
        view = memoryview(data)
        for position, header in batchfmt.iter_batches(view):
            self.read_batches += 1
            if header.key.startswith(self.key):
                yield header, view[position : position + header.size]

    def check_timeout(self, now: float) -> None:
        """A log read unanswered for too long (exchange dead or restarting): ask again."""
        if self._pending and now - self._read_sent > _READ_TIMEOUT_S:
            self.reader.close(0)
            self.reader = None
            self._pending = False
            if self.catching_up and self.next_offset is not None:
                self._catch_up()

    def close(self) -> None:
        self.live.close(0)
        if self.reader is not None:
            self.reader.close(0)
