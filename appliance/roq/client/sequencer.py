"""Per-stream order and de-duplication on the subscriber side.

A stream is (producer id, routing key); its records carry consecutive sequence numbers from 0.
Batches of one stream can arrive out of order when its publisher moved between exchanges (the
two exchanges' connections race) and twice when a publisher re-sent unconfirmed batches after a
fail-over. The sequencer delivers each stream's records in sequence order, exactly once:

* a batch that continues the stream is delivered, then any held batches it unblocks;
* a batch wholly seen before is dropped (a duplicate); one that overlaps is delivered from its
  first unseen record (`skip`);
* a batch ahead of the stream is held (bounded: `limits.subscriber_reorder_batches_max`) until the
  gap fills, or for at most `gap_wait_s`; then the gap is counted as lost and delivery goes on.

A source that can read a batch again (a feed on a logged exchange: it knows the batch's offset)
asks `refuses` before it offers: a batch that would be held past `held_per_source` batches of
that source, or past `held_max` in all, is refused, and the feed reads it again from its log
once `progress` moved (something was delivered or given up since). Such a source never makes
the sequencer skip a gap for want of room: a replay from the beginning whose first log read
answered thousands of batches of a stream's later part, before another exchange's log gave its
beginning, once lost that beginning so (the held total overflowed and the gap was skipped at
once). No feed waits for nothing: the earliest undelivered batch in time is deliverable (what
came before it in its stream was appended earlier), so its feed is never refused for it.

A corrupt batch (its records cannot be read, `corrupt=True`) takes its place in the stream like
any other, but when its turn comes its records are counted in `corrupt` instead of delivered:
the stream goes on at once rather than wait `gap_wait_s` for records that will never be readable.

The first batch seen of a stream starts it wherever it starts (a subscriber joins "now"), unless
`from_start` is set (a replay from the beginning): then every stream starts at sequence 0, so a
stream whose later part happens to arrive first (another exchange's log answered sooner) waits
for its beginning.
Pure and single-threaded: the subscriber's thread owns it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from roq import limits
from roq.log.format import BatchHeader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    header: BatchHeader
    batch: memoryview | bytes
    skip: int = 0  # leading records already delivered before (an overlapping re-send)
    source: object = None  # where it came from (a feed): the subscriber throttles by it
    corrupt: bool = False  # its records cannot be read: skipped and counted, never delivered


@dataclass
class _Stream:
    next_seq: int
    held: list[tuple[int, int, Delivery]] = field(default_factory=list)  # heap by first_seq
    waiting_since: float = 0.0


class Sequencer:
    def __init__(
        self,
        gap_wait_s: float = limits.subscriber_gap_wait_ms / 1000,
        held_max: int = limits.subscriber_reorder_batches_max,
        streams_max: int = limits.subscriber_streams_max,
        from_start: bool = False,
        held_per_source: int = limits.subscriber_held_per_feed_max,
    ):
        self.from_start = from_start
        self.gap_wait_s, self.held_max, self.streams_max = gap_wait_s, held_max, streams_max
        self.held_per_source = held_per_source
        self.progress = 0  # counts deliveries and gaps given up: a refused source reads again
        self.streams: dict[tuple[bytes, bytes], _Stream] = {}
        self.held = 0
        self.duplicates = 0  # records dropped as already delivered
        self.lost = 0  # records never seen after their gap timed out
        self.corrupt = 0  # records skipped because their batch was corrupt
        self.gaps = 0
        self.held_by_source: dict[object, int] = {}
        # sources whose log evicted records: the streams already offered since (see forgive)
        self._forgiving: dict[object, set[tuple[bytes, bytes]]] = {}
        self._tie = 0

    def resume(self, producer_id: bytes, key: bytes, next_seq: int) -> None:
        """Continue a stream from a committed position (records before it are duplicates)."""
        self.streams[(producer_id, key)] = _Stream(next_seq)

    def forgive(self, source: object) -> None:
        """`source` (a feed) read past records its log had evicted: the next batch it offers of
        each stream may follow a gap that nothing will fill, so that gap is counted as lost at
        once instead of held for gap_wait_s. Waiting there stalled a subscriber chasing
        retention for 2 s per eviction. Ends with `forget`."""
        self._forgiving[source] = set()

    def forget(self, source: object) -> None:
        self._forgiving.pop(source, None)

    def offer(
        self,
        header: BatchHeader,
        batch: memoryview | bytes,
        now: float,
        source: object = None,
        corrupt: bool = False,
    ) -> list[Delivery]:
        key = (header.producer_id, header.key)
        stream = self.streams.get(key)
        if stream is None:
            if len(self.streams) >= self.streams_max:
                self.streams.clear()  # bounded memory beats perfect dedupe of ancient streams
            stream = self.streams[key] = _Stream(0 if self.from_start else header.first_seq)
        if header.first_seq > stream.next_seq and self._forgiven(source, key):
            self._lose_until(key, stream, header.first_seq, "evicted by retention")
        delivery = Delivery(header, batch, 0, source, corrupt)
        if header.first_seq > stream.next_seq:
            return self._hold(stream, delivery, now)
        out: list[Delivery] = []
        self._deliver(stream, delivery, out)
        self._release(stream, out)
        return out

    def refuses(self, header: BatchHeader, source: object) -> bool:
        """Whether `offer` would hold this batch past the bounds (see the module's docstring):
        the caller then offers neither it nor what follows it, and reads them again later."""
        if self.held < self.held_max and self.held_by_source.get(source, 0) < self.held_per_source:
            return False
        stream = self.streams.get((header.producer_id, header.key))
        if stream is None:
            next_seq = 0 if self.from_start else header.first_seq
        else:
            next_seq = stream.next_seq
        if header.first_seq <= next_seq:
            return False  # delivered (or dropped) at once, never held
        seen = self._forgiving.get(source)
        return seen is None or (header.producer_id, header.key) in seen

    def held_offsets(self) -> Iterator[tuple[object, int]]:
        """(source, log offset) of every batch held for a gap: read, not yet delivered."""
        for stream in self.streams.values():
            for _, _, delivery in stream.held:
                yield delivery.source, delivery.header.base_offset

    def _forgiven(self, source: object, key: tuple[bytes, bytes]) -> bool:
        """Whether this is the stream's first batch from a forgiving source (once per stream)."""
        seen = self._forgiving.get(source)
        if seen is None or key in seen:
            return False
        if len(seen) < self.streams_max:
            seen.add(key)
        return True

    def expire(self, now: float) -> list[Delivery]:
        """Give up on gaps older than gap_wait_s (call this from the poll loop)."""
        out: list[Delivery] = []
        for key, stream in self.streams.items():
            if stream.held and now - stream.waiting_since >= self.gap_wait_s:
                self._skip_gap(key, stream, f"not filled within {self.gap_wait_s:g} s")
                self._release(stream, out)
                stream.waiting_since = now
        return out

    def _hold(self, stream: _Stream, delivery: Delivery, now: float) -> list[Delivery]:
        if not stream.held:
            stream.waiting_since = now
        self._tie += 1
        heapq.heappush(stream.held, (delivery.header.first_seq, self._tie, delivery))
        self.held += 1
        source = delivery.source
        self.held_by_source[source] = self.held_by_source.get(source, 0) + 1
        if self.held <= self.held_max:
            return []
        out: list[Delivery] = []  # over the bound: stop waiting for this stream's gap
        key = (delivery.header.producer_id, delivery.header.key)
        self._skip_gap(key, stream, f"more than {self.held_max} batches held")
        self._release(stream, out)
        return out

    def _skip_gap(self, key: tuple[bytes, bytes], stream: _Stream, why: str) -> None:
        if stream.held[0][0] > stream.next_seq:
            self._lose_until(key, stream, stream.held[0][0], why)

    def _lose_until(self, key: tuple[bytes, bytes], stream: _Stream, seq: int, why: str) -> None:
        """Records before `seq` will never come: count them lost and go on from `seq`."""
        log.warning("producer %s, key %r: records %d..%d given up (%s)",
                    key[0].hex(), key[1], stream.next_seq, seq - 1, why)  # fmt: skip
        self.lost += seq - stream.next_seq
        self.gaps += 1
        self.progress += 1
        stream.next_seq = seq

    def _release(self, stream: _Stream, out: list[Delivery]) -> None:
        while stream.held and stream.held[0][0] <= stream.next_seq:
            _, _, delivery = heapq.heappop(stream.held)
            self.held -= 1
            self.held_by_source[delivery.source] -= 1
            self._deliver(stream, delivery, out)

    def _deliver(self, stream: _Stream, delivery: Delivery, out: list[Delivery]) -> None:
        header = delivery.header
        last = header.first_seq + header.count - 1
        if last < stream.next_seq:
            self.duplicates += header.count
            return
        skip = stream.next_seq - header.first_seq
        stream.next_seq = last + 1
        self.progress += 1
        if skip > 0:
            self.duplicates += skip
        if delivery.corrupt:
            self.corrupt += header.count - max(skip, 0)
            return
        if skip > 0:
            delivery = Delivery(header, delivery.batch, skip, delivery.source)
        out.append(delivery)
