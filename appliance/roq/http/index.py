"""The messages each topic keeps, as read from the logs: index -> message, the newest
maxQueueSize of each topic (the seed's fixed-size queue), and the gets waiting for them.

Owned by the event loop: the log consumers hand it batches with `call_soon_threadsafe`, so
no lock is taken and a waiting get is woken in the same loop turn. It is a view of the logs,
restored from the gateway's snapshot (snapshot.py) and the log read after it when the gateway
starts; nothing here is the record.
Its memory is the seed's own bound: maxQueueSize messages of at most maxMsgSize per topic.
Each message keeps where it was read (exchange id, log offset): the log before the oldest kept
message is needed by no topic, and retention may delete it (gateway.py `floors`). A message
keeps its meta (headers, id, expiry, not-before: at most `format.META_BYTES_MAX` more per
message); an expired one found by a get keeps its place and meta but drops its text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from roq import limits

# the message (None: withheld as expired, `withhold`), the exchange it was read from, its batch's
# offset, its meta (records.py; b"": none)
Kept = tuple[str | None, str, int, bytes]
Item = tuple[str, int, str, str, int, bytes]  # topic, index, message, exchange id, offset, meta


class TopicIndex:
    def __init__(self, max_queue_size: int):
        self.max_queue_size = max_queue_size
        self.messages: dict[str, dict[int, Kept]] = {}
        self.newest: dict[str, int] = {}
        self.count = 0  # messages held, all topics
        self._waiters: dict[str, list[tuple[int, bool, asyncio.Future[None]]]] = {}
        self._parked = 0

    def add(self, items: Iterable[Item]) -> None:
        touched: set[str] = set()
        for topic, index, message, origin, offset, meta in items:
            newest = max(self.newest.get(topic, 0), index)
            if index <= newest - self.max_queue_size:
                continue  # already evicted by newer messages
            kept = self.messages.setdefault(topic, {})
            if index not in kept:
                self.count += 1
            kept[index] = (message, origin, offset, meta)
            self.newest[topic] = newest
            self._evict(kept, newest)
            touched.add(topic)
        for topic in touched & self._waiters.keys():
            self._wake(topic)

    def _evict(self, kept: dict[int, Kept], newest: int) -> None:
        floor = newest - self.max_queue_size
        while len(kept) > self.max_queue_size or (kept and next(iter(kept)) <= floor):
            # insertion order is index order but for messages of racing gateways; any index
            # at or below the floor goes, and the count bound holds whatever the order
            del kept[next(iter(kept))]
            self.count -= 1

    def export(self, topics: Iterable[str]) -> dict[str, list[tuple[int, Kept]]]:
        """The messages these topics keep (for the snapshot), oldest first."""
        found = ((topic, self.messages.get(topic)) for topic in topics)
        return {topic: sorted(kept.items()) for topic, kept in found if kept}

    def lookup(self, topic: str, index: int) -> Kept | None:
        kept = self.messages.get(topic)
        return None if kept is None else kept.get(index)

    def withhold(self, topic: str, index: int) -> bool:
        """Drop an expired message's text, keep its place and meta (a get still answers for its
        index): True the first time, so that each expired message is counted once."""
        kept = self.messages.get(topic, {})
        found = kept.get(index)
        if found is None or found[0] is None:
            return False
        kept[index] = (None, *found[1:])
        return True

    def _arrived(self, topic: str, index: int, exact: bool) -> bool:
        if exact:
            return index in self.messages.get(topic, {})
        return self.newest.get(topic, 0) >= index

    async def wait_for(
        self, topic: str, index: int, timeout_s: float, *, exact: bool = False
    ) -> bool:
        """Wait until a message with this index or a later one (`exact`: this one) arrives for
        the topic, or has: True, or False after `timeout_s`."""
        if self._arrived(topic, index, exact):
            return True
        if timeout_s <= 0 or self._parked >= limits.http_waiters_max:
            return False
        waiter = (index, exact, asyncio.get_running_loop().create_future())
        waiters = self._waiters.setdefault(topic, [])
        waiters.append(waiter)
        self._parked += 1
        try:
            await asyncio.wait_for(waiter[2], timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._parked -= 1
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiters.get(topic) is waiters:
                del self._waiters[topic]

    def _wake(self, topic: str) -> None:
        for index, exact, future in self._waiters.get(topic, []):
            if not future.done() and self._arrived(topic, index, exact):
                future.set_result(None)
