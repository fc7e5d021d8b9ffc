"""What each API call does. The monitor of each topic's queue keeps the registrations, owners,
heads and subscriber positions in its state log (client/topics.py, monitor/topics.py; with
`delivery.state=zookeeper`, ZooKeeper does: coordination/topics.py); roq's logs hold the
messages; the index (index.py) is this gateway's view of the logs.

- register: record the topic (owner, head 0).
- publish: take the next indexes of the topic (its monitor moves the head), then publish the
  messages, each carrying its topic and index, to the topic's queue and wait for the exchange's
  confirmation (`http.acks`). Only then the 200. A publish that fails after taking its indexes
  leaves them unused: a get of such an index answers 230 once a later message of the topic
  has been read (it will never come), 503 until then.
- subscribe: the subscriber's next index is the head + 1 (it gets what is published after).
- get: read the subscriber's next index and the topic's head; evicted if the next index is
  maxQueueSize or more behind the head (230), not published if it is past the head (231, or
  wait for it: v2's long poll), otherwise the message, from the index (waiting, bounded, for
  the log to bring a message published through another gateway); a message the index keeps
  but does not hold (past `http.cache.bytes`) is read back from its batch in the log. A
  message with meta is enforced here, by the gateway's wall clock: once expired it is never
  returned (230 as if evicted, counted once, its text dropped from the index), and before its
  not-before time it is not there yet (231, or the long poll waits for it): the subscriber's
  later messages wait behind it, as a topic is a queue in order.
- ack: the next index + 1, by compare-and-set, if the acknowledged index is the next one.

Blocking calls (kazoo, the Publisher's flush) run on a bounded thread pool, never on the loop.

The index is saved as a snapshot per queue (snapshot.py) every `http_snapshot_interval_s` while
messages come and when the gateway stops; a gateway starts from it and reads the logs only
after it, so its start follows the messages its topics keep, not the history behind them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from roq import limits
from roq.client import credentials
from roq.client.admin import AdminClient, AdminRefused
from roq.client.logread import LogReadFailed, read_batch
from roq.client.publisher import Publisher
from roq.client.topics import TopicClient
from roq.config import HttpSettings
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import Registry
from roq.coordination.topics import TopicStore
from roq.errors import CoordinationError, RoqError, TopicRefused
from roq.http import records, snapshot
from roq.http.auth import Access
from roq.http.consumer import Items, LogConsumer, Position
from roq.http.index import Kept, Place, TopicIndex
from roq.log.format import RecordMeta, decode_meta
from roq.log.metatext import now_us
from roq.protocol.messages.topics import NOBODY, Caller

log = logging.getLogger(__name__)

T = TypeVar("T")

OK, EVICTED, NO_MESSAGE = 200, 230, 231


class Unavailable(RoqError):
    """The cluster cannot answer now (ZooKeeper, the exchange, a message not read yet): 503."""


@dataclass(frozen=True, slots=True)
class Got:
    status: int  # OK, EVICTED or NO_MESSAGE
    index: int  # the subscriber's next index
    message: str = ""
    # the meta of the message: returned (OK), expired (EVICTED) or not due yet (NO_MESSAGE)
    meta: RecordMeta | None = None


class Gateway:
    def __init__(self, settings: HttpSettings):
        self.settings = settings
        self.paths = Paths(settings.zk.namespace)
        self.index = TopicIndex(settings.max_queue_size, settings.cache_bytes)
        self.pool = ThreadPoolExecutor(limits.http_workers_max, thread_name_prefix="roq-http")
        self.publishers: dict[str, Publisher] = {}
        self.consumers: list[LogConsumer] = []
        # ZooKeeper's store: one lock per topic hash, so this gateway's own publishes to a topic
        # do not race for its head (only other gateways' do), whatever the number of topics
        self._locks = [asyncio.Lock() for _ in range(256)]
        self._replacing = threading.Lock()
        self._replaced_at: dict[str, float] = {}
        self.replaced = 0  # failed publishers replaced (GET /metrics)
        self.expired = 0  # messages a get found expired and withheld, each once (GET /metrics)
        self.read_back = 0  # messages read back from the logs, not held in memory (GET /metrics)
        self.zk: Any = None
        self.store: TopicStore | TopicClient
        self.access = Access(credentials.secured())  # who may call (bearer tokens)
        self.snapshots = snapshot.directory(settings.log_root, settings.port)
        self._incarnation: dict[str, str] = {}  # queue -> its znode's creation zxid
        self._resume: dict[str, Position | None] = {}  # queue -> the index's log position
        self._unsaved: set[str] = set()  # queues whose index changed since their snapshot
        self._snapshotter: asyncio.Task[None] | None = None
        # one snapshot write at a time: a periodic one cancelled at stop may still be writing
        # in its worker thread when the last one starts (both use the same temporary file)
        self._writing = threading.Lock()

    # --- life ----------------------------------------------------------------------------------
    def open(self) -> None:
        """Blocking, before serving: ZooKeeper, the callers' tokens, the queues (created when
        missing), publishers."""
        zk = self.settings.zk
        self.zk = session.connect(
            zk.servers, zk.session_timeout_ms, auth=credentials.zk_auth(), tls=credentials.zk_tls()
        )
        self.access.follow(self.zk, zk.namespace)
        if self.settings.delivery_state == "log":
            locate = (None, zk.servers, zk.namespace)
            self.store = TopicClient(self.settings.queues, self.queue_of, locate)
        else:
            self.store = TopicStore(self.zk, self.paths)
        self.store.ensure_root()
        self._ensure_queues()
        if isinstance(self.store, TopicClient):
            self._migrate(self.store)
        for queue in self.settings.queues:
            self._restore(queue)
            self.publishers[queue] = self._new_publisher(queue)

    def _migrate(self, store: TopicClient) -> None:
        """Topics kept in ZooKeeper (before 26 Nov, or by `delivery.state=zookeeper`) move into
        their queues' state logs: each is imported (what a monitor holds already is kept),
        then its znodes deleted. Idempotent: a gateway killed half way, or two starting at once,
        import again what is left (docs/http.md, "Migration")."""
        old = TopicStore(self.zk, self.paths)
        moved = 0
        for topic, followers in old.exported():
            store.import_topic(topic.name, topic.owner, topic.head, followers, topic.principal)
            old.delete(topic.name)
            moved += 1
            if moved % 1000 == 0:  # a large migration says it is under way
                log.warning("http: %d topics moved from ZooKeeper so far", moved)
        if moved:
            log.warning("http: moved %d topics from ZooKeeper into their queues' state logs", moved)

    def _new_publisher(self, queue: str) -> Publisher:
        zk = self.settings.zk
        return Publisher(
            queue, zk=zk.servers, namespace=zk.namespace, acks=self.settings.acks, linger_ms=0
        )

    def _ensure_queues(self) -> None:
        deadline = time.monotonic() + limits.admin_request_timeout_ms / 1000
        zk = self.settings.zk
        with AdminClient(zk=zk.servers, namespace=zk.namespace) as admin:
            for queue in self.settings.queues:
                while not admin.queue_exists(queue):
                    try:
                        admin.create_queue(queue)
                        log.info("http: created queue %s for the gateway's messages", queue)
                    except AdminRefused as refused:  # another gateway's create, or no host yet
                        if time.monotonic() > deadline:
                            raise Unavailable(f"cannot create queue {queue}: {refused}") from None
                        time.sleep(limits.http_consumer_retry_s)

    def start_consumers(self, loop: asyncio.AbstractEventLoop) -> None:
        zk = self.settings.zk
        for queue in self.settings.queues:
            deliver = functools.partial(self._apply, queue)
            resume = self._resume.get(queue)
            consumer = LogConsumer(queue, zk.servers, zk.namespace, loop, deliver, resume)
            consumer.start()
            self.consumers.append(consumer)
        self._snapshotter = loop.create_task(self._snapshot_every())

    def read_from_logs(self) -> int:
        return sum(consumer.received for consumer in self.consumers)

    def _apply(self, queue: str, items: Items, position: Position) -> None:
        """On the loop: messages read from `queue`'s log, and where that read now is."""
        self.index.add(items)
        self._resume[queue] = position
        self._unsaved.add(queue)

    async def stop_consumers(self) -> None:
        """Before the loop ends: no more reads, then a last snapshot of what was read."""
        if self._snapshotter is not None:
            self._snapshotter.cancel()
        for consumer in self.consumers:
            consumer.stop.set()
        for consumer in self.consumers:
            await self._run(consumer.join, 2 * limits.poll_interval_ms / 1000 + 1)
        await self.save_snapshots()

    # --- snapshots -----------------------------------------------------------------------------
    def _restore(self, queue: str) -> None:
        """Start the queue's index from its snapshot, if there is a good one."""
        incarnation = Registry(self.zk, self.paths).queue_incarnation(queue)
        if incarnation is None:
            raise Unavailable(f"queue {queue} is gone again")  # deleted since _ensure_queues
        self._incarnation[queue] = incarnation
        path = self.snapshots / queue
        try:
            found = snapshot.read(path, queue, incarnation)
        except snapshot.Unreadable as error:
            log.error("http: the snapshot is not used, queue %s is read from the beginning: %s",
                      queue, error)  # fmt: skip
            return
        if found is None:
            log.info("http: no snapshot of queue %s: reading its log from the beginning", queue)
            return
        self.index.add(
            (topic, index, message, origin, offset, meta)
            for topic, kept in found.topics.items()
            for index, (message, origin, offset, meta) in kept
        )
        self._resume[queue] = found.resume
        log.info("http: queue %s from its snapshot %s (topics: %d, messages: %d)",
                 queue, path, len(found.topics), found.messages)  # fmt: skip

    async def _snapshot_every(self) -> None:
        while True:
            await asyncio.sleep(limits.http_snapshot_interval_s)
            await self.save_snapshots()

    async def save_snapshots(self) -> None:
        """A snapshot of every queue whose index changed since its last one. A snapshot that
        cannot be written is logged; the gateway serves on (its next start reads more log)."""
        for queue in sorted(self._unsaved):
            position = self._resume.get(queue)
            if position is None:
                continue
            self._unsaved.discard(queue)
            mine = [topic for topic in self.index.messages if self.queue_of(topic) == queue]
            topics: dict[str, snapshot.Messages] = {}
            step = limits.http_snapshot_topics_per_turn
            for start in range(0, len(mine), step):  # between slices, requests are served
                topics.update(self.index.export(mine[start : start + step]))
                await asyncio.sleep(0)
            saved = snapshot.Snapshot(queue, self._incarnation[queue], position, topics)
            if not await self._run(self._save, saved):
                self._unsaved.add(queue)

    def _save(self, saved: snapshot.Snapshot) -> bool:
        """Write the snapshot, then tell the queue's monitor what of its logs this gateway no
        longer needs (retention: monitor/topics.py). A snapshot that cannot be written is
        logged (False: it is tried again): the gateway serves on, its next start reads more
        log. A floor not told now is told with the next snapshot."""
        queue = saved.queue
        try:
            with self._writing:
                snapshot.write(self.snapshots / queue, saved)
        except (OSError, ValueError, RoqError) as error:
            log.error("http: the snapshot of queue %s was not written: %s", queue, error)
            return False
        if isinstance(self.store, TopicClient):
            try:
                self.store.consumed(queue, snapshot.floors(saved))
            except (RoqError, TopicRefused) as error:
                log.warning("http: queue %s: its monitor was not told what retention may "
                            "delete: %s", queue, error)  # fmt: skip
        return True

    def problems(self) -> list[str]:
        """What keeps the gateway from serving (GET /readyz): its ZooKeeper session."""
        if self.zk is None or not self.zk.connected:
            return ["ZooKeeper session not connected"]
        return []

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.stop.set()
        for consumer in self.consumers:
            consumer.join(2 * limits.poll_interval_ms / 1000 + 1)
        for publisher in self.publishers.values():
            try:
                publisher.close(timeout_s=limits.http_shutdown_s)
            except RoqError as error:
                log.warning("http: closing %s: %s", publisher.name, error)
        self.pool.shutdown(wait=True, cancel_futures=True)
        store = getattr(self, "store", None)
        if isinstance(store, TopicClient):
            store.close()  # its links: the pool is done with them
        if self.zk is not None:
            session.close(self.zk)

    # --- helpers -------------------------------------------------------------------------------
    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(call, *args))

    async def parse_json(self, body: bytes) -> Any:
        """A large request body's JSON, parsed on a worker thread: the event loop serves on."""
        return await self._run(json.loads, body)

    def queue_of(self, topic: str) -> str:
        queues = self.settings.queues
        return queues[zlib.crc32(topic.encode()) % len(queues)]

    # --- the API -------------------------------------------------------------------------------
    # `caller`: whose owners and subscribers the names are (issue 31, finding 3; api.py)
    async def register(
        self, owner: str, topic: str, caller: Caller = NOBODY, quota: int = 0
    ) -> None:
        """`quota`: the most topics the caller's principal may hold (0: no bound)."""
        most = self.settings.max_topics
        await self._run(self.store.register, topic, owner, most, caller, quota)
        log.info("http: topic %r registered by %r", topic, owner)

    async def publish(
        self,
        owner: str,
        topic: str,
        messages: list[bytes],
        caller: Caller = NOBODY,
        metas: Sequence[bytes] = (),
    ) -> int:
        """Store the messages (with `metas`, each message's meta: records.py); the index of the
        first. Returns once the exchange confirmed.
        With the topics in the state log, the head and the messages are one worker call (the
        topic's monitor is the one writer of heads: nothing to serialise here); with ZooKeeper's
        store, this gateway's own publishes to a topic take its head one at a time (no
        compare-and-set retries among them), then store."""
        if isinstance(self.store, TopicClient):
            return await self._run(self._publish, owner, topic, messages, caller, metas)
        async with self._locks[zlib.crc32(topic.encode()) & 255]:
            first = await self._run(self.store.advance_head, topic, owner, len(messages), caller)
        await self._run(self._store, topic, first, messages, metas)
        return first

    def _publish(
        self, owner: str, topic: str, messages: list[bytes], caller: Caller, metas: Sequence[bytes]
    ) -> int:
        first = self.store.advance_head(topic, owner, len(messages), caller)
        self._store(topic, first, messages, metas)
        return first

    def _store(self, topic: str, first: int, messages: list[bytes], metas: Sequence[bytes]) -> None:
        """Publish the messages under indexes `first`…; Unavailable (503) if not stored."""
        name = topic.encode()
        metas = metas or [b""] * len(messages)
        pairs = enumerate(zip(messages, metas, strict=True))
        payloads = [records.encode(name, first + n, body, meta) for n, (body, meta) in pairs]
        try:
            self._store_messages(self.queue_of(topic), payloads)
        except RoqError as error:
            log.error("http: topic %r: messages %d..%d not stored: %s",
                      topic, first, first + len(messages) - 1, error)  # fmt: skip
            raise Unavailable(f"the messages were not stored: {error}") from None

    def _store_messages(self, queue: str, payloads: list[bytes]) -> None:
        publisher = self.publishers[queue]
        try:
            publisher.send_many(payloads, key=records.KEY)
            publisher.flush(limits.http_publish_timeout_s)
        except RoqError:
            if publisher.failure is not None:
                self._replace(queue, publisher)
            raise

    def _replace(self, queue: str, failed: Publisher) -> None:
        """A failed publisher refuses every call for good: without a new one, every publish to
        its queue would answer 503 until the gateway restarts. One replacement at a time (a
        request that finds one under way answers 503 at once instead of holding a worker for
        the placement), at most once per `http_publisher_replace_s` per queue; the request
        that found the failure still answers 503 (its messages were not stored)."""
        if not self._replacing.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            if self.publishers[queue] is not failed:
                return  # another request replaced it
            if now - self._replaced_at.get(queue, -math.inf) < limits.http_publisher_replace_s:
                return
            self._replaced_at[queue] = now
            log.error("http: the publisher to queue %s failed (%s); replacing it",
                      queue, failed.failure)  # fmt: skip
            try:
                self.publishers[queue] = self._new_publisher(queue)  # bounded: its placement
            except RoqError as error:
                log.error("http: queue %s: no new publisher yet: %s", queue, error)
                return
            self.replaced += 1
        finally:
            self._replacing.release()
        try:
            failed.close(timeout_s=0.1)
        except RoqError as error:
            log.warning("http: closing the failed %s: %s", failed.name, error)

    async def subscribe(self, subscriber: str, topic: str, caller: Caller = NOBODY) -> int:
        following = await self._run(
            self.store.subscribe, topic, subscriber, self.settings.max_subscribers, caller
        )
        log.info("http: %r subscribed to topic %r from message %d", subscriber, topic, following)
        return following

    async def get(
        self, subscriber: str, topic: str, wait_s: float = 0.0, caller: Caller = NOBODY
    ) -> Got:
        deadline = time.monotonic() + wait_s
        while True:
            following, _, head = await self._run(self.store.position, topic, subscriber, caller)
            if following <= head - self.settings.max_queue_size:
                return Got(EVICTED, following)
            if following > head:
                left = deadline - time.monotonic()
                if left <= 0 or not await self.index.wait_for(topic, following, left):
                    return Got(NO_MESSAGE, following)
                continue  # something arrived: the store says whether it is still ours
            found: Kept | Got | None = await self._kept(topic, following)
            if found is None:
                found = await self._catch_up(topic, following)
            got = found if isinstance(found, Got) else self._deliverable(topic, following, found)
            left = deadline - time.monotonic()
            if got.status != NO_MESSAGE or got.meta is None or left <= 0:
                return got
            # not due yet: wait for its time (within the long poll), then ask the store again
            due_s = ((got.meta.not_before_us or 0) - now_us()) / 1e6
            await asyncio.sleep(min(left, max(due_s, 0.001)))

    async def _catch_up(self, topic: str, index: int) -> Kept | Got:
        """The store says message `index` was published, the index does not have it yet."""
        await self.index.wait_for(topic, index, limits.http_catchup_s, exact=True)
        found = await self._kept(topic, index)
        if found is not None:
            return found
        if self.index.newest.get(topic, 0) > index:
            return Got(EVICTED, index)  # its publish failed: a later message came, it never will
        raise Unavailable(f"message {index} of topic {topic!r} is not readable yet")

    async def _kept(self, topic: str, index: int) -> Kept | None:
        """The message if the index keeps it: held in memory, or else read back from its log."""
        found = self.index.lookup(topic, index)
        place = self.index.place(topic, index)
        if found is not None or place is None:
            return found
        text, meta = await self._run(self._read_back, topic, index, place)
        self.read_back += 1
        return self.index.refill(topic, index, place, text, meta)

    def _read_back(self, topic: str, index: int, place: Place) -> tuple[str, bytes]:
        """On a worker: the text and meta of a message kept but not held, from the batch its
        place names. Unavailable (503) if its exchange cannot be read now."""
        origin, offset, _ = place
        queue = self.queue_of(topic)
        back = next((c.exchanges.get(origin) for c in self.consumers if c.queue == queue), None)
        if not back:
            raise Unavailable(f"message {index} of topic {topic!r}: exchange {origin} of queue "
                              f"{queue} is not readable now (not held in memory)")  # fmt: skip
        try:
            records_ = read_batch(back, offset, limits.request_timeout_ms / 1000)
        except LogReadFailed as error:
            log.warning("http: reading back message %d of topic %r: %s", index, topic, error)
            message = f"message {index} of topic {topic!r} cannot be read back: {error}"
            raise Unavailable(message) from None
        for record in records_:
            found = records.decode(record.payload)
            if found is not None and found[0] == topic and found[1] == index:
                return found[2], found[3]
        raise Unavailable(f"message {index} of topic {topic!r} is not in its batch at offset "
                          f"{offset} of exchange {origin}")  # fmt: skip

    def _deliverable(self, topic: str, index: int, found: Kept) -> Got:
        """The subscriber's next message as a get answers it: expired (EVICTED: withheld, its
        text dropped, counted once), not due yet (NO_MESSAGE), or the message itself."""
        text, _, _, raw = found
        if not raw:
            return Got(OK, index, text or "")
        meta = decode_meta(raw)  # checked when it was read: records.py, snapshot.py
        now = now_us()
        expires = meta.expires_at_us
        if text is None or (expires is not None and now >= expires):
            if self.index.withhold(topic, index):
                self.expired += 1
            return Got(EVICTED, index, meta=meta)
        if meta.not_before_us is not None and now < meta.not_before_us:
            return Got(NO_MESSAGE, index, meta=meta)
        return Got(OK, index, text, meta)

    async def ack(self, subscriber: str, topic: str, index: int, caller: Caller = NOBODY) -> int:
        return await self._run(self.store.ack, topic, subscriber, index, caller)


__all__ = ["EVICTED", "NO_MESSAGE", "OK", "CoordinationError", "Gateway", "Got", "TopicRefused"]
