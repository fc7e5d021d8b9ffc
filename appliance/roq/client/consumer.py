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

TTL and delay (docs/guarantees.md, "TTL and delay"): a message past its `expires_at_us` when it
would be handed to the application is not: it is settled as expired (`stats["expired"]`, the
group's `roq_group_expired_total`; not dead-lettered: its publisher said it is worthless by then)
and given to `on_expired` if set (a request/response Worker ends its task `expired`). A message
whose `not_before_us` has not come is put off (`Settle`'s Defer): the monitor hands it to no
consumer before then, and the rest of its slot goes on (in an ordered group, nothing after it).

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
from roq.backoff import Backoff
from roq.client.admin import AdminClient, AdminRefused
from roq.client.locate import MonitorAddress, locate_monitor
from roq.client.publisher import Publisher
from roq.client.stop import Grace
from roq.client.timing import early_us, expired, now_us
from roq.errors import CorruptRecord, ProtocolError, RoqError, Stopped, TransportError
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import MonitorCommand
from roq.protocol.keyparts import key_part
from roq.protocol.messages.groups import (
    ConsumerRequest,
    Defer,
    GroupJoin,
    HeldAnswer,
    Joined,
    Lease,
    Nack,
    Settle,
    Settled,
    Tail,
    expand,
    lease_reply,
    pack_ids,
    ranges,
    written,
)
from roq.protocol.ports import MonitorPort
from roq.transport import (
    Kind,
    connect,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
    wait_readable,
)
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
    meta: batchfmt.RecordMeta | None = None  # headers, id, times (log format v2); carried only
    _consumer: Consumer | None = field(default=None, repr=False)

    @property
    def headers(self) -> batchfmt.Headers:
        return () if self.meta is None else self.meta.headers

    @property
    def message_id(self) -> bytes | None:
        """The publisher's id, or None: the message is then identified by (producer_id, seq)."""
        return None if self.meta is None else self.meta.message_id

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
    early: set[int] = field(default_factory=set)  # not due yet when read: never handed out
    defer: list[Defer] = field(default_factory=list)  # ... to tell the monitor
    lapsed: list[int] = field(default_factory=list)  # past their expiry: to settle so
    dropped: set[int] = field(default_factory=set)  # past their expiry when read, duplicates
    ids: list[tuple[int, bytes]] = field(default_factory=list)  # (index, message id) to send

    def pending(self) -> bool:
        return bool(self.acks or self.nacks or self.dead or self.skip or self.timed())

    def timed(self) -> bool:
        """Deferred or expired messages the monitor has not been told of yet."""
        return bool(self.defer or self.lapsed)


@dataclass(frozen=True)
class _Unconfirmed:
    """A settle answered but not yet said to be in ZooKeeper."""

    seq: int
    slot: str
    acks: tuple[int, ...]
    dead: tuple[int, ...]
    skip: tuple[int, ...]


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
        held: bool = False,
        on_expired: Callable[[Delivery], None] | None = None,
        priority: int = 0,
        single_active: bool = False,
        key_ordered: bool = False,
    ):
        self.queue, self.group = queue, group
        self._on_expired = on_expired  # told of each message dropped past its expiry
        # idle, ask with a LEASE the monitor may hold instead of sleeping (a request/response
        # Worker: a requester's wait wakes it as soon as a request is published)
        self._held = held
        self.consumer_id = uuid.uuid4().hex
        self.name = f"consumer {self.consumer_id[:8]} of {queue}/{group}"
        self._locate = (gcm, zk, namespace)
        self.monitor = (
            MonitorAddress(monitor)
            if monitor
            else locate_monitor(queue, gcm, zk, namespace, need="consume")
        )
        self._context = new_context()
        self._requests = Requester(
            self._context, self.monitor.at(MonitorPort.PLACEMENT), limits.work_request_timeout_ms
        )
        self.stats: collections.Counter[str] = collections.Counter()
        self._slot: _Slot | None = None  # the slot handing out messages
        # slots whose every message was handed out, waiting for the application to settle
        # them: another slot is leased meanwhile while `inflight` leaves room (a Worker running
        # several requests at once), at most `limits.work_parked_slots_max`
        self._parked: dict[str, _Slot] = {}
        self._ready: collections.deque[Delivery] = collections.deque()
        self._dlq: Publisher | None = None
        self._grace: Grace | None = None  # `stop_with`
        self._last_flush = time.monotonic()
        self._full_logged = False
        self._seq = 0  # numbers this consumer's settles; a reply's Written confirms up to one
        self._epoch = ""  # the monitor's life, as its last reply said
        # settles answered but not yet in ZooKeeper: sent again to a monitor that restarted
        self._unconfirmed: collections.deque[_Unconfirmed] = collections.deque()
        self._tails: tuple[Tail, ...] = ()  # from the last answer without a slot
        self._readers: dict[str, Any] = {}  # log endpoint → its DEALER (one read in flight)
        # priority: while a live consumer of a higher one has room, this one gets no new slot;
        # single_active: a new group hands out to one consumer at a time (monitor/selection.py);
        # key-ordered (monitor/keyed.py): a slot is one key part's records of a log's range; a
        # consumer holding several parts reads each range once (the last few kept)
        parts = limits.work_key_parts if key_ordered else 0
        self._ranges: collections.OrderedDict[tuple[str, str, int, int], list[Any]] = (
            collections.OrderedDict()
        )
        self._join_doc = GroupJoin(group, self.consumer_id, start, ordered, prefix, priority,
                                   inflight or 0, single_active, parts).encode()  # fmt: skip
        self.settings = Joined.decode(self._ask(self._join_doc))
        self.prefix = self.settings.prefix  # the group's, whatever this consumer asked
        self.inflight = min(inflight or self.settings.inflight, self.settings.inflight)

    # --- requests to the monitor --------------------------------------------------------------
    def stop_with(self, stop: threading.Event) -> None:
        """Once `stop` is set (its owner stops: Ctrl-C), requests to the monitor get
        limits.work_stop_grace_s more, then end (RoqError): a consumer whose monitor is gone
        (its queue stopped or deleted) stops within a second, not after work_monitor_wait_s,
        and one whose monitor answers still settles, releases and leaves."""
        # after a running command's own grace (its outcome is what it settles): from first look
        self._grace = Grace(stop, limits.work_stop_grace_s, from_stop=False)

    def _stopping(self) -> bool:
        """True once the stop's grace is over (see `stop_with`)."""
        return self._grace is not None and self._grace.over()

    def _ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        """One request; a monitor that does not answer, is busy (ZooKeeper) or fenced (its host
        lost its lease) is asked again (it may be restarting, or have moved: then the GCM is
        asked where), for at most 30 s, or until the stop's grace is over (`stop_with`)."""
        deadline = time.monotonic() + limits.work_monitor_wait_s
        while True:
            if self._stopping():
                raise Stopped(f"{self.name}: stopped before the monitor answered")
            try:
                reply = self._requests.request(doc, cancelled=self._stopping)
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
            found = locate_monitor(self.queue, gcm, zk, namespace, quick=True, need="consume")
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
        pause = Backoff(limits.work_poll_min_ms / 1000, limits.work_poll_ms / 1000)
        while not self._ready or self._lapsed(self._ready[0]):
            if self._ready:
                continue  # the one at the head expired while it waited: dropped
            if self._step():
                pause.reset()
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None
            # held: read where an answer named at once, or ask again after the monitor held it
            if (
                self._held
                and self._slot is None
                and self._handed() < self.inflight
                and (self._tails or self._wait_held(deadline))
            ):
                continue
            # An idle consumer asks again soon, then less often (bounded): it picks up a slot
            # cut for it within a few ms, and a crowd of idle ones costs the monitor little.
            time.sleep(pause.next_s())
        delivery = self._ready.popleft()
        delivery._consumer = self
        self.stats["received"] += 1
        return delivery

    def _lapsed(self, delivery: Delivery) -> bool:
        """Whether `delivery` (at the head of _ready) is past its expiry: then it is dropped,
        settled as expired, and counted."""
        if not expired(delivery.meta, now_us()):
            return False
        self._ready.popleft()
        slot = self._mine(delivery)
        self._expire(delivery)
        if slot is not None:
            slot.lapsed.append(delivery.index)
            self._settled(slot)
        return True

    def _expire(self, delivery: Delivery) -> None:
        self.stats["expired"] += 1
        if self._on_expired is not None:
            self._on_expired(delivery)

    def _wait_held(self, deadline: float | None) -> bool:
        """Instead of the idle sleep: a LEASE the monitor holds for up to work_poll_ms. True
        if it was held (`Held`: its wait ended, or a requester's wait woke it) or brought a
        slot; False if answered at once (a monitor of an older version, or at its bound of
        held LEASEs): then the caller sleeps as before."""
        wait_ms = limits.work_lease_wait_max_ms
        if deadline is not None:
            wait_ms = min(wait_ms, int((deadline - time.monotonic()) * 1000))
        if wait_ms <= 0:
            return False
        request = ConsumerRequest(MonitorCommand.GROUP_LEASE, self.group, self.consumer_id,
                                  give=self._window(), wait_ms=wait_ms).encode()  # fmt: skip
        reply = self._ask(request)
        held, woken = HeldAnswer.flags(reply)
        self.stats["held"] += 1
        self.stats["woken"] += woken
        return self._open(reply) or held

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
        room = self.inflight - self._handed()
        if self._slot is None:
            return room > 0 and self._take_slot()
        slot = self._slot
        if slot.todo and room > 0:
            return self._give(slot, room)
        if slot.todo:
            self._note_full()
            self._flush_soon()
            return False
        if slot.handed:
            if room > 0 and len(self._parked) < limits.work_parked_slots_max:
                self._parked[slot.lease.slot] = slot  # settled later, by the application
                self._slot = None
                return self._take_slot()
            self._flush_if_due()
            return False
        return self._finish(slot)

    def _handed(self) -> int:
        """Messages handed to the application and not settled yet, in every slot held."""
        current = len(self._slot.handed) if self._slot is not None else 0
        return current + sum(len(slot.handed) for slot in self._parked.values())

    def _slots(self) -> list[_Slot]:
        held = list(self._parked.values())
        return held if self._slot is None else [self._slot, *held]

    def _finish_parked(self, slot: _Slot) -> None:
        """A parked slot's last message was settled: its last settle releases it."""
        if self._parked.get(slot.lease.slot) is slot and not slot.handed:
            del self._parked[slot.lease.slot]
            self._send(slot, [], release=True)

    def _finish(self, slot: _Slot) -> bool:
        """The slot's last settle, its release and the next lease in one request (one round
        trip per slot, not three)."""
        result = self._send(slot, [], release=True, next_give=self._window())
        self._slot = None
        if result.next is None:
            return True
        return self._open(result.next)

    def _note_full(self) -> None:
        self.stats["inflight_full"] += 1
        if not self._full_logged:
            self._full_logged = True
            log.warning("%s: %d messages in flight, its limit: no more until some are acked, "
                        "nacked or rejected", self.name, self.inflight)  # fmt: skip

    # --- slots --------------------------------------------------------------------------------
    def _window(self) -> int:
        """Messages to have handed out with a lease. A group with a key prefix first settles
        what is outside it (its consumers ask for the rest once they read the slot)."""
        return 0 if self.prefix else self.inflight

    def _lease_request(self, seen: tuple[Tail, ...]) -> dict[str, Any]:
        return ConsumerRequest(MonitorCommand.GROUP_LEASE, self.group, self.consumer_id,
                               give=self._window(), seen=seen).encode()  # fmt: skip

    def _take_slot(self) -> bool:
        """Lease a slot. With none free the monitor names where each live log's open range
        starts: read there, and a log that grew since its exchange's last report (500 ms
        apart) is cut for this consumer at once."""
        if not self._tails and self._open(self._ask(self._lease_request(()))):
            return True
        seen, self._tails = self._probe(self._tails), ()
        return bool(seen) and self._open(self._ask(self._lease_request(seen)))

    def _open(self, reply: dict[str, Any]) -> bool:
        """Take the slot a LEASE answer (or a SETTLE's Next) names: read it, hand out its
        window. False when it named none (its Tails are kept for `_take_slot`)."""
        found = lease_reply(reply)
        if not isinstance(found, Lease):
            self._tails = found
            return False
        lease = found
        records = self._read(lease)
        if records is None:  # its log does not answer: give it back, another may read it
            self._ask(ConsumerRequest(MonitorCommand.GROUP_RELEASE, self.group,
                                      self.consumer_id, lease.slot).encode())  # fmt: skip
            return False
        settled = set(expand(lease.settled))
        skip = self._outside_prefix(records, settled)
        slot = _Slot(lease, records, collections.deque(), skip=ranges(skip))
        self._timing(slot, settled | skip)
        if slot.ids and not self._deduplicate(slot):
            return True  # the lease is gone, or every message was settled meanwhile
        slot.todo.extend(
            i for i in range(len(records))
            if i not in settled and i not in skip and i not in slot.early
            and i not in slot.dropped
        )  # fmt: skip
        self._slot = slot
        todo = slot.todo
        self.stats["slots"] += 1
        self.stats["skipped"] += len(skip)
        if lease.window is not None:  # the monitor considered the `Give` asked for
            window = self._window()
            if lease.count < 0:  # a slot never read: its first `Give` indices
                wanted = [i for i in todo if i < window]
                slot.todo = collections.deque(i for i in todo if i >= window)
            else:  # its first `Give` messages not settled (a part of a split slot's too)
                wanted = [slot.todo.popleft() for _ in range(min(window, len(slot.todo)))]
            self._accept(slot, wanted, lease.window)
        # The count goes with the first acks, unless the window went past the slot's end (the
        # monitor counts those as in flight until it knows): then at once, as do the skips.
        past_end = lease.count < 0 and lease.window is not None and len(records) < self._window()
        while self._slot is slot and (slot.skip or slot.timed() or not slot.count_sent):
            if not (slot.skip or slot.timed() or past_end) and (slot.handed or slot.todo):
                break
            self._send(slot, [])
        return True

    def _timing(self, slot: _Slot, settled: set[int]) -> None:
        """The slot's messages past their expiry (settled as such) and those not due yet (put
        off until their not-before time), among those not `settled`. In an ordered group
        every message after one not due is put off with it (a lease's window may have given
        them already): none goes before it. The message ids of the others are noted for the
        group's de-duplication (`_deduplicate`), in the same pass: a record without a meta
        (v1, or no id, TTL nor delay) costs nothing more."""
        now, hold_ms, dedup = now_us(), 0, self.settings.dedup
        for index, (record, _) in enumerate(slot.records):
            meta = record.meta
            if index in settled or (meta is None and not hold_ms):
                continue
            if expired(meta, now):
                slot.lapsed.append(index)
                slot.dropped.add(index)
                self._expire(self._delivery(slot, index, 0))
                continue
            if dedup and meta is not None and meta.message_id is not None:
                slot.ids.append((index, meta.message_id))
            if (wait_us := early_us(meta, now)) or hold_ms:
                until_ms = (now + wait_us + 999) // 1000 if wait_us else hold_ms
                until_ms = min(until_ms, now // 1000 + limits.work_defer_max_ms)
                slot.early.add(index)
                slot.defer.append(Defer(index, until_ms))
                if self.settings.ordered:
                    hold_ms = max(hold_ms, until_ms)
        self.stats["deferred"] += len(slot.early)

    def _deduplicate(self, slot: _Slot) -> bool:
        """Send the ids of the slot's messages before handing any of them out: the monitor
        settles those its group's window has from another place (a batch re-sent to another
        exchange, docs/guarantees.md), and this consumer hands none of them out. False if the
        slot is gone meanwhile (its lease lost, or every message settled)."""
        ids, most = slot.ids, limits.work_dedup_ids_per_request_max
        slot.ids = []
        for at in range(0, len(ids), most):
            result = self._send(slot, [], ids=pack_ids(ids[at : at + most]))
            if result.lost or result.done:
                return False
            found = set(expand(result.duplicates))
            slot.dropped |= found
            self.stats["duplicates"] += len(found)
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

    def _reader(self, endpoint: str) -> Any:
        """A DEALER per log server, kept: a connection per slot cost a TCP handshake each."""
        reader = self._readers.get(endpoint)
        if reader is None:
            if len(self._readers) >= limits.work_tail_exchanges_max:
                self._close_readers()
            reader = open_socket(
                self._context,
                Kind.DEALER,
                sndhwm=limits.log_reader_hwm,
                rcvhwm=limits.log_reader_hwm,
            )
            connect(reader, endpoint)
            self._readers[endpoint] = reader
        return reader

    def _drop_reader(self, endpoint: str) -> None:
        """After a timeout: its late answer must not be taken for the next read's."""
        reader = self._readers.pop(endpoint, None)
        if reader is not None:
            reader.close(0)

    def _close_readers(self) -> None:
        for endpoint in list(self._readers):
            self._drop_reader(endpoint)

    def _read(self, lease: Lease) -> list[tuple[batchfmt.Record, int]] | None:
        """The slot's records (in a key-ordered group, those of its key part): read from the log
        server by offset, or kept from another part's slot of the same range (None if the log
        server does not answer)."""
        if lease.part < 0:
            return self._read_range(lease)
        where = (lease.endpoint, lease.leader, lease.start, lease.end)
        records = self._ranges.get(where)
        if records is None:
            records = self._read_range(lease)
            if records is None:
                return None
            self._ranges[where] = records
            while len(self._ranges) > limits.work_key_read_cache_max:
                self._ranges.popitem(last=False)
        parts = self.settings.key_parts
        return [(r, i) for r, i in records if key_part(r.key, parts) == lease.part]

    def _read_range(self, lease: Lease) -> list[tuple[batchfmt.Record, int]] | None:
        reader = self._reader(lease.endpoint)
        records: list[tuple[batchfmt.Record, int]] = []
        offset = lease.start
        while offset < lease.end:
            data, offset = self._read_once(reader, lease, offset)
            if data is None:
                self._drop_reader(lease.endpoint)
                return None
            records += self._records(data, lease.end)
        return records

    def _read_once(self, reader: Any, lease: Lease, offset: int) -> tuple[bytes | None, int]:
        request = dataplane.read_request(offset, leader=lease.leader)
        if not send_nowait(reader, request):
            return None, offset
        reply = self._read_reply(reader, time.monotonic() + limits.work_read_timeout_ms / 1000)
        if reply is None:
            log.warning("%s: the log at %s did not answer for slot %s", self.name,
                        lease.endpoint, lease.slot)  # fmt: skip
            return None, offset
        if reply.status == dataplane.READ_ERROR or reply.status == dataplane.READ_NOTHING_YET:
            log.warning("%s: slot %s not readable at %d (%r)", self.name, lease.slot, offset,
                        reply.data[:200])  # fmt: skip
            return None, offset
        if reply.status == dataplane.READ_EVICTED:  # retention took it: nothing to hand out
            self.stats["evicted_bytes"] += reply.next_offset - offset
            return b"", max(reply.next_offset, offset)
        return reply.data, reply.next_offset

    def _read_reply(self, reader: Any, deadline: float) -> dataplane.ReadReply | None:
        """The answer to the read in flight on `reader`, or None (none by `deadline`, or bad)."""
        while True:
            frames = recv_nowait(reader)
            if frames is not None:
                break
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not wait_readable(reader, left_ms):
                return None
        try:
            return dataplane.parse_read_reply(frames)
        except ProtocolError as error:
            log.warning("%s: bad log reply: %s", self.name, error)
            return None

    @staticmethod
    def _slot_end(data: bytes, messages: int) -> int:
        """Where the batches in `data` first hold `messages` records (0: they hold fewer): a
        slot cut on demand is no bigger than a full one, so a burst is still shared."""
        view, position, held = memoryview(data), 0, 0
        while position < len(view):
            try:
                header = batchfmt.check_batch(view, position)
            except CorruptRecord:
                return 0
            position += header.size
            held += header.count
            if held >= messages:
                return header.base_offset + header.size
        return 0

    def _probe(self, tails: tuple[Tail, ...]) -> tuple[Tail, ...]:
        """Read each live log where the group's open range starts, all reads in flight at
        once: where what it holds ends (whole batches) is where the monitor may cut now."""
        sent: list[tuple[Tail, Any]] = []
        for tail in tails[: limits.work_tail_exchanges_max]:
            if tail.endpoint in {t.endpoint for t, _ in sent}:
                continue  # one read in flight per log server
            reader = self._reader(tail.endpoint)
            request = dataplane.read_request(tail.offset, limits.work_tail_read_bytes)
            if send_nowait(reader, request):
                sent.append((tail, reader))
        deadline = time.monotonic() + limits.work_tail_timeout_ms / 1000
        seen = []
        for tail, reader in sent:
            reply = self._read_reply(reader, deadline)
            if reply is None:
                self._drop_reader(tail.endpoint)
            elif reply.status == dataplane.READ_EVICTED and reply.next_offset > tail.offset:
                seen.append(Tail(tail.exchange, offset=reply.next_offset))
            elif reply.status == dataplane.READ_BATCHES and reply.next_offset > tail.offset:
                end = self._slot_end(reply.data, self.settings.slot_messages) or reply.next_offset
                seen.append(Tail(tail.exchange, offset=end))
        self.stats["tail_reads"] += len(sent)
        return tuple(seen)

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
        if result.lost or result.done:
            return True
        return self._accept(slot, wanted, result)

    def _accept(self, slot: _Slot, wanted: list[int], result: Settled) -> bool:
        """Hand out what the monitor gave of `wanted`; dead-letter what expired. Indices past
        the slot's end (a LEASE's window is given before the slot is read) are ignored: the
        count this consumer sends makes the monitor forget them."""
        count = len(slot.records)
        given = {i: n for i, n in zip(result.given, result.deliveries, strict=True) if i < count}
        expired = [
            (i, n, r)
            for i, n, r in zip(result.expired, result.expired_counts, result.reasons, strict=True)
            if i < count
        ]
        gone = {i for i, _, _ in expired}
        refused = [i for i in wanted if i not in given and i not in gone]
        if result.clipped:  # not given (room, or a suspect goes alone): ask again
            slot.todo.extendleft(reversed(refused))
            if len(slot.handed) + len(given) >= self.inflight:  # the limit, not a suspect
                self._note_full()
        for index, deliveries in given.items():
            if index in slot.early or index in slot.dropped:
                continue  # given by a lease's window before it was read: put off or expired
            slot.handed.add(index)
            self._ready.append(self._delivery(slot, index, deliveries))
        for index, deliveries, reason in expired:
            self._dead_letter(slot, index, deliveries, reason or "max.deliveries reached")
        if given:
            self._full_logged = False
        return bool(given or expired)

    def _delivery(self, slot: _Slot, index: int, deliveries: int) -> Delivery:
        record, position = slot.records[index]
        return Delivery(record.payload, record.key, record.producer_id, record.seq,
                        record.timestamp_us, slot.lease.exchange, record.offset, position,
                        slot.lease.slot, index, deliveries, record.meta)  # fmt: skip

    def _send(self, slot: _Slot, give: list[int], *, release: bool = False,
              next_give: int = -1, sync: bool = False, ids: bytes = b"") -> Settled:  # fmt: skip
        """One SETTLE of the slot: what is pending, plus `give`. Its answer comes before the
        monitor wrote it (`Written` confirms it later, or at once with `sync`). The slot is
        dropped here when its lease is lost or it is done."""
        cut = limits.work_items_per_request_max  # ranges: an even number of items
        skip, slot.skip = slot.skip[:cut], slot.skip[cut:]
        defer, slot.defer = slot.defer[:cut], slot.defer[cut:]
        lapsed, slot.lapsed = slot.lapsed[:cut], slot.lapsed[cut:]
        self._seq += 1
        request = Settle(self.group, self.consumer_id, slot.lease.slot,
                         -1 if slot.count_sent else len(slot.records), tuple(slot.acks),
                         tuple(slot.nacks), tuple(slot.dead), tuple(give), tuple(skip),
                         self._seq, sync, release, next_give, tuple(defer),
                         tuple(lapsed), ids)  # fmt: skip
        if request.acks or request.dead or request.skip:
            self._unconfirmed.append(
                _Unconfirmed(self._seq, slot.lease.slot, request.acks, request.dead, request.skip)
            )
        slot.acks, slot.nacks, slot.dead = [], [], []
        result = Settled.decode(self._ask(request.encode()))
        slot.count_sent = True
        self._last_flush = time.monotonic()
        if result.lost or result.done:
            if result.lost and not result.done:
                self.stats["leases_lost"] += 1
                log.warning("%s: lost the lease of slot %s", self.name, slot.lease.slot)
            self._drop(slot)
        self._confirmed(result)
        return result

    def _confirmed(self, result: Settled) -> None:
        """Forget the settles the monitor says it wrote. A monitor of another life (restarted,
        moved) may lack what the last one had not written yet: those go again, and wait."""
        if self._epoch and result.epoch and result.epoch != self._epoch:
            self._epoch = result.epoch
            self._resend()
            return
        self._epoch = result.epoch or self._epoch
        while self._unconfirmed and self._unconfirmed[0].seq <= result.written:
            self._unconfirmed.popleft()
        if len(self._unconfirmed) > limits.work_unconfirmed_max:
            self._sync()

    def _resend(self) -> None:
        again, self._unconfirmed = list(self._unconfirmed), collections.deque()
        log.warning("%s: the monitor restarted: %d settle(s) sent again", self.name, len(again))
        for item in again:
            self._seq += 1
            request = Settle(self.group, self.consumer_id, item.slot, acks=item.acks,
                             dead=item.dead, skip=item.skip, seq=self._seq, sync=True)  # fmt: skip
            self._ask(request.encode())

    def _sync(self) -> None:
        """Wait until every settle sent is in ZooKeeper (a SETTLE with nothing but Sync)."""
        if not self._unconfirmed:
            return
        self._seq += 1
        request = Settle(self.group, self.consumer_id, self._unconfirmed[-1].slot,
                         seq=self._seq, sync=True)  # fmt: skip
        reply = self._ask(request.encode())
        result = Settled.decode(reply) if "Given" in reply else Settled()
        if result.epoch and self._epoch and result.epoch != self._epoch:
            self._epoch = result.epoch
            self._resend()
            return
        stored = written(reply)
        while self._unconfirmed and self._unconfirmed[0].seq <= stored:
            self._unconfirmed.popleft()

    def _drop(self, slot: _Slot) -> None:
        if self._slot is slot:
            self._slot = None
        if self._parked.get(slot.lease.slot) is slot:
            del self._parked[slot.lease.slot]

    def _release(self, slot: _Slot) -> None:
        if slot in self._slots():
            self._ask(ConsumerRequest(MonitorCommand.GROUP_RELEASE, self.group,
                                      self.consumer_id, slot.lease.slot).encode())  # fmt: skip
            self._drop(slot)

    # --- settling -----------------------------------------------------------------------------
    def _mine(self, delivery: Delivery) -> _Slot | None:
        slot = self._parked.get(delivery.slot)
        if slot is None:
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
        self._settled(slot)

    def nack(self, delivery: Delivery, delay_s: float | None, reason: str) -> None:
        self.stats["nacked"] += 1
        slot = self._mine(delivery)
        if slot is None:
            return  # the lease is gone: it will be handed out again anyway
        delay_ms = -1 if delay_s is None else int(min(max(delay_s, 0.0) * 1000,
                                                      limits.work_delay_max_ms))  # fmt: skip
        slot.nacks.append(Nack(delivery.index, delay_ms, reason[: limits.work_reason_chars_max]))
        self._settled(slot)

    def in_progress(self, delivery: Delivery) -> None:
        delivery._consumer = self  # not settled by this
        slot = self._mine(delivery)
        if slot is not None:
            slot.handed.add(delivery.index)
            self._send(slot, [])

    def reject(self, delivery: Delivery, reason: str) -> None:
        self.stats["rejected"] += 1
        slot = self._mine(delivery)
        self._publish_dead(delivery, reason or "rejected")
        if slot is None:
            self._settle_elsewhere(delivery, dead=(delivery.index,))
            return
        slot.dead.append(delivery.index)
        self._settled(slot)

    def _settled(self, slot: _Slot) -> None:
        if slot is not self._slot and not slot.handed:
            self._finish_parked(slot)
        else:
            self._flush_if_due()

    def _settle_elsewhere(self, delivery: Delivery, acks: tuple[int, ...] = (),
                          dead: tuple[int, ...] = ()) -> None:  # fmt: skip
        self._seq += 1
        request = Settle(self.group, self.consumer_id, delivery.slot, acks=acks, dead=dead,
                         seq=self._seq, sync=True)  # fmt: skip
        self._ask(request.encode())

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= limits.work_ack_flush_ms / 1000:
            self._flush_soon()

    def flush(self) -> None:
        """Send the settlements waiting here; on return the monitor has them (durably), and
        every one sent before."""
        for slot in self._slots():
            if slot.pending():
                self._send(slot, [], sync=True)
        self._sync()

    def _flush_soon(self) -> None:
        """Acks on the wire (answered before they are written: confirmed by a later answer)."""
        for slot in self._slots():
            if slot.pending():
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
        meta = delivery.meta  # a dead letter keeps the message's headers, id and times
        if meta is None:
            self._dlq.send(bson.encode(document), delivery.key)
        else:
            self._dlq.send(bson.encode(document), delivery.key, headers=meta.headers,
                           message_id=meta.message_id, expires_at_us=meta.expires_at_us,
                           not_before_us=meta.not_before_us)  # fmt: skip
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
            if self._slots():
                self.flush()
                for slot in self._slots():
                    self._release(slot)
            self._requests.request(ConsumerRequest(MonitorCommand.GROUP_LEAVE, self.group,
                                                   self.consumer_id).encode(),
                                   cancelled=self._stopping)  # fmt: skip
        except RoqError as error:
            log.warning("%s: leaving: %s", self.name, error)
        finally:
            if self._dlq is not None:
                self._dlq.close()
            self._close_readers()
            self._requests.close()
            self._context.term()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
