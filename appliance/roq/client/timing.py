"""When a message may reach its application: its expiry and its not-before time (TTL and delay).

A v2 record may carry `expires_at_us` and `not_before_us`, absolute µs since the Unix epoch on
the publisher's clock (docs/log-format.md §1). They are enforced by the reading client, the
last point before the application, against its own wall clock (docs/guarantees.md, "TTL and
delay"): the exchange and the log keep such records like any other, so retention frees them as
it frees the rest, whatever their times say.

Pure: the decisions only. The subscriber (fan-out) holds delayed records in a `DelayGate`; a
consumer (groups, request/response) asks its monitor to put them off (`Settle.defer`).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Generic, TypeVar

from roq.log import format as batchfmt

Item = TypeVar("Item")


def now_us() -> int:
    """This machine's wall clock, in the unit and epoch of the records' times."""
    return time.time_ns() // 1000


def expired(meta: batchfmt.RecordMeta | None, now: int) -> bool:
    """The record's expiry time has come: it is never handed to the application."""
    return meta is not None and meta.expires_at_us is not None and meta.expires_at_us <= now


def early_us(meta: batchfmt.RecordMeta | None, now: int) -> int:
    """How long before the record is due (µs); 0 when it is due now (or has no such time)."""
    if meta is None or meta.not_before_us is None:
        return 0
    return max(0, meta.not_before_us - now)


class DelayGate(Generic[Item]):
    """Fan-out's delay: a record not due yet is held, and with it every later record of its
    stream (producer and routing key: the stream roq orders), so a stream's order is kept and
    the other streams flow on. At most `held_max` records are held; `full` then asks the
    subscriber to take no more until some come due."""

    def __init__(self, held_max: int):
        self.held_max = held_max
        self.held = 0
        self._streams: dict[tuple[bytes, bytes], collections.deque[tuple[Item, int]]] = {}

    def offer(self, item: Item, record: batchfmt.Record, now: int) -> bool:
        """True: `item` may go on now. False: held (its time has not come, or its stream holds
        an earlier one)."""
        stream = (record.producer_id, record.key)
        waiting = self._streams.get(stream)
        if waiting is None:
            if not early_us(record.meta, now):
                return True
            waiting = self._streams[stream] = collections.deque()
        due = record.meta.not_before_us if record.meta is not None else None
        waiting.append((item, due or 0))
        self.held += 1
        return False

    def release(self, now: int) -> list[Item]:
        """The held items now due, each stream's in its order (a stream stops at its first item
        not due)."""
        out: list[Item] = []
        for stream in list(self._streams):
            waiting = self._streams[stream]
            while waiting and waiting[0][1] <= now:
                out.append(waiting.popleft()[0])
            if not waiting:
                del self._streams[stream]
        self.held -= len(out)
        return out

    def next_due(self) -> int | None:
        """When the next held item comes due (µs since the epoch); None if nothing is held."""
        return min((waiting[0][1] for waiting in self._streams.values()), default=None)

    @property
    def full(self) -> bool:
        return self.held >= self.held_max

    def items(self) -> Iterator[Item]:
        """Every held item (for a resume position before them)."""
        for waiting in self._streams.values():
            for item, _ in waiting:
                yield item
