"""The threads that read the gateway's queues, from the beginning of their logs, into the index.

One per queue, each with its own roq Subscriber (a Subscriber's sockets belong to the thread
that made it). Records are decoded here, a batch at a time, and handed to the event loop in one
`call_soon_threadsafe` per delivery, so the loop does no decoding and takes no lock. A
subscriber that fails (its queue not placed yet, a lost monitor) is made again after
`limits.http_consumer_retry_s`: the index only misses what it has not read yet, and reading
from the beginning again re-files the same messages under the same indexes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from roq import limits
from roq.client.subscriber import Subscriber, records
from roq.errors import RoqError
from roq.http import records as mq

log = logging.getLogger(__name__)

Items = list[tuple[str, int, str]]


class LogConsumer(threading.Thread):
    def __init__(
        self,
        queue: str,
        zk: str,
        namespace: str,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Items], None],
    ):
        super().__init__(name=f"roq-http-{queue}", daemon=True)
        self.queue, self.zk, self.namespace = queue, zk, namespace
        self.loop, self.deliver = loop, deliver
        self.stop = threading.Event()
        self.received = 0
        self.foreign = 0  # records of the queue that are not gateway messages (skipped)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._consume()
            except (RoqError, OSError) as error:
                log.warning("http: reading queue %s failed (%s); again in %.1f s",
                            self.queue, error, limits.http_consumer_retry_s)  # fmt: skip
                self.stop.wait(limits.http_consumer_retry_s)

    def _consume(self) -> None:
        with Subscriber(
            self.queue, zk=self.zk, namespace=self.namespace, start="beginning"
        ) as subscriber:
            log.info("http: reading queue %s from the beginning of its log", self.queue)
            while not self.stop.is_set():
                items: Items = []
                for delivery in subscriber.poll(limits.poll_interval_ms):
                    for record in records(delivery):
                        found = mq.decode(record.payload)
                        if found is None:
                            self.foreign += 1
                        else:
                            items.append(found)
                if items:
                    self.received += len(items)
                    self.loop.call_soon_threadsafe(self.deliver, items)
