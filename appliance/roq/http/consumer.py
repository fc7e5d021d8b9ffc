"""The threads that read the gateway's queues into the index: from where the gateway's snapshot
of the queue left off (snapshot.py), or from the beginning of the logs without one.

One per queue, each with its own roq Subscriber (a Subscriber's sockets belong to the thread
that made it). Records are decoded here, a batch at a time, and handed to the event loop in one
`call_soon_threadsafe` per delivery with the Subscriber's position after them, so the loop does
no decoding, takes no lock, and always knows where the index it holds was read up to. A
subscriber that fails (its queue not placed yet, a lost monitor) is made again after
`limits.http_consumer_retry_s`, from the position of the last delivery: reading a message again
re-files it under the same index.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.client.subscriber import Subscriber, records
from roq.errors import RoqError
from roq.http import records as mq

log = logging.getLogger(__name__)

# topic, index, message, exchange, offset, meta
Items = list[tuple[str, int, str | None, str, int, bytes]]
Position = dict[str, Any]  # a Subscriber's resume state


class LogConsumer(threading.Thread):
    def __init__(
        self,
        queue: str,
        zk: str,
        namespace: str,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Items, Position], None],
        resume: Position | None = None,
    ):
        super().__init__(name=f"roq-http-{queue}", daemon=True)
        self.queue, self.zk, self.namespace = queue, zk, namespace
        self.loop, self.deliver = loop, deliver
        self.resume = resume  # where the next Subscriber starts (None: the beginning)
        self.stop = threading.Event()
        self.received = 0
        self.foreign = 0  # records of the queue that are not gateway messages (skipped)
        # exchange id -> its back address, of the exchanges the Subscriber reads: where the
        # gateway reads back a message it does not hold (gateway.py `_read_back`); replaced
        # whole, so a worker thread reads it without a lock
        self.exchanges: dict[str, str] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._consume()
            except (RoqError, OSError) as error:
                log.warning("http: reading queue %s failed (%s); again in %.1f s",
                            self.queue, error, limits.http_consumer_retry_s)  # fmt: skip
                self.stop.wait(limits.http_consumer_retry_s)

    def _subscriber(self) -> Subscriber:
        def subscriber() -> Subscriber:
            return Subscriber(self.queue, zk=self.zk, namespace=self.namespace,
                              start="beginning", resume=self.resume)  # fmt: skip

        try:
            return subscriber()
        except (ValueError, TypeError, KeyError) as error:
            if self.resume is None:
                raise
            # a snapshot's position that passed its CRC but makes no sense (another version
            # wrote it): the log from the beginning is always right, only slower
            log.error("http: queue %s: the snapshot's log position is unusable (%r); "
                      "reading from the beginning", self.queue, error)  # fmt: skip
            self.resume = None
            return subscriber()

    def _consume(self) -> None:
        with self._subscriber() as subscriber:
            where = "the beginning of its log" if self.resume is None else "the snapshot's position"
            log.info("http: reading queue %s from %s", self.queue, where)
            while not self.stop.is_set():
                self.exchanges = {id_: back for back, id_ in subscriber.exchanges.items() if back}
                items: Items = []
                for delivery in subscriber.poll(limits.poll_interval_ms):
                    origin = getattr(delivery.source, "exchange_id", "")
                    for record in records(delivery):
                        found = mq.decode(record.payload)
                        if found is None:
                            self.foreign += 1
                        else:
                            topic, index, message, meta = found
                            items.append((topic, index, message, origin, record.offset, meta))
                if items:
                    self.received += len(items)
                    self.resume = subscriber.resume_state()
                    self.loop.call_soon_threadsafe(self.deliver, items, self.resume)
