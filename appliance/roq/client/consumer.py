"""Consumer: one member of a consumer group of a queue; the group's consumers share its messages.

    with Consumer("q1", "workers", gcm="127.0.0.1:5000") as consumer:
        for delivery in consumer.deliveries(timeout_s=10):       # iterator style
            handle(delivery.payload)
            delivery.ack()          # or nack(delay_s), in_progress(), reject(reason)
        consumer.run(callback, stop_event)                       # callback: ack on return,
                                                                 # nack when it raises

Each message of the queue is handed to one consumer of the group at a time until one
acknowledges it (docs/guarantees.md, "Consumer groups"). The queue's monitor leases this
consumer a *slot* (a range of offsets of one exchange's log, monitor/slots.py); the consumer reads
the slot's batches straight from the exchange's log server (or from a copy of a dead exchange's
log), asks the monitor before it hands each window of messages to the application (so every
delivery is counted, and survives the monitor's restart), and settles them in batches: acks,
nacks and dead letters wait at most `limits.work_ack_flush_ms` before going on the wire with the
next request; `flush()` sends them at once and returns once the monitor has them.

A message handed out `max.deliveries` times without an ack, or rejected, goes to the group's
dead-letter queue `<queue>.<group>.dlq` (created on first use): a BSON document with the
original payload and key, the queue, group, exchange, log offset of its batch and record
within it, its delivery count and the last reason.

At most `work.inflight` messages are handed out and unsettled at once; at that limit the
consumer says so (a warning, once per episode, and `stats["inflight_full"]`), and hands out
nothing more until the application settles something.

Threads: like a Subscriber, a Consumer and its sockets belong to the thread that made it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import bson

from roq import limits
from roq.client.admin import AdminClient, AdminRefused
from roq.client.locate import MonitorAddress, locate_monitor
from roq.client.publisher import Publisher
from roq.errors import CorruptRecord, ProtocolError, RoqError, TransportError
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import MonitorCommand
from roq.protocol.messages.groups import (
    ConsumerRequest,
    GroupJoin,
    Joined,
    Lease,
    Nack,
    Settle,
    Settled,
)
from roq.protocol.ports import MonitorPort
from roq.transport import Kind, connect, new_context, open_socket, recv_nowait, send_nowait
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Delivery:
    """One message handed to the application. Settle it once: ack, nack or reject."""

    payload: bytes
    key: bytes
    producer_id: bytes
    seq: int
    timestamp_us: int
    exchange: str
    offset: int  # log offset of its batch
    record: int  # its position in the batch
    slot: str
    index: int  # its position in the slot
    deliveries: int  # times handed out, this one included
    _consumer: Consumer | None = field(default=None, repr=False)

    def ack(self) -> None:
        self._settle().ack(self)

    def nack(self, delay_s: float | None = None, reason: str = "") -> None:
        """Hand it out again, after `delay_s` (default: the group's back-off x deliveries)."""
        self._settle().nack(self, delay_s, reason)

    def in_progress(self) -> None:
        """Still working on it: renew the lease now."""
        self._settle().in_progress(self)

    def reject(self, reason: str = "") -> None:
        """Never hand it out again: straight to the dead-letter queue."""
        self._settle().reject(self, reason)

    def _settle(self) -> Consumer:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            raise RoqError(f"message {self.slot}#{self.index} was settled already")
        return consumer


@dataclass
class _Slot:
    lease: Lease
    records: list[tuple[batchfmt.Record, int]]  # (record, its position in its batch)
    todo: collections.deque[int]  # indices still to ask for, in order
    handed: set[int] = field(default_factory=set)
    acks: list[int] = field(default_factory=list)
    nacks: list[Nack] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    skip: list[int] = field(default_factory=list)  # [lo, hi) ranges outside the key prefix
    count_sent: bool = False

    def pending(self) -> bool:
        return bool(self.acks or self.nacks or self.dead or self.skip)


class Consumer:
    def __init__(
        self,
        queue: str,
        group: str,
        *,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        monitor: str | None = None,
        start: str = "beginning",
        ordered: bool = False,
        inflight: int | None = None,
        prefix: bytes = b"",
    ):
        self.queue, self.group = queue, group
        self.consumer_id = uuid.uuid4().hex
        self.name = f"consumer {self.consumer_id[:8]} of {queue}/{group}"
        self._locate = (gcm, zk, namespace)
        self.monitor = (
            MonitorAddress(monitor) if monitor else locate_monitor(queue, gcm, zk, namespace)
        )
        self._context = new_context()
        self._requests = Requester(
            self._context, self.monitor.at(MonitorPort.PLACEMENT), limits.work_request_timeout_ms
        )
        self.stats: collections.Counter[str] = collections.Counter()
        self._slot: _Slot | None = None
        self._ready: collections.deque[Delivery] = collections.deque()
        self._dlq: Publisher | None = None
        self._last_flush = time.monotonic()
        self._full_logged = False
        self._join_doc = GroupJoin(group, self.consumer_id, start, ordered, prefix).encode()
        self.settings = Joined.decode(self._ask(self._join_doc))
        self.prefix = self.settings.prefix  # the group's, whatever this consumer asked
        self.inflight = min(inflight or self.settings.inflight, self.settings.inflight)

    # --- requests to the monitor --------------------------------------------------------------
    def _ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        """One request; a monitor that does not answer, is busy (ZooKeeper) or fenced (its host
        lost its lease) is asked again (it may be restarting, or have moved: then the GCM is
        asked where), for at most 30 s."""
        deadline = time.monotonic() + limits.work_monitor_wait_s
        while True:
            try:
                reply = self._requests.request(doc)
            except TransportError as error:  # no answer (RequestTimeout is one)
                problem = str(error)
                self._follow_monitor()
            else:
                outcome = Reply.decode(reply)
                if outcome.ok:
                    return reply
                if outcome.error == "fenced":  # its host lost its lease: the queue may move
                    self._follow_monitor()
                if outcome.error == "unknown_queue" and doc is not self._join_doc:
                    self._ask(self._join_doc)  # the monitor forgot us (or the group): join again
                    continue
                if outcome.error not in ("busy", "fenced"):
                    raise RoqError(f"{self.name}: {outcome.comment}")
                problem = outcome.comment
            if time.monotonic() > deadline:
                raise RoqError(f"{self.name}: the monitor does not answer: {problem}")
            time.sleep(limits.work_poll_ms / 1000)

    def _follow_monitor(self) -> None:
        gcm, zk, namespace = self._locate
        if gcm is None and zk is None:
            return
        try:
            found = locate_monitor(self.queue, gcm, zk, namespace, quick=True)
        except RoqError:
            return
        if found.base != self.monitor.base:
            log.warning("%s: the monitor moved to %s", self.name, found.base)
            self._requests.close()
            self.monitor = found
            self._requests = Requester(
                self._context, found.at(MonitorPort.PLACEMENT), limits.work_request_timeout_ms
            )

    # --- the loop -----------------------------------------------------------------------------
    def deliveries(
        self, count: int | None = None, timeout_s: float | None = None
    ) -> Iterator[Delivery]:
        """Messages as they come; stops after `count`, or after `timeout_s` without one."""
        yielded = 0
        while count is None or yielded < count:
            delivery = self.next(timeout_s)
            if delivery is None:
                return
            yielded += 1
            yield delivery

    def next(self, timeout_s: float | None = None) -> Delivery | None:
        """The next message, or None after `timeout_s` (None: wait as long as it takes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = limits.work_poll_min_ms / 1000
        while not self._ready:
            if self._step():
                pause = limits.work_poll_min_ms / 1000
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None
            # An idle consumer asks again soon, then less often (bounded): it picks up a slot
            # cut for it within a few ms, and a crowd of idle ones costs the monitor little.
            time.sleep(pause)
            pause = min(pause * 2, limits.work_poll_ms / 1000)
        delivery = self._ready.popleft()
        delivery._consumer = self
        self.stats["received"] += 1
        return delivery

    def run(self, callback: Callable[[Delivery], None], stop: threading.Event) -> None:
        """Call `callback` per message until `stop` is set: ack when it returns, nack (with the
        back-off) when it raises, unless it settled the message itself."""
        while not stop.is_set():
            delivery = self.next(timeout_s=0.2)
            if delivery is None:
                continue
            try:
                callback(delivery)
            except Exception as error:
                log.warning("%s: callback failed on %s#%d: %r", self.name, delivery.slot,
                            delivery.index, error)  # fmt: skip
                if delivery._consumer is not None:
                    delivery.nack(reason=repr(error)[: limits.work_reason_chars_max])
                continue
            if delivery._consumer is not None:
                delivery.ack()

    def _step(self) -> bool:
        """One move forward; True if it made progress (asked again at once)."""
        if self._slot is None:
            return self._take_slot()
        slot = self._slot
        room = self.inflight - len(slot.handed)
        if slot.todo and room > 0:
            return self._give(slot, room)
        if slot.todo:
            self._note_full()
            self.flush()
            return False
        if slot.handed:
            self._flush_if_due()
            return False
        self.flush()
        self._release(slot)
        return True

    def _note_full(self) -> None:
        self.stats["inflight_full"] += 1
        if not self._full_logged:
            self._full_logged = True
            log.warning("%s: %d messages in flight, its limit: no more until some are acked, "
                        "nacked or rejected", self.name, self.inflight)  # fmt: skip

    # --- slots --------------------------------------------------------------------------------
    def _take_slot(self) -> bool:
        reply = self._ask(ConsumerRequest(MonitorCommand.GROUP_LEASE, self.group,
                                          self.consumer_id).encode())  # fmt: skip
        if not reply.get("Slot"):
            return False
        lease = Lease.decode(reply)
        records = self._read(lease)
        if records is None:  # its log does not answer: give it back, another may read it
            self._ask(ConsumerRequest(MonitorCommand.GROUP_RELEASE, self.group,
                                      self.consumer_id, lease.slot).encode())  # fmt: skip
            return False
        settled = set(_expand(lease.settled))
        skip = self._outside_prefix(records, settled)
        todo = collections.deque(
            i for i in range(len(records)) if i not in settled and i not in skip
        )
        slot = self._slot = _Slot(lease, records, todo, skip=_ranges(skip))
        self.stats["slots"] += 1
        self.stats["skipped"] += len(skip)
        while self._slot is slot and (slot.skip or not slot.count_sent) and not todo:
            self._send(slot, [])  # tell the count and what is outside the prefix
        return True

    def _outside_prefix(self, records: list[tuple[batchfmt.Record, int]],
                        settled: set[int]) -> set[int]:  # fmt: skip
        """The group takes only keys starting with its prefix: the others count as settled
        for it (the consumer filters, the monitor never sees a key)."""
        prefix = self.prefix
        if not prefix:
            return set()
        return {
            i for i, (record, _) in enumerate(records)
            if i not in settled and not record.key.startswith(prefix)
        }  # fmt: skip

    def _read(self, lease: Lease) -> list[tuple[batchfmt.Record, int]] | None:
        """The slot's records, read from the log server by offset (None if it does not answer)."""
        reader = open_socket(self._context, Kind.DEALER, sndhwm=10, rcvhwm=10)
        connect(reader, lease.endpoint)
        records: list[tuple[batchfmt.Record, int]] = []
        offset = lease.start
        try:
            while offset < lease.end:
                data, offset = self._read_once(reader, lease, offset)
                if data is None:
                    return None
                records += self._records(data, lease.end)
        finally:
            reader.close(0)
        return records

    def _read_once(self, reader: Any, lease: Lease, offset: int) -> tuple[bytes | None, int]:
        request = dataplane.read_request(offset, leader=lease.leader)
        if not send_nowait(reader, request):
            return None, offset
        deadline = time.monotonic() + limits.work_read_timeout_ms / 1000
        while time.monotonic() < deadline:
            frames = recv_nowait(reader)
            if frames is None:
                time.sleep(0.001)
                continue
            try:
                reply = dataplane.parse_read_reply(frames)
            except ProtocolError as error:
                log.warning("%s: bad log reply for %s: %s", self.name, lease.slot, error)
                return None, offset
            if reply.status == dataplane.READ_ERROR or reply.status == dataplane.READ_NOTHING_YET:
                log.warning("%s: slot %s not readable at %d (%r)", self.name, lease.slot, offset,
                            reply.data[:200])  # fmt: skip
                return None, offset
            if reply.status == dataplane.READ_EVICTED:  # retention took it: nothing to hand out
                self.stats["evicted_bytes"] += reply.next_offset - offset
                return b"", max(reply.next_offset, offset)
            return reply.data, reply.next_offset
        log.warning("%s: the log at %s did not answer for slot %s", self.name, lease.endpoint,
                    lease.slot)  # fmt: skip
        return None, offset

    def _records(self, data: bytes, end: int) -> list[tuple[batchfmt.Record, int]]:
        out = []
        view = memoryview(data)
        position = 0
        while position < len(view):
            try:
                header = batchfmt.check_batch(view, position)
            except CorruptRecord:
                self.stats["skipped_bytes"] += len(view) - position
                break
            if header.base_offset >= end:
                break
            batch = view[position : position + header.size]
            out += [(r, i) for i, r in enumerate(batchfmt.iter_records(batch))]
            position += header.size
        return out

    def _give(self, slot: _Slot, room: int) -> bool:
        wanted = [slot.todo.popleft() for _ in range(min(room, len(slot.todo)))]
        result = self._send(slot, wanted)
        if result is None:
            return True
        given = dict(zip(result.given, result.deliveries, strict=True))
        refused = [i for i in wanted if i not in given and i not in result.expired]
        if result.clipped:  # not given (room, or a suspect goes alone): ask again
            slot.todo.extendleft(reversed(refused))
            if len(slot.handed) + len(given) >= self.inflight:  # the limit, not a suspect
                self._note_full()
        for index, deliveries in given.items():
            slot.handed.add(index)
            self._ready.append(self._delivery(slot, index, deliveries))
        for index, count, reason in zip(result.expired, result.expired_counts, result.reasons,
                                        strict=True):  # fmt: skip
            self._dead_letter(slot, index, count, reason or "max.deliveries reached")
        if given:
            self._full_logged = False
        return bool(given or result.expired)

    def _delivery(self, slot: _Slot, index: int, deliveries: int) -> Delivery:
        record, position = slot.records[index]
        return Delivery(record.payload, record.key, record.producer_id, record.seq,
                        record.timestamp_us, slot.lease.exchange, record.offset, position,
                        slot.lease.slot, index, deliveries)  # fmt: skip

    def _send(self, slot: _Slot, give: list[int]) -> Settled | None:
        """One SETTLE of the slot: what is pending, plus `give`. None if the lease is lost."""
        cut = limits.work_items_per_request_max  # ranges: an even number of items
        skip, slot.skip = slot.skip[:cut], slot.skip[cut:]
        request = Settle(self.group, self.consumer_id, slot.lease.slot,
                         -1 if slot.count_sent else len(slot.records), tuple(slot.acks),
                         tuple(slot.nacks), tuple(slot.dead), tuple(give),
                         tuple(skip))  # fmt: skip
        slot.acks, slot.nacks, slot.dead = [], [], []
        result = Settled.decode(self._ask(request.encode()))
        slot.count_sent = True
        self._last_flush = time.monotonic()
        if result.lost or result.done:
            if result.lost:
                self.stats["leases_lost"] += 1
                log.warning("%s: lost the lease of slot %s", self.name, slot.lease.slot)
            self._slot = None
            return None
        return result

    def _release(self, slot: _Slot) -> None:
        if self._slot is slot:
            self._ask(ConsumerRequest(MonitorCommand.GROUP_RELEASE, self.group,
                                      self.consumer_id, slot.lease.slot).encode())  # fmt: skip
            self._slot = None

    # --- settling -----------------------------------------------------------------------------
    def _mine(self, delivery: Delivery) -> _Slot | None:
        slot = self._slot
        if slot is None or slot.lease.slot != delivery.slot:
            return None
        slot.handed.discard(delivery.index)
        return slot

    def ack(self, delivery: Delivery) -> None:
        self.stats["acked"] += 1
        slot = self._mine(delivery)
        if slot is None:  # its lease is gone: tell the monitor anyway, the work is done
            self._settle_elsewhere(delivery, acks=(delivery.index,))
            return
        slot.acks.append(delivery.index)
        self._flush_if_due()

    def nack(self, delivery: Delivery, delay_s: float | None, reason: str) -> None:
        self.stats["nacked"] += 1
        slot = self._mine(delivery)
        if slot is None:
            return  # the lease is gone: it will be handed out again anyway
        delay_ms = -1 if delay_s is None else int(min(max(delay_s, 0.0) * 1000,
                                                      limits.work_delay_max_ms))  # fmt: skip
        slot.nacks.append(Nack(delivery.index, delay_ms, reason[: limits.work_reason_chars_max]))
        self._flush_if_due()

    def in_progress(self, delivery: Delivery) -> None:
        delivery._consumer = self  # not settled by this
        if self._mine(delivery) is not None and self._slot is not None:
            self._slot.handed.add(delivery.index)
            self._send(self._slot, [])

    def reject(self, delivery: Delivery, reason: str) -> None:
        self.stats["rejected"] += 1
        slot = self._mine(delivery)
        self._publish_dead(delivery, reason or "rejected")
        if slot is None:
            self._settle_elsewhere(delivery, dead=(delivery.index,))
            return
        slot.dead.append(delivery.index)
        self._flush_if_due()

    def _settle_elsewhere(self, delivery: Delivery, acks: tuple[int, ...] = (),
                          dead: tuple[int, ...] = ()) -> None:  # fmt: skip
        request = Settle(self.group, self.consumer_id, delivery.slot, acks=acks, dead=dead)
        self._ask(request.encode())

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= limits.work_ack_flush_ms / 1000:
            self.flush()

    def flush(self) -> None:
        """Send the settlements waiting here; on return the monitor has them (durably)."""
        slot = self._slot
        if slot is not None and slot.pending():
            self._send(slot, [])

    # --- dead letters -------------------------------------------------------------------------
    def _dead_letter(self, slot: _Slot, index: int, count: int, reason: str) -> None:
        delivery = self._delivery(slot, index, count)
        self._publish_dead(delivery, reason)
        slot.dead.append(index)

    def _publish_dead(self, delivery: Delivery, reason: str) -> None:
        queue = self.settings.dead_letters
        if self._dlq is None:
            self._dlq = self._dead_letter_publisher(queue)
        document = {
            "Queue": self.queue, "Group": self.group, "Exchange": delivery.exchange,
            "Offset": delivery.offset, "Record": delivery.record, "Slot": delivery.slot,
            "Index": delivery.index, "Deliveries": delivery.deliveries,
            "Reason": reason[: limits.work_reason_chars_max], "Key": delivery.key,
            "Producer": delivery.producer_id, "Seq": delivery.seq,
            "Timestamp": delivery.timestamp_us, "Payload": delivery.payload,
        }  # fmt: skip
        self._dlq.send(bson.encode(document), delivery.key)
        self._dlq.flush()  # on the dead-letter queue before the message is settled
        self.stats["dead_lettered"] += 1
        log.warning("%s: message %s#%d (exchange %s, offset %d) to %s after %d deliveries: %s",
                    self.name, delivery.slot, delivery.index, delivery.exchange,
                    delivery.offset, queue, delivery.deliveries, reason)  # fmt: skip

    def _dead_letter_publisher(self, queue: str) -> Publisher:
        gcm, zk, namespace = self._locate
        if gcm is None and zk is None:
            raise RoqError(f"{self.name}: dead letters need the GCM (gcm= or zk=)")
        with AdminClient(gcm=gcm, zk=zk, namespace=namespace) as admin:
            try:
                admin.create_queue(queue)
            except AdminRefused as error:
                if error.reason != "already_exists":
                    raise
        return Publisher(queue, gcm=gcm, zk=zk, namespace=namespace, acks="leader")

    # --- the end ------------------------------------------------------------------------------
    def close(self) -> None:
        """Settle what is pending, give the slot back, leave the group."""
        try:
            if self._slot is not None:
                self.flush()
                if self._slot is not None:
                    self._release(self._slot)
            self._requests.request(ConsumerRequest(MonitorCommand.GROUP_LEAVE, self.group,
                                                   self.consumer_id).encode())  # fmt: skip
        except RoqError as error:
            log.warning("%s: leaving: %s", self.name, error)
        finally:
            if self._dlq is not None:
                self._dlq.close()
            self._requests.close()
            self._context.term()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ranges(indices: set[int]) -> list[int]:
    """Sorted indices as flattened [lo, hi) ranges (as the monitor keeps settled ones)."""
    out: list[int] = []
    for i in sorted(indices):
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out += [i, i + 1]
    return out


def _expand(flat: tuple[int, ...]) -> Iterator[int]:
    for lo, hi in zip(flat[::2], flat[1::2], strict=True):
        yield from range(lo, hi)
