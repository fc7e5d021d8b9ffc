"""The messages each topic keeps, as read from the logs: index -> where the message is, the newest
maxQueueSize of each topic (the seed's fixed-size queue), the text of as many of them as
`http.cache.bytes` allows, and the gets waiting for them.

Owned by the event loop: the log consumers hand it batches with `call_soon_threadsafe`, so
no lock is taken and a waiting get is woken in the same loop turn. It is a view of the logs,
restored from the gateway's snapshot (snapshot.py) and the log read after it when the gateway
starts; nothing here is the record.

Memory (issue 34, seed 002: the seed's own bound, maxTopics x maxQueueSize x maxMsgSize, is
12.8 TB at its defaults). Every kept message has a place: its exchange and its batch's log
offset, packed per topic (`Places`: 6 bytes, at most `limits.http_place_bytes_max`; a tuple in a
dict took 157-231 bytes, 16 GB with every topic full). Its text and meta are held in
`Held`, bounded in bytes: past `http.cache.bytes` the least recently used go (the newest
messages come in, a get brings back what it read), and a get of a message not held reads its
batch back from the log (gateway.py). The log before the oldest kept message is needed by no
topic, and retention may delete it (gateway.py `floors`). An expired message found by a get
keeps its place but never its text again (`withhold`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from roq import limits
from roq.http.snapshot import Messages

log = logging.getLogger(__name__)

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


class Places:
    """The places of one topic's kept messages, packed (issue 34): for index `first + n`,
    `tags[n]` (2 bytes: 0 for no message there, else its exchange's number + 1, shifted left
    by one, or 1 when it is withheld) and `offsets[n]` (its batch's log offset: 4 bytes, 8
    once an offset passes 4 GiB). The indexes before `first + head` were evicted; they are
    let go of lazily, and the arrays compacted once they are a sixteenth of them, so that an
    eviction costs no copy of the topic's places (16 copied bytes per eviction, amortised)."""

    __slots__ = ("count", "first", "head", "offsets", "tags")

    def __init__(self, first: int):
        self.first = first  # the index of tags[0]
        self.head = 0  # tags[:head] are evicted
        self.count = 0  # messages kept (tags not 0 from head on)
        self.tags = array("H")
        self.offsets = array("I")

    def __len__(self) -> int:
        return self.count

    def get(self, index: int) -> tuple[int, int] | None:
        """(tag, offset) of the message kept under `index`, or None."""
        at = index - self.first
        if at < self.head or at >= len(self.tags) or not self.tags[at]:
            return None
        return self.tags[at], self.offsets[at]

    def put(self, index: int, tag: int, offset: int) -> bool:
        """Keep (or move) a message's place: True if the index was not kept before."""
        if index < self.first + self.head:
            self._prepend(index)  # an older message after newer ones (racing gateways)
        at = index - self.first
        if at >= len(self.tags):
            missing = at - len(self.tags)  # indexes not read (yet): holes
            self.tags.frombytes(bytes(missing * 2))
            self.offsets.frombytes(bytes(missing * self.offsets.itemsize))
            self.tags.append(0)
            self.offsets.append(0)
        if offset > 0xFFFFFFFF and self.offsets.typecode == "I":
            self.offsets = array("Q", self.offsets)
        new = not self.tags[at]
        self.tags[at], self.offsets[at] = tag, offset
        self.count += new
        return new

    def set_tag(self, index: int, tag: int) -> None:
        self.tags[index - self.first] = tag

    def evict(self, floor: int) -> list[int]:
        """Let go of every index at or below `floor`: the indexes that were kept."""
        end = min(max(floor + 1 - self.first, self.head), len(self.tags))
        tags = self.tags
        gone = [self.first + at for at in range(self.head, end) if tags[at]]
        self.count -= len(gone)
        self.head = end
        if self.head == len(tags):  # nothing left: start again at the floor
            self.first, self.head = max(self.first + self.head, floor + 1), 0
            del self.tags[:], self.offsets[:]
        elif self.head >= 16 and self.head * 16 >= len(tags):
            self._compact()
        return gone

    def indexes(self) -> Iterator[int]:
        """The indexes kept, oldest first."""
        tags, first = self.tags, self.first
        return (first + at for at in range(self.head, len(tags)) if tags[at])

    def allocated(self) -> int:
        """The memory of these places (the object and its arrays, as allocated)."""
        return sys.getsizeof(self) + sys.getsizeof(self.tags) + sys.getsizeof(self.offsets)

    def tags_in_use(self) -> set[int]:
        return set(self.tags[self.head :])

    def _compact(self) -> None:
        del self.tags[: self.head], self.offsets[: self.head]
        self.first += self.head
        self.head = 0

    def _prepend(self, index: int) -> None:
        self._compact()
        missing = self.first - index
        self.tags[0:0] = array("H", bytes(missing * 2))
        self.offsets[0:0] = array(self.offsets.typecode, bytes(missing * self.offsets.itemsize))
        self.first = index


class TopicIndex:
    def __init__(self, max_queue_size: int, held_bytes: int):
        self.max_queue_size = max_queue_size
        self.messages: dict[str, Places] = {}
        self.held = Held(held_bytes)
        self.newest: dict[str, int] = {}
        self.count = 0  # messages kept, all topics
        # the exchanges messages were read from, numbered for the places' tags ("": free)
        self.exchanges: list[str] = []
        self._numbers: dict[str, int] = {}
        self._free: list[int] = []
        self.unplaced = 0  # messages not kept: more exchanges than a tag can number (logged)
        self._waiters: dict[str, list[tuple[int, bool, asyncio.Future[None]]]] = {}
        self._parked = 0

    def add(self, items: Iterable[Item]) -> None:
        touched: set[str] = set()
        for topic, index, message, origin, offset, meta in items:
            newest = max(self.newest.get(topic, 0), index)
            floor = newest - self.max_queue_size
            if index <= floor:
                continue  # already evicted by newer messages
            kept = self.messages.get(topic)
            if kept is not None:
                self._evict(topic, kept, floor)  # first: what it lets go of frees numbers
            number = self._number(origin)
            if number is None:
                continue
            if kept is None:
                kept = self.messages[topic] = Places(index)
            before = kept.get(index)
            withheld = before is not None and bool(before[0] & 1)  # read again: still withheld
            self.count += kept.put(index, (number + 1) << 1 | withheld, offset)
            if message is not None:
                self.held.put((topic, index), None if withheld else message, meta)
            self.newest[topic] = newest
            touched.add(topic)
        for topic in touched & self._waiters.keys():
            self._wake(topic)

    def _evict(self, topic: str, kept: Places, floor: int) -> None:
        # every kept index is above the floor, so a topic keeps at most maxQueueSize
        # whatever order its messages came in
        for index in kept.evict(floor):
            self.held.drop((topic, index))
            self.count -= 1

    def _number(self, origin: str) -> int | None:
        """The exchange's number in the places' tags; None when all are taken by exchanges
        that places still name (logged: the message is not kept, a get of it answers 503)."""
        number = self._numbers.get(origin)
        if number is not None:
            return number
        if not self._free and len(self.exchanges) >= limits.http_index_exchanges_max:
            self._reclaim()
        if self._free:
            number = self._free.pop()
            self.exchanges[number] = origin
        elif len(self.exchanges) < limits.http_index_exchanges_max:
            number = len(self.exchanges)
            self.exchanges.append(origin)
        else:
            self.unplaced += 1
            most = limits.http_index_exchanges_max
            log.error("http: a message from exchange %s is not kept: the index numbers at most "
                      "%d exchanges, all in use", origin, most)  # fmt: skip
            return None
        self._numbers[origin] = number
        return number

    def _reclaim(self) -> None:
        """Free the numbers of exchanges no kept message was read from (once all are taken:
        exchanges come and go over a gateway's life)."""
        used: set[int] = set()
        for kept in self.messages.values():
            used.update((tag >> 1) - 1 for tag in kept.tags_in_use() if tag)
        for number, origin in enumerate(self.exchanges):
            if origin and number not in used:
                del self._numbers[origin]
                self.exchanges[number] = ""
                self._free.append(number)

    def place_bytes(self) -> int:
        """The memory of every topic's places (roq_http_place_bytes)."""
        return sum(kept.allocated() for kept in self.messages.values())

    def export(self, topics: Iterable[str]) -> dict[str, Messages]:
        """The messages these topics keep (for the snapshot), oldest first: a message not held
        with its text None, a withheld one with its text "" (and its meta, if held)."""
        exported: dict[str, Messages] = {}
        for topic in topics:
            kept = self.messages.get(topic)
            if kept:
                messages = exported[topic] = Messages()
                for index in kept.indexes():
                    messages.append(index, self._exported(topic, index))
        return exported

    def _exported(self, topic: str, index: int) -> Kept:
        origin, offset, withheld = self.place(topic, index) or ("", 0, False)
        held = self.held.entries.get((topic, index))  # not get(): a snapshot is not a use
        if held is None:
            return (None, origin, offset, b"")
        text, meta = held
        return ("" if withheld or text is None else text, origin, offset, meta)

    def place(self, topic: str, index: int) -> Place | None:
        kept = self.messages.get(topic)
        found = None if kept is None else kept.get(index)
        if found is None:
            return None
        tag, offset = found
        return (self.exchanges[(tag >> 1) - 1], offset, bool(tag & 1))

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
        kept = self.messages.get(topic)
        found = None if kept is None else kept.get(index)
        if kept is None or found is None or found[0] & 1:
            return False
        kept.set_tag(index, found[0] | 1)
        held = self.held.get((topic, index))
        if held is not None:
            self.held.put((topic, index), None, held[1])
        return True

    def _arrived(self, topic: str, index: int, exact: bool) -> bool:
        if exact:
            kept = self.messages.get(topic)
            return kept is not None and kept.get(index) is not None
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
