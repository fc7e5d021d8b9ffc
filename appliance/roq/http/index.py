"""The messages each topic keeps, as read from the logs: index -> where the message is, the newest
maxQueueSize of each topic (the seed's fixed-size queue), the text of as many of them as
`http.cache.bytes` allows, and the gets waiting for them.

Owned by the event loop: the log consumers hand it batches with `call_soon_threadsafe`, so
no lock is taken and a waiting get is woken in the same loop turn. It is a view of the logs,
restored from the gateway's snapshot (snapshot.py) and the log read after it when the gateway
starts; nothing here is the record.

Memory (issue 34, seed 002: the seed's own bound, maxTopics x maxQueueSize x maxMsgSize, is
12.8 TB at its defaults). Every kept message has a place: its exchange and its batch's log
offset (a tuple of about 100 bytes with its dictionary slot). Its text and meta are held in
`Held`, bounded in bytes: past `http.cache.bytes` the least recently used go (the newest
messages come in, a get brings back what it read), and a get of a message not held reads its
batch back from the log (gateway.py). The log before the oldest kept message is needed by no
topic, and retention may delete it (gateway.py `floors`). An expired message found by a get
keeps its place but never its text again (`withhold`).
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Iterable

from roq import limits

# the message (None: withheld as expired, `withhold`), the exchange it was read from, its batch's
# offset, its meta (records.py; b"": none)
Kept = tuple[str | None, str, int, bytes]
# topic, index, message (None: not held, read back from the log), exchange id, offset, meta
Item = tuple[str, int, str | None, str, int, bytes]
# where a kept message is: its exchange, its batch's offset, withheld (found expired)
Place = tuple[str, int, bool]

# a held message's cost beyond its text and meta: its OrderedDict node and its key (a tuple of
# the topic and an int), measured with sys.getsizeof on CPython 3.11
ENTRY_BYTES = 160


class Held:
    """The text and meta of messages, least recently used first, at most `bound` bytes of
    memory (sys.getsizeof of each, plus `ENTRY_BYTES`); 0 holds nothing."""

    def __init__(self, bound: int):
        self.bound = bound
        self.entries: OrderedDict[tuple[str, int], tuple[str | None, bytes]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0  # messages let go to stay within the bound (read back when asked)

    @staticmethod
    def size(text: str | None, meta: bytes) -> int:
        return ENTRY_BYTES + (0 if text is None else sys.getsizeof(text)) + sys.getsizeof(meta)

    def put(self, key: tuple[str, int], text: str | None, meta: bytes) -> None:
        self.drop(key)
        size = self.size(text, meta)
        if size > self.bound:
            return  # larger than all of it: never held
        self.entries[key] = (text, meta)
        self.bytes += size
        while self.bytes > self.bound:
            _, (old_text, old_meta) = self.entries.popitem(last=False)
            self.bytes -= self.size(old_text, old_meta)
            self.evictions += 1

    def get(self, key: tuple[str, int]) -> tuple[str | None, bytes] | None:
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
        return found

    def drop(self, key: tuple[str, int]) -> None:
        found = self.entries.pop(key, None)
        if found is not None:
            self.bytes -= self.size(*found)


class TopicIndex:
    def __init__(self, max_queue_size: int, held_bytes: int):
        self.max_queue_size = max_queue_size
        self.messages: dict[str, dict[int, Place]] = {}
        self.held = Held(held_bytes)
        self.newest: dict[str, int] = {}
        self.count = 0  # messages kept, all topics
        self._waiters: dict[str, list[tuple[int, bool, asyncio.Future[None]]]] = {}
        self._parked = 0

    def add(self, items: Iterable[Item]) -> None:
        touched: set[str] = set()
        for topic, index, message, origin, offset, meta in items:
            newest = max(self.newest.get(topic, 0), index)
            if index <= newest - self.max_queue_size:
                continue  # already evicted by newer messages
            kept = self.messages.setdefault(topic, {})
            before = kept.get(index)
            if before is None:
                self.count += 1
            withheld = before is not None and before[2]  # read again: still withheld
            kept[index] = (origin, offset, withheld)
            if message is not None:
                self.held.put((topic, index), None if withheld else message, meta)
            self.newest[topic] = newest
            self._evict(topic, kept, newest)
            touched.add(topic)
        for topic in touched & self._waiters.keys():
            self._wake(topic)

    def _evict(self, topic: str, kept: dict[int, Place], newest: int) -> None:
        floor = newest - self.max_queue_size
        while len(kept) > self.max_queue_size or (kept and next(iter(kept)) <= floor):
            # insertion order is index order but for messages of racing gateways; any index
            # at or below the floor goes, and the count bound holds whatever the order
            index = next(iter(kept))
            del kept[index]
            self.held.drop((topic, index))
            self.count -= 1

    def export(self, topics: Iterable[str]) -> dict[str, list[tuple[int, Kept]]]:
        """The messages these topics keep (for the snapshot), oldest first: a message not held
        with its text None, a withheld one with its text "" (and its meta, if held)."""
        found = ((topic, self.messages.get(topic)) for topic in topics)
        return {
            topic: [
                (index, self._exported(topic, index, place))
                for index, place in sorted(kept.items())
            ]
            for topic, kept in found
            if kept
        }

    def _exported(self, topic: str, index: int, place: Place) -> Kept:
        origin, offset, withheld = place
        held = self.held.entries.get((topic, index))  # not get(): a snapshot is not a use
        if held is None:
            return (None, origin, offset, b"")
        text, meta = held
        return ("" if withheld or text is None else text, origin, offset, meta)

    def place(self, topic: str, index: int) -> Place | None:
        kept = self.messages.get(topic)
        return None if kept is None else kept.get(index)

    def lookup(self, topic: str, index: int) -> Kept | None:
        """The message if it is kept and held (None: not kept, or not held: see `place`)."""
        place = self.place(topic, index)
        held = None if place is None else self.held.get((topic, index))
        if place is None or held is None:
            return None
        text, meta = held
        return (None if place[2] else text, place[0], place[1], meta)

    def refill(self, topic: str, index: int, place: Place, text: str, meta: bytes) -> Kept:
        """A message read back from the log: held again (if still kept), and as a lookup
        answers it."""
        origin, offset, withheld = self.place(topic, index) or place
        if self.place(topic, index) is not None:
            self.held.put((topic, index), None if withheld else text, meta)
        return (None if withheld else text, origin, offset, meta)

    def withhold(self, topic: str, index: int) -> bool:
        """Drop an expired message's text, keep its place (a get still answers for its index)
        and its meta if held: True the first time, so that each expired message is counted
        once."""
        kept = self.messages.get(topic, {})
        found = kept.get(index)
        if found is None or found[2]:
            return False
        kept[index] = (found[0], found[1], True)
        held = self.held.get((topic, index))
        if held is not None:
            self.held.put((topic, index), None, held[1])
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
