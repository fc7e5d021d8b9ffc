"""Subscriber: receives a logical queue's messages whose routing key starts with `key`.

    with Subscriber("q1", key=b"news", gcm="127.0.0.1:5000") as sub:
        for message in sub.messages(count=10, timeout_s=5):     # iterator style
            print(message.seq, message.payload)
        sub.run(callback, stop_event)                           # callback style

Threads. A Subscriber and all its sockets belong to the thread that created it; it starts no
thread of its own, so a callback runs in that thread and may block it (which is back-pressure:
see below).

Membership. It asks the queue's monitor for every exchange, connects one SUB socket to all of
them, and follows the monitor's notices: a new exchange is joined at once, and the full list the
monitor republishes every period adds what is missing and drops exchanges that are gone.

Order and duplicates: see `sequencer.py` (per producer and routing key).

Slow subscribers. The exchange queues at most `exchange.subscriber.hwm` batches for a subscriber;
past that, ZeroMQ drops that subscriber's batches (never anyone else's, and the exchange does not
grow). The subscriber sees the sequence gap and counts it in `lost` after `gap_wait_ms`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from roq import limits
from roq.client.locate import (
    PLACEMENT_OFFSET,
    TO_SUBSCRIBERS_OFFSET,
    MonitorAddress,
    locate_monitor,
)
from roq.client.sequencer import Delivery, Sequencer
from roq.errors import CorruptRecord, RoqError
from roq.log import format as batchfmt
from roq.protocol import bsonmsg
from roq.protocol.commands import MonitorCommand, Result, StatCommand, SubscriberNotice
from roq.transport import (
    NOBLOCK,
    POLLIN,
    Kind,
    Poller,
    WouldBlock,
    connect,
    disconnect,
    new_context,
    open_socket,
)
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)

_BURST = 1024
_STAT_PERIOD_S = 1.0


class Subscriber:
    def __init__(
        self,
        queue: str,
        key: bytes = b"",
        *,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        monitor: str | None = None,
        hwm: int = limits.subscriber_hwm_batches,
        gap_wait_ms: int = limits.subscriber_gap_wait_ms,
        join_timeout_s: float = limits.placement_timeout_ms / 1000,
    ):
        self.queue, self.key = queue, key
        self.subscriber_id = uuid.uuid4().hex
        self.name = f"subscriber {self.subscriber_id[:8]} on {queue}"
        self.monitor = (
            MonitorAddress(monitor) if monitor else locate_monitor(queue, gcm, zk, namespace)
        )
        self.sequencer = Sequencer(gap_wait_ms / 1000)
        self.exchanges: dict[str, str] = {}  # back address → exchange id
        self.received_messages = self.received_batches = self.bad_batches = 0
        self.latency_us: list[float] = []  # per-batch samples since the last statistics
        self._context = new_context()
        self.data = open_socket(self._context, Kind.SUB, rcvhwm=hwm, subscribe=key)
        self.notices = open_socket(self._context, Kind.SUB, subscribe=b"")
        connect(self.notices, self.monitor.at(TO_SUBSCRIBERS_OFFSET))
        self.stats = self._stat_socket()
        self._placement = Requester(self._context, self.monitor.at(PLACEMENT_OFFSET))
        self._poller = Poller()
        self._poller.register(self.data, POLLIN)
        self._poller.register(self.notices, POLLIN)
        self._next_stat = time.monotonic() + _STAT_PERIOD_S
        self._join(join_timeout_s)

    def _stat_socket(self) -> Any:
        sock = open_socket(self._context, Kind.PUB, sndhwm=100)
        if self.monitor.stat:
            host, _, port = self.monitor.stat.rpartition(":")
            connect(sock, f"{host}:{int(port) - 1}")  # the KPI stream is S+1, its input S
        return sock

    def _join(self, timeout_s: float) -> None:
        """Ask the monitor for every exchange, retrying until it has at least one (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self._placement.request({"CMD": int(MonitorCommand.SUBSCRIBER_INIT)})
                if reply["RESULT"] == Result.OK and reply.get("Exchanges"):
                    self._reconcile(reply["Exchanges"], drop=False)
                    return
                reason = "the queue has no exchange yet"
            except RoqError as error:
                reason = str(error)
            if time.monotonic() > deadline:
                raise RoqError(f"{self.name}: cannot join the queue: {reason}")
            time.sleep(limits.placement_retry_ms / 1000)

    # --- membership ----------------------------------------------------------------------------
    def _reconcile(self, exchanges: list[Any], drop: bool) -> None:
        listed = {
            str(x["Back"]): str(x.get("Id", ""))
            for x in exchanges
            if isinstance(x, dict) and "Back" in x
        }
        for back, exchange_id in listed.items():
            self._join_exchange(back, exchange_id)
        if drop:
            for back in [b for b in self.exchanges if b not in listed]:
                log.info("%s: leaving exchange %s", self.name, self.exchanges.pop(back))
                disconnect(self.data, back)

    def _join_exchange(self, back: str, exchange_id: str) -> None:
        if back not in self.exchanges:
            connect(self.data, back)
            self.exchanges[back] = exchange_id
            log.info("%s: receiving from exchange %s (%s)", self.name, exchange_id, back)

    def _on_notice(self) -> None:
        try:
            doc = bsonmsg.decode(self.notices.recv_multipart(NOBLOCK))
        except (WouldBlock, RoqError):
            return
        if doc["CMD"] == SubscriberNotice.NEW_EXCHANGE and isinstance(doc.get("Back"), str):
            self._join_exchange(doc["Back"], str(doc.get("Id", "")))
        elif doc["CMD"] == SubscriberNotice.EXCHANGE_LIST and isinstance(
            doc.get("Exchanges"), list
        ):
            self._reconcile(doc["Exchanges"], drop=True)

    # --- receiving -----------------------------------------------------------------------------
    def poll(self, timeout_ms: int = limits.poll_interval_ms) -> list[Delivery]:
        """Wait up to `timeout_ms` and return the batches now deliverable, in stream order."""
        out: list[Delivery] = []
        for sock, _ in self._poller.poll(timeout_ms):
            if sock is self.notices:
                self._on_notice()
            else:
                self._receive(out)
        now = time.monotonic()
        out.extend(self.sequencer.expire(now))
        if now >= self._next_stat:
            self._publish_stats(now)
        return out

    def _receive(self, out: list[Delivery]) -> None:
        now = time.monotonic()
        now_us = time.time_ns() // 1000
        for _ in range(_BURST):
            try:
                frames = self.data.recv_multipart(NOBLOCK, copy=False)
            except WouldBlock:
                return
            if len(frames) != 2:
                self.bad_batches += 1
                continue
            batch = frames[1].buffer
            try:
                header = batchfmt.read_header(batch)
            except CorruptRecord as error:
                self.bad_batches += 1
                log.warning("%s: dropped a bad batch: %s", self.name, error)
                continue
            self.received_batches += 1
            self.received_messages += header.count
            if len(self.latency_us) < 100_000:
                self.latency_us.append(now_us - header.first_ts_us)
            out.extend(self.sequencer.offer(header, batch, now))

    def messages(self, count: int | None = None, timeout_s: float | None = None) -> Iterator[Any]:
        """Yield records (`format.Record`) until `count` were yielded or `timeout_s` passed
        without the count being reached (None: forever)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        yielded = 0
        while count is None or yielded < count:
            wait = limits.poll_interval_ms
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = max(1, min(wait, int(left * 1000)))
            for delivery in self.poll(wait):
                for record in records(delivery):
                    yield record
                    yielded += 1
                    if count is not None and yielded >= count:
                        return

    def run(self, callback: Callable[[Any], None], stop: threading.Event) -> None:
        """Call `callback(record)` for every message until `stop` is set."""
        while not stop.is_set():
            for delivery in self.poll():
                for record in records(delivery):
                    callback(record)

    # --- statistics ----------------------------------------------------------------------------
    def _publish_stats(self, now: float) -> None:
        samples = sorted(self.latency_us)
        self.latency_us = []
        doc = {
            "CMD": int(StatCommand.SUBSCRIBER_TOTAL),
            "SubscriberID": self.subscriber_id,
            "QName": self.queue,
            "TotalReceived": self.received_messages,
            "Lost": self.sequencer.lost,
            "Duplicates": self.sequencer.duplicates,
            "MeanLat": (sum(samples) / len(samples) / 1000) if samples else 0.0,
            "P99Lat": samples[int(len(samples) * 0.99)] / 1000 if samples else 0.0,
            "Time": time.time(),
        }
        try:
            self.stats.send(bsonmsg.encode(doc), NOBLOCK)
        except WouldBlock:
            pass
        self._next_stat = now + _STAT_PERIOD_S

    def close(self) -> None:
        for sock in (self.data, self.notices, self.stats):
            sock.close(0)
        self._placement.close()
        self._context.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records(delivery: Delivery) -> Iterator[batchfmt.Record]:
    """The records of a delivered batch, without those already delivered before."""
    for index, record in enumerate(batchfmt.iter_records(delivery.batch)):
        if index >= delivery.skip:
            yield record
