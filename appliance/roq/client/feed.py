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

Dead exchanges. When the exchange that owns a log is dead, the monitor names the live exchanges
that hold a copy of it (same bytes, same offsets). `use_copies` points the feed's log reads at
the best copy, with the owner's id as the extra `leader` frame, and the feed reads on from where
it stands to the copy's end; there is no live stream to take after that. `use_owner` switches
back when the exchange returns. A copy that refuses or does not answer gives way to the next.

Silence. A feed that heard nothing from its exchange for `subscriber_idle_probe_ms` asks its log
where it ends (`P`): the answer proves the exchange alive and reveals a tail the live stream
dropped; no answer within `request_timeout_ms` marks the feed `silent`, so an exchange that stops
answering is noticed within their sum even when nothing is being published.

Key filtering. Offsets are only contiguous in the whole stream, so a feed on a logged exchange
subscribes to everything and filters by key prefix itself (one `startswith` per batch); the
price is that a narrow subscriber receives the exchange's whole stream. Exchanges without a log
(`useLog=false`) stamp no offsets: their feeds let ZeroMQ filter by prefix and deliver the live
stream as it comes (RoQ's at-most-once).

Corrupt batches. A batch whose records do not fill it (damage on disk that left its CRC right,
or an exchange that did not check records) is still framed by its sound header: the feed hands
it on marked unsound, and the sequencer skips its records and counts them, so the stream goes on
at once. Bytes that cannot be framed at all are skipped and counted in `skipped_bytes`: a log
damaged on disk (the exchange answers with a `next_offset` past the damage), or a CRC mismatch in
a reply (the rest of that reply).

Owned by the subscriber's thread, like every socket here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from roq import limits
from roq.errors import CorruptRecord, ProtocolError, TransportError
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.ports import ExchangePort, sibling
from roq.transport import Kind, connect, drained, open_socket, recv_nowait, send_nowait

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = limits.request_timeout_ms / 1000
_IDLE_S = limits.subscriber_idle_probe_ms / 1000

# (header, batch, sound): `sound` is False for a batch whose records cannot be read
Taken = tuple[batchfmt.BatchHeader, memoryview, bool]


class Feed:
    def __init__(
        self, context: Any, exchange_id: str, back: str, key: bytes, hwm: int, logged: bool
    ):
        self.exchange_id, self.back, self.logged, self.key = exchange_id, back, logged, key
        self._hwm = hwm
        self.live = open_socket(context, Kind.SUB, rcvhwm=hwm, subscribe=b"" if logged else key)
        if back:  # "": a dead exchange known only by the copies of its log
            connect(self.live, back)
        self._context = context
        self.reader: Any = None
        self.next_offset: int | None = None  # None: take the live stream wherever it is
        self.catching_up = False
        self.evicted_bytes = 0
        self.read_batches = 0
        self.corrupt_batches = 0  # framed, but their records cannot be read (skipped)
        self.skipped_bytes = 0  # could not be framed at all (skipped)
        self.copies: list[str] = []  # log endpoints of replicas to read from; []: the owner
        self.live_paused = False  # far behind: the live socket is not connected (see _on_read)
        self.evicted_since_offer = False
        self.pauses = 0
        self.tails_found = 0  # idle probes that found the log past us (a dropped tail read)
        self.silent = False  # the log server did not answer in time (cleared by any answer)
        self._read_sent = 0.0
        self._heard = time.monotonic()
        self._pending = False
        self._seeking = False
        self._probing = False
        self._last_request: list[bytes] = []
        self._probed_at: int | None = None  # next_offset when the last probe was sent
        self.refusals = 0  # batches the sequencer had no room for, read again later (rewind)
        self._refused_at = -1  # the sequencer's progress when it last refused a batch

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

    # --- where the log is read -----------------------------------------------------------------
    def use_copies(self, copies: list[tuple[str, int]]) -> None:
        """The owner is dead: read its log from these replicas [(tcp://ip:F+3, copy end)], the
        longest copy first. Called again with every list: keeps the replica it is reading."""
        if not copies:
            return
        endpoints = [endpoint for endpoint, _ in copies]
        current = self.copies[0] if self.copies else None
        was_on_copy = bool(self.copies)
        keep = [e for e in endpoints if e == current]
        self.copies = keep + [e for e in endpoints if e != current]
        if not was_on_copy:
            log.info("exchange %s is gone: reading its log from the copy at %s",
                     self.exchange_id, self.copies[0])  # fmt: skip
            self._switch_source()
        elif self._idle() and self._behind(max(end for _, end in copies)):
            self._catch_up()  # a longer copy than the one read to its end, or a retry

    def use_owner(self, back: str) -> None:
        """The exchange is back (at `back`): read its own log and live stream again."""
        if back != self.back:
            self.live.close(0)
            self.live = open_socket(self._context, Kind.SUB, rcvhwm=self._hwm, subscribe=b"")
            connect(self.live, back)
            self.back, self.live_paused = back, False
        if self.copies:
            log.info("exchange %s is back: reading its own log", self.exchange_id)
            self.copies = []
            self._switch_source()

    def _switch_source(self) -> None:
        """Re-send what was in flight to the new source, or read on from where the feed is."""
        self._close_reader()
        self._probing = False
        if self._seeking:
            self._request(self._last_request)
        elif self.next_offset is not None:
            self._catch_up()

    def _behind(self, end: int) -> bool:
        return self.next_offset is not None and self.next_offset < end

    def _idle(self) -> bool:
        return not self._pending and not self.catching_up

    # --- live stream ---------------------------------------------------------------------------
    def receive(self, burst: int) -> Iterator[Taken]:
        """Live batches to deliver, in offset order (gaps switch to reading the log)."""
        for frames in drained(self.live, burst, copy=False):
            self._heard = time.monotonic()
            if len(frames) != 2:
                continue
            batch = frames[1].buffer
            try:
                header = batchfmt.read_header(batch)
            except CorruptRecord as error:
                log.warning("exchange %s: dropped a bad batch: %s", self.exchange_id, error)
                continue
            if self._admit_live(header) and header.key.startswith(self.key):
                yield header, batch, self._sound(header, batch)

    def _admit_live(self, header: batchfmt.BatchHeader) -> bool:
        if not self.logged:
            return True
        if self.catching_up or self.copies:
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
        """Send one log request (to a copy, with the owner's id, when the owner is dead)."""
        if self.reader is None:
            self.reader = open_socket(
                self._context,
                Kind.DEALER,
                sndhwm=limits.log_reader_hwm,
                rcvhwm=limits.log_reader_hwm,
            )
            connect(self.reader, self._log_endpoint())
        self._last_request = frames
        leader = [self.exchange_id.encode()] if self.copies else []
        if not send_nowait(self.reader, [*frames, *leader]):  # a request or two wait at most
            raise TransportError(f"exchange {self.exchange_id}: the log request queue is full")
        self._pending = True
        self._read_sent = time.monotonic()

    def _log_endpoint(self) -> str:
        if self.copies:
            return self.copies[0]
        return sibling(self.back, ExchangePort.BACK, ExchangePort.LOG)

    def on_reply(self) -> list[Taken]:
        """Handle one log reply; the batches it delivers, in order."""
        frames = recv_nowait(self.reader)
        if frames is None:
            return []  # the poll's wake-up was not for a reply after all
        try:
            reply = dataplane.parse_read_reply(frames)
        except ProtocolError as error:
            log.warning("exchange %s: bad log reply: %s", self.exchange_id, error)
            return []
        self._pending, self.silent, self._heard = False, False, time.monotonic()
        if reply.status == dataplane.READ_ERROR:
            self._on_error(reply)
            return []
        if self._probing:
            self._on_position(reply.next_offset)
            return []
        if self._seeking:
            self._seeking = False
            self.next_offset = reply.next_offset  # the first batch at or after the time
            self._catch_up()
            return []
        return self._on_read(reply)

    def _on_read(self, reply: dataplane.ReadReply) -> list[Taken]:
        if reply.status == dataplane.READ_EVICTED:
            self.evicted_since_offer = True  # the subscriber tells its sequencer (forgive)
            self.evicted_bytes += reply.next_offset - (self.next_offset or 0)
            log.warning("exchange %s: offsets below %d were evicted by retention",
                        self.exchange_id, reply.next_offset)  # fmt: skip
        elif reply.status == dataplane.READ_BATCHES:
            self._note_damage(reply)
        self.next_offset = reply.next_offset
        if reply.status == dataplane.READ_NOTHING_YET:
            self.catching_up = False  # caught up: the live stream continues from here
            self._resume_live()
            if self.copies:
                log.info("exchange %s: read its copy to the end, offset %d",
                         self.exchange_id, reply.next_offset)  # fmt: skip
            return []
        if reply.end - reply.next_offset > limits.subscriber_live_pause_bytes:
            self._pause_live()
        return list(self._split(reply.data))  # the subscriber asks for more (`read_more`)

    def _note_damage(self, reply: dataplane.ReadReply) -> None:
        """The exchange skipped bytes of its log that are damaged: count them."""
        damaged = reply.next_offset - (self.next_offset or 0) - len(reply.data)
        if damaged > 0:
            self.skipped_bytes += damaged
            log.warning("exchange %s: its log is damaged before offset %d: %d bytes skipped",
                        self.exchange_id, reply.next_offset, damaged)  # fmt: skip

    def _pause_live(self) -> None:
        """Far behind the log's end: stop taking the live stream. Every live batch would be
        received only to be dropped (the log read will reach it), and receiving them took the
        time the catch-up needed: a subscriber behind a flat-out publisher never caught up."""
        if self.live_paused or not self.back:
            return
        log.info("exchange %s: more than %d MiB behind its log's end: live stream paused until "
                 "the log read catches up", self.exchange_id,
                 limits.subscriber_live_pause_bytes >> 20)  # fmt: skip
        self.live.close(0)
        self.live = open_socket(self._context, Kind.SUB, rcvhwm=self._hwm, subscribe=b"")
        self.live_paused = True
        self.pauses += 1

    def _resume_live(self) -> None:
        """Caught up: connect the live stream again. What it misses while connecting shows as
        a gap in the first live batch and is read from the log (a short catch-up)."""
        if self.live_paused:
            connect(self.live, self.back)
            self.live_paused = False

    def _on_error(self, reply: dataplane.ReadReply) -> None:
        reason = reply.data[:200].decode(errors="replace")
        if len(self.copies) > 1:  # another replica may hold the copy: ask it the same
            log.warning("exchange %s: the copy at %s refused: %s; trying %s",
                        self.exchange_id, self.copies[0], reason, self.copies[1])  # fmt: skip
            self.copies.append(self.copies.pop(0))
            self._close_reader()
            self._request(self._last_request)
            return
        log.error("exchange %s: log read refused: %s", self.exchange_id, reason)
        # Take the live stream rather than retry a bad request; a seek or probe is over too.
        self.catching_up = self._seeking = self._probing = False

    def _on_position(self, end: int) -> None:
        self._probing = False
        if self.next_offset is None or self.catching_up:
            return
        if end > self.next_offset:
            log.info("exchange %s: its log ends at %d, past %d: reading the missed tail",
                     self.exchange_id, end, self.next_offset)  # fmt: skip
            self.tails_found += 1
            self._catch_up()
        elif end < self.next_offset == self._probed_at:  # no live batch came since the probe
            log.warning("exchange %s: its log ends at %d, before %d (it lost a tail it never "
                        "confirmed): continuing from there", self.exchange_id, end,
                        self.next_offset)  # fmt: skip
            self.next_offset = end

    @property
    def reading(self) -> bool:
        """A log read (not a mere probe) is in flight."""
        return self._pending and not self._probing

    def wants_more(self, progress: int) -> bool:
        """Whether to read on: catching up, nothing in flight, and, after a refusal, once the
        sequencer's `progress` moved (reading before would only be refused again)."""
        return (
            self.catching_up
            and not self._pending
            and self.next_offset is not None
            and progress > self._refused_at
        )

    def rewind(self, offset: int, progress: int) -> None:
        """The subscriber could not take the batch at `offset` now (it would be held past the
        sequencer's bounds, waiting for another exchange's log): read the log from there
        again once the sequencer's progress passed `progress`. Live batches meanwhile are
        dropped as in any catch-up; the log gives them back."""
        self.next_offset = offset
        self.catching_up = True
        self._refused_at = progress
        self.refusals += 1

    def read_more(self) -> None:
        self._catch_up()

    def _split(self, data: bytes) -> Iterator[Taken]:
        view = memoryview(data)
        position = 0
        while position < len(view):
            try:
                header = batchfmt.check_batch(view, position)
            except CorruptRecord as error:  # no sound length: the rest cannot be framed
                self.skipped_bytes += len(view) - position
                log.warning("exchange %s: skipped %d bytes of a log read that cannot be read: %s",
                            self.exchange_id, len(view) - position, error)  # fmt: skip
                return
            self.read_batches += 1
            batch = view[position : position + header.size]
            if header.key.startswith(self.key):
                yield header, batch, self._sound(header, batch)
            position += header.size

    def _sound(self, header: batchfmt.BatchHeader, batch: memoryview) -> bool:
        """Whether the batch's records can be read; a corrupt one is counted and logged."""
        try:
            batchfmt.check_records(batch, header)
        except CorruptRecord as error:
            self.corrupt_batches += 1
            if self.corrupt_batches <= limits.subscriber_corrupt_logged_max:
                log.warning("exchange %s: skipping the %d records of a corrupt batch at offset %d "
                            "(producer %s, sequence %d..%d): %s", self.exchange_id, header.count,
                            header.base_offset, header.producer_id.hex(), header.first_seq,
                            header.last_seq, error)  # fmt: skip
            return False
        return True

    # --- timers --------------------------------------------------------------------------------
    def check_timeout(self, now: float) -> None:
        """A log request unanswered for too long (exchange dead, stopped or restarting): the feed
        is `silent`; ask again on a fresh connection, the next copy first if there is one."""
        if not self._pending or now - self._read_sent <= _READ_TIMEOUT_S:
            return
        if not self.silent:
            log.warning("exchange %s: its log at %s did not answer within %.0f s",
                        self.exchange_id, self._log_endpoint(), _READ_TIMEOUT_S)  # fmt: skip
        self.silent = True
        self._close_reader()
        if len(self.copies) > 1:
            self.copies.append(self.copies.pop(0))
        self._request(self._last_request)

    def check_idle(self, now: float) -> None:
        """Nothing heard for a while: ask the log where it ends (see the module's docstring)."""
        if self.logged and self._idle() and now - self._heard > _IDLE_S and not self.copies:
            self._probing, self._probed_at = True, self.next_offset
            self._request(dataplane.position_request())

    def _close_reader(self) -> None:
        if self.reader is not None:
            self.reader.close(0)
            self.reader = None
        self._pending = False

    def close(self) -> None:
        self.live.close(0)
        self._close_reader()
