"""Publisher: sends messages to a logical queue, in batches, and survives exchange moves.

    with Publisher("q1", gcm="127.0.0.1:5000") as pub:
        pub.send(b"hello", key=b"news")
        pub.flush()                     # everything sent so far has reached an exchange

Threads. The caller's threads call `send`, `flush` and `close`; under one lock they touch Python
buffers and send a wake-up on the caller's end of an inproc PAIR (the only socket they use). One
I/O thread, started by the constructor, owns every other ZeroMQ socket: the DEALER to the current
exchange, the REQ and SUB to the queue's monitor, and its end of the inproc wake-up pair.

Batching. Messages for one routing key accumulate until their payloads reach `batch_bytes`
or the oldest has waited `linger_ms`; then they are encoded once, in the log's record-batch
format, and sent as one frame. `linger_ms=0` makes no message wait for others: the I/O thread
takes whatever is pending as soon as it can, so an idle publisher sends each message on its own
and a busy one sends what arrived while it was sending as one batch (Kafka's `linger.ms=0`).
`batch_bytes=1` makes every message its own batch and frame, whatever the load.

Sequence numbers count per (publisher, routing key) from 0; subscribers use them to restore
order across a move and to drop duplicates.

Back-pressure (never a silent drop). Encoded batches wait in a buffer of `buffer_bytes` (and at
most `limits.publisher_pending_batches_max` batches) for the socket; ZeroMQ queues at most
`limits.data_hwm_messages` batches per connection and then pushes back through TCP. When the
buffer is full, `send` blocks up to `block_ms` (`on_full="block"`, the default) and then raises
`PublishTimeout`, or raises `BufferFull` at once (`on_full="raise"`). Either way a message whose
`send` raised was not queued, so sending it again makes no duplicate.

Moves. When the monitor re-allocates this publisher, or its exchange leaves, the I/O thread
stops sending, asks the old exchange to drain (every batch sent before the drain request has
been forwarded to subscribers when the answer comes), and only then connects to the new exchange.
When the monitor declares the exchange dead instead, the drain gets only
`limits.publisher_dead_drain_ms` (an exchange that was merely slow then loses nothing); if it
does not answer, batches it had not forwarded are lost unless `acks` asked for confirmations:
every unconfirmed batch (up to `limits.unconfirmed_batches_max`) is then sent again to the new
exchange, in order and before any newer batch, and subscribers drop the duplicates by sequence
number.

A lost host takes the monitor and the exchange together, and no one is left to say the exchange
died. A publisher whose confirmations (`acks`) or whose flush's drain have not come for
`publisher_monitor_check_first_ms` asks the GCM where the monitor is, and asks again while the
stall lasts, each time twice as long after the last, up to `publisher_monitor_check_max_ms`
apart. The questions go through a `MonitorLocator` (client/locate.py): one in flight at a time,
in a thread of its own, so a GCM that does not answer (a dead leader ZooKeeper still names)
never holds up this publisher's sockets; the I/O thread takes the answer on a later turn. Once
the GCM re-placed the monitor it names another address (from the moment its record is
written), and the publisher listens to the new monitor, fails over as from a dead exchange and
sends its unconfirmed batches again. A monitor that does not answer a placement request is
looked up the same way, at once. With `acks="none"` nothing is confirmed, so such a publisher
probes its exchange instead: at most once per `publisher_monitor_check_ms`, when it has sent
batches since the last probe, it sends a drain request with a token of its own (`_PROBE`) and,
when that stays unanswered, asks the GCM as above; it so follows a lost monitor without a
`flush()` (what it sent to the lost exchange meanwhile is lost, docs/guarantees.md §10).

An exchange whose disk refuses its appends (full, read-only) refuses each batch with the reason,
and its monitor tells its publishers to move (EXCHANGE_LOST, not dead, with the reason): they
drain it and are placed on an exchange that can append (docs/guarantees.md §3).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roq import limits
from roq.client.locate import (
    MonitorAddress,
    MonitorLocator,
    locate_monitor,
)
from roq.errors import AuthenticationRefused, ProtocolError, RoqError
from roq.log import format as batchfmt
from roq.protocol import bsonmsg, dataplane
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason
from roq.protocol.epoch import EpochWatch, Verdict, field_epoch
from roq.protocol.messages.monitor import (
    EVERY_PUBLISHER,
    ExchangeLost,
    Placed,
    PublisherInit,
    decode_publisher_notice,
)
from roq.protocol.ports import MonitorPort
from roq.transport import (
    READABLE,
    Kind,
    Poller,
    connect,
    disconnect,
    drained,
    open_socket,
    recv_nowait,
    send_nowait,
    subscribe,
    wait_readable,
)
from roq.transport import new_context as _new_context
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)

ACK_MODES = ("none", "leader", "all")


class PublishError(RoqError):
    taken = 0  # send_many: how many of the messages were queued before the error


def _check_size(payload: bytes) -> None:
    if len(payload) > limits.message_bytes_max:
        raise MessageTooLarge(f"message of {len(payload)} bytes exceeds {limits.message_bytes_max}")


class BufferFull(PublishError):
    pass


class PublishTimeout(PublishError):
    pass


class MessageTooLarge(PublishError):
    pass


@dataclass
class _KeyBuffer:
    payloads: list[bytes] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    size: int = 0
    since: float = 0.0


@dataclass
class _Outbound:
    token: int
    batch: bytes | None  # None: a barrier (drain request) for flush()
    count: int = 0


class Publisher:
    """A producer on one queue. Thread-safe: any thread may call send/flush/close."""

    def __init__(
        self,
        queue: str,
        *,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        monitor: str | None = None,
        batch_bytes: int = limits.publisher_batch_bytes_default,
        linger_ms: float = limits.publisher_linger_ms_default,
        buffer_bytes: int = limits.publisher_buffer_bytes_max,
        on_full: str = "block",
        block_ms: int = limits.publisher_block_ms_default,
        acks: str = "none",
    ):
        if on_full not in ("block", "raise") or acks not in ACK_MODES:
            raise ValueError(f"on_full must be block|raise and acks one of {ACK_MODES}")
        self.queue = queue
        self.producer_id = uuid.uuid4().bytes
        self.name = f"publisher {self.producer_id.hex()} on {queue}"
        self.batch_bytes = max(1, min(batch_bytes, limits.batch_bytes_max // 2))
        self.linger_s = linger_ms / 1000
        self.buffer_bytes, self.on_full, self.block_s = buffer_bytes, on_full, block_ms / 1000
        self.acks = acks
        self.monitor = (
            MonitorAddress(monitor) if monitor else locate_monitor(queue, gcm, zk, namespace)
        )
        # how to ask the GCM again where the monitor is (None: the caller named the monitor)
        self._locate = None if monitor else (gcm, zk, namespace)
        # the queue's highest assignment epoch seen (the I/O thread's): a monitor's reply or
        # notice of an older one is refused (`epochs.refused` counts them)
        self.epochs = EpochWatch(self.name, self.monitor.epoch)
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._buffers: dict[bytes, _KeyBuffer] = {}
        self._seq: dict[bytes, int] = {}
        self._outq: collections.deque[_Outbound] = collections.deque()
        self._outq_bytes = 0
        self._tokens = itertools.count(1)
        self._barriers: dict[int, threading.Event] = {}
        self._closing = False
        self._error: BaseException | None = None
        self.refused: list[str] = []  # reasons the exchange gave for refused batches
        self._refused_seen = 0
        self.sent_messages = self.sent_batches = self.confirmed_batches = 0
        self.exchange: str | None = None  # the current exchange's front address
        self.moves = 0
        self._context = _new_context()
        self._wake_endpoint = f"inproc://wake-{self.producer_id.hex()}"
        self._io = _PublisherIO(self)
        self._wake = open_socket(self._context, Kind.PAIR)
        connect(self._wake, self._wake_endpoint)
        self._placed = threading.Event()
        self._io.start()
        self._placed.wait(limits.placement_timeout_ms / 1000 + 5)
        if self._error is not None or self.exchange is None:
            self.close(timeout_s=0.1)
            raise PublishError(f"{self.name}: no exchange: {self._error or 'timed out'}")

    # --- caller side ---------------------------------------------------------------------------
    def send(self, payload: bytes, key: bytes = b"") -> None:
        """Queue one message; it leaves within `linger_ms` or when its batch is full.

        A full buffer blocks or raises *before* the message is queued: when `send` raises,
        the message was not taken."""
        _check_size(payload)
        with self._lock:
            self._check_usable()
            self._wait_for_space()
            self._append(key, payload, time.time_ns() // 1000)

    def send_many(self, payloads: Sequence[bytes], key: bytes = b"") -> None:
        """Queue several messages for one key under one lock and one timestamp: the fast path
        for a producer that has messages at hand. Messages are taken in order; if it raises
        on a full buffer, `error.taken` of them were queued and the rest were not."""
        sizes = [len(payload) for payload in payloads]
        if not sizes:
            return
        biggest = max(sizes)
        if biggest > limits.message_bytes_max:
            _check_size(payloads[sizes.index(biggest)])
        taken = 0
        with self._lock:
            stamp = time.time_ns() // 1000  # under the lock: threads' stamps in append order
            self._check_usable()
            try:
                if self.batch_bytes + biggest + 512 > limits.batch_bytes_max:
                    for payload in payloads:  # a message may not fit beside others: one by one
                        self._wait_for_space()
                        self._append(key, payload, stamp)
                        taken += 1
                    return
                ends = list(itertools.accumulate(size + batchfmt.RECORD_BYTES for size in sizes))
                while taken < len(sizes):
                    self._wait_for_space()
                    taken = self._append_run(key, payloads, ends, taken, stamp)
            except PublishError as error:
                error.taken = taken
                raise

    def flush(self, timeout_s: float = limits.drain_timeout_ms / 1000) -> None:
        """Return once every message sent before the call has reached an exchange (and, with
        acks, been confirmed); raise PublishTimeout if that takes longer than `timeout_s`."""
        with self._lock:
            self._check_usable()
            for key, buffer in list(self._buffers.items()):
                self._seal(key, buffer)
            token = next(self._tokens)
            done = self._barriers[token] = threading.Event()
            self._outq.append(_Outbound(token, None))
            self._poke()
        if not done.wait(timeout_s):
            raise PublishTimeout(f"{self.name}: flush not confirmed within {timeout_s:.1f} s")
        with self._lock:
            self._check_usable()
            fresh, self._refused_seen = self.refused[self._refused_seen :], len(self.refused)
        if fresh:
            raise PublishError(f"{self.name}: {len(fresh)} batch(es) refused: {fresh[0]}")

    def close(self, timeout_s: float = limits.drain_timeout_ms / 1000) -> None:
        """Flush (bounded), then stop the I/O thread and close every socket."""
        try:
            if self._error is None and not self._closing and self.exchange is not None:
                self.flush(timeout_s)
        finally:
            with self._lock:
                self._closing = True
                self._poke()
            self._io.join(timeout_s + 1)
            self._wake.close(0)
            self._context.term() if not self._io.is_alive() else None

    @property
    def failure(self) -> BaseException | None:
        """Why the I/O thread stopped (None while it runs): a failed publisher refuses every
        call for good, and its owner replaces it."""
        return self._error

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers (lock held) -------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._error is not None:
            raise PublishError(f"{self.name}: {self._error}") from self._error
        if self._closing:
            raise PublishError(f"{self.name} is closed")

    def _append(self, key: bytes, payload: bytes, stamp: int) -> None:
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._new_buffer(key)
        elif buffer.size + len(payload) + 512 > limits.batch_bytes_max:
            self._seal(key, buffer)  # the big message would not fit: send what is there
            buffer = self._new_buffer(key)
        buffer.payloads.append(payload)
        buffer.stamps.append(stamp)
        buffer.size += len(payload) + batchfmt.RECORD_BYTES
        if buffer.size >= self.batch_bytes:
            self._seal(key, buffer)

    def _append_run(
        self, key: bytes, payloads: Sequence[bytes], ends: list[int], start: int, stamp: int
    ) -> int:
        """Append payloads[start:] up to the one that fills the key's batch (`ends` holds the
        running total of record sizes); returns where the next run starts. One list extend per
        batch instead of one append per message: send_many's speed is the publisher's."""
        buffer = self._buffers.get(key) or self._new_buffer(key)
        before = ends[start - 1] if start else 0
        # the first record whose running total reaches batch_bytes closes the batch
        stop = min(bisect.bisect_left(ends, before + self.batch_bytes - buffer.size, start) + 1,
                   len(ends))  # fmt: skip
        buffer.payloads.extend(payloads[start:stop])
        buffer.stamps.extend(itertools.repeat(stamp, stop - start))
        buffer.size += ends[stop - 1] - before
        if buffer.size >= self.batch_bytes:
            self._seal(key, buffer)
        return stop

    def _new_buffer(self, key: bytes) -> _KeyBuffer:
        if key not in self._seq:
            if len(key) > limits.key_bytes_max:
                raise PublishError(
                    f"routing key of {len(key)} bytes exceeds {limits.key_bytes_max}"
                )
            if len(self._seq) >= limits.publisher_keys_max:
                raise PublishError(f"more than {limits.publisher_keys_max} routing keys")
            self._seq[key] = 0
        if not self._buffers:
            # The idle I/O thread sleeps up to 100 ms: it must time this linger, or (linger 0)
            # take this message now. One wake-up per batch, not per message.
            self._poke()
        buffer = self._buffers[key] = _KeyBuffer(since=time.monotonic())
        return buffer

    def _seal(self, key: bytes, buffer: _KeyBuffer, poke: bool = True) -> None:
        """Encode the key's pending messages as one batch and queue it for the I/O thread
        (which needs no wake-up when it is the caller: `poke=False`)."""
        if not buffer.payloads:
            return
        first, stamps = self._seq[key], buffer.stamps
        if min(stamps) < stamps[0]:
            # The format stores each record's time as an unsigned delta from record 0's. A
            # message may be stamped before the batch's first: the wall clock stepped back, or
            # send_many stamped its messages, waited for space (the lock released) while
            # another thread appended. It takes the first's time: raising here would leave the
            # batch in place and fail every later seal, the caller's and the I/O thread's.
            stamps = [max(stamp, stamps[0]) for stamp in stamps]
        batch = batchfmt.encode_batch(self.producer_id, first, key, buffer.payloads, stamps)
        count = len(buffer.payloads)
        self._seq[key] = first + count
        del self._buffers[key]
        self._outq.append(_Outbound(next(self._tokens), batch, count))
        self._outq_bytes += len(batch)
        if poke and len(self._outq) == 1:
            self._poke()

    def _poke(self) -> None:
        send_nowait(self._wake, [b""])  # not taken: a wake-up is already pending

    def _full(self) -> bool:
        return (
            self._outq_bytes > self.buffer_bytes
            or len(self._outq) >= limits.publisher_pending_batches_max
        )

    def _wait_for_space(self) -> None:
        if not self._full():
            return
        if self.on_full == "raise":
            raise BufferFull(
                f"{self.name}: {len(self._outq)} batches ({self._outq_bytes} bytes) wait for "
                "the exchange"
            )
        deadline = time.monotonic() + self.block_s
        while self._full():
            self._check_usable()
            left = deadline - time.monotonic()
            if left <= 0:
                raise PublishTimeout(
                    f"{self.name}: exchange did not take data for {self.block_s} s"
                )
            self._space.wait(min(left, 0.1))

    # --- I/O thread side (lock taken inside) ---------------------------------------------------
    def _take_stale(self) -> None:
        with self._lock:
            # the clock is read under the lock: read before it, a message the caller added
            # meanwhile looks younger than linger 0 and waits for the next poll timeout (1 ms),
            # its wake-up already spent (a p90 of 1.1 ms at 5,000 msg/s, docs/benchmarks.md §2)
            now = time.monotonic()
            for key, buffer in list(self._buffers.items()):
                if now - buffer.since >= self.linger_s:
                    self._seal(key, buffer, poke=False)

    def _next_outbound(self) -> _Outbound | None:
        with self._lock:
            return self._outq[0] if self._outq else None

    def _sent(self, item: _Outbound) -> None:
        with self._lock:
            self._outq.popleft()
            if item.batch is not None:
                self._outq_bytes -= len(item.batch)
                self.sent_batches += 1
                self.sent_messages += item.count
                self._space.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self._error = error
            self._space.notify_all()
            events = list(self._barriers.values())
        for event in events:
            event.set()


# the token of an acks="none" publisher's liveness probe: its batch tokens count from 1 and
# never reach it
_PROBE = (1 << 64) - 1


class _PublisherIO(threading.Thread):
    """The thread that owns the publisher's sockets (see the module docstring)."""

    def __init__(self, owner: Publisher):
        super().__init__(name=f"roq-pub-{owner.producer_id.hex()[:8]}", daemon=True)
        self.p = owner
        ctx = owner._context
        self.wake = open_socket(ctx, Kind.PAIR)
        self.wake.bind(owner._wake_endpoint)
        topics = owner.producer_id.hex().encode()
        self.notices = open_socket(ctx, Kind.SUB, subscribe=topics)
        subscribe(self.notices, EVERY_PUBLISHER)
        connect(self.notices, owner.monitor.at(MonitorPort.TO_PUBLISHERS))
        self.placement = Requester(
            ctx, owner.monitor.at(MonitorPort.PLACEMENT), limits.placement_request_timeout_ms
        )
        self.dealer: Any = None
        self.unconfirmed: dict[int, _Outbound] = {}  # sent batches the exchange must confirm
        self.resend: collections.deque[_Outbound] = collections.deque()  # after a fail-over
        self.drained: set[int] = set()  # flush tokens drained, waiting for confirmations
        # when a confirmation last came, or the first unconfirmed batch was sent: confirmations
        # that stop for `publisher_monitor_check_first_ms` make the publisher ask whether the
        # monitor moved (its host lost with the exchange, nobody left to say EXCHANGE_LOST)
        self.progress = time.monotonic()
        self.next_monitor_check = 0.0
        self.stall_from = -1.0  # the `progress` of the stall being checked (-1: none yet)
        self.check_wait_s = limits.publisher_monitor_check_first_ms / 1000
        self.locator: MonitorLocator | None = None
        if owner._locate is not None:
            self.locator = MonitorLocator(owner.queue, owner._locate, owner.producer_id.hex()[:8])
        # acks="none": a probe is out (no answer yet), batches were sent since the last one
        self.probing = False
        self.sent_since_probe = False
        self.next_probe = 0.0

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # the caller learns it on its next call
            log.error("%s: I/O thread failed: %s", self.p.name, error)
            self.p._fail(error)
            self.p._placed.set()
        finally:
            self._close()

    def _loop(self) -> None:
        poller = Poller()
        poller.register(self.wake, READABLE)
        poller.register(self.notices, READABLE)
        self._place(lost="")
        self.p._placed.set()
        poller.register(self.dealer, READABLE)
        while not (self.p._closing and self.p._next_outbound() is None):
            wait_ms = max(1, int(self.p.linger_s * 500)) if self.p._buffers else 100
            events = dict(poller.poll(wait_ms))
            if self.wake in events:
                self._drain_wake()
            if self.notices in events:
                target = self._notice()
                if target is not None:
                    poller.unregister(self.dealer)
                    self._move(*target)
                    poller.register(self.dealer, READABLE)
            if self.dealer in events:
                self._replies()
            if self.p.acks == "none":
                self._probe()
            # confirmations, a flush's drain or a probe's
            waiting = self.unconfirmed or self.p._barriers or self.probing
            if waiting and self._monitor_moved_while_stalled():
                poller.unregister(self.dealer)
                self._move("", alive=False)
                poller.register(self.dealer, READABLE)
            self.p._take_stale()
            self._pump()

    def _drain_wake(self) -> None:
        for _ in drained(self.wake, limits.control_hwm_messages):  # its high-water mark
            pass

    def _probe(self) -> None:
        """acks="none": a drain request now and then, while batches go out, so that a lost
        exchange (and monitor) is noticed without a flush."""
        now = time.monotonic()
        if self.probing or not self.sent_since_probe or now < self.next_probe:
            return
        self.next_probe = now + limits.publisher_monitor_check_ms / 1000
        self.sent_since_probe = False
        if not self.unconfirmed and not self.p._barriers:
            self.progress = now
        self.probing = True  # not sent (the socket is full): counted as unanswered too
        send_nowait(self.dealer, [dataplane.DRAIN, dataplane.TOKEN.pack(_PROBE)])

    # --- placement and moves -------------------------------------------------------------------
    def _place(self, lost: str) -> None:
        """Ask the monitor for an exchange until it names one (bounded) and connect to it. A
        monitor that does not answer, or is fenced, may have moved: the locator asks the GCM
        meanwhile, and an answer naming another monitor is taken before the next attempt."""
        request = PublisherInit(self.p.producer_id.hex(), lost, panic=bool(lost)).encode()
        deadline = time.monotonic() + limits.placement_timeout_ms / 1000
        retry_s = limits.placement_retry_first_ms / 1000
        while True:
            found = self.locator.take() if self.locator is not None else None
            if found is not None:
                self._switch_monitor(found)
            forbidden = False
            try:
                reply = self.placement.request(request)
                envelope = Reply.decode(reply)
                if not self._heard(field_epoch(reply)):
                    raise RoqError("a monitor of an older epoch answered")
                if envelope.ok:
                    self._connect(Placed.decode(reply).front)
                    return
                reason = envelope.comment
                forbidden = envelope.error == Reason.FORBIDDEN
                if envelope.error == Reason.FENCED and self.locator is not None:
                    self.locator.ask()  # its host lost its lease: the GCM may name another
            except AuthenticationRefused as error:  # asking again would be refused again
                raise PublishError(f"queue {self.p.queue}: {error}") from None
            except RoqError as error:
                reason = str(error)
                if self.locator is not None:
                    self.locator.ask()  # it did not answer: it may have moved
            if forbidden:
                raise PublishError(f"queue {self.p.queue}: refused: {reason}")
            if time.monotonic() > deadline or self.p._closing:
                raise PublishError(f"no exchange for queue {self.p.queue}: {reason}")
            log.info("%s: waiting for an exchange (%s)", self.p.name, reason)
            time.sleep(retry_s)
            retry_s = min(retry_s * 2, limits.placement_retry_ms / 1000)

    def _monitor_moved_while_stalled(self) -> bool:
        """Confirmations stopped: ask the GCM where the monitor is (in the locator's thread),
        soon and then less often; if an answer names another monitor, follow it (True)."""
        if self.locator is None:
            return False
        found = self.locator.take()
        if found is not None and self._switch_monitor(found):
            return True
        now = time.monotonic()
        if self.stall_from != self.progress:  # a new stall: the first question comes soon
            self.stall_from = self.progress
            self.check_wait_s = limits.publisher_monitor_check_first_ms / 1000
            self.next_monitor_check = self.progress + self.check_wait_s
        if now >= self.next_monitor_check and self.locator.ask():
            self.check_wait_s = min(
                self.check_wait_s * 2, limits.publisher_monitor_check_max_ms / 1000
            )
            self.next_monitor_check = now + self.check_wait_s
        return False

    def _follow_monitor(self) -> bool:
        """Ask the GCM where the queue's monitor is (one bounded attempt, waited for: the
        caller has nothing else to do meanwhile); if it moved (its host was lost and the GCM
        re-placed it), listen to and ask the new one. True if so."""
        if self.p._locate is None:
            return False
        try:
            found = locate_monitor(self.p.queue, *self.p._locate, quick=True)
        except RoqError as error:
            log.info("%s: where is the monitor? %s", self.p.name, error)
            return False
        return self._switch_monitor(found)

    def _switch_monitor(self, found: MonitorAddress) -> bool:
        """Listen to and ask `found` if it is another monitor than ours and not older (an
        answer the locator had before an earlier move is stale). True if switched."""
        if 0 < found.epoch < self.p.epochs.highest:
            return False
        self.p.epochs.note(found.epoch)
        if found.base == self.p.monitor.base:
            return False
        log.warning("%s: the monitor moved from %s to %s (epoch %d)", self.p.name,
                    self.p.monitor.base, found.base, found.epoch)  # fmt: skip
        disconnect(self.notices, self.p.monitor.at(MonitorPort.TO_PUBLISHERS))
        connect(self.notices, found.at(MonitorPort.TO_PUBLISHERS))
        self.placement.close()
        self.placement = Requester(
            self.p._context, found.at(MonitorPort.PLACEMENT), limits.placement_request_timeout_ms
        )
        self.p.monitor = found
        return True

    def _heard(self, epoch: int) -> bool:
        """Whether a reply or notice of `epoch` from the monitor may act: not if it is older
        than one seen (refused, counted), nor if it is newer and the GCM then names another
        monitor (followed: ask that one)."""
        verdict = self.p.epochs.judge(epoch, self.p.monitor.base)
        if verdict is Verdict.NEWER and self._follow_monitor():
            return False
        return verdict is not Verdict.STALE

    def _connect(self, front: str) -> None:
        self.dealer = open_socket(
            self.p._context, Kind.DEALER, sndhwm=limits.data_hwm_messages, rcvhwm=100_000
        )
        connect(self.dealer, front)
        self.p.exchange = front
        log.info("%s: sending to %s", self.p.name, front)
        # acks: batches the previous exchange never confirmed go first, in their order; _pump
        # sends them as the socket takes them (more than its high-water mark may be waiting).
        self.resend = collections.deque(sorted(self.unconfirmed.values(), key=lambda i: i.token))

    def _notice(self) -> tuple[str, bool] | None:
        """Read one monitor notice: (exchange to move to or "" to ask again, whether the old
        exchange is alive to drain), or None when the notice is not for this publisher."""
        frames = recv_nowait(self.notices)
        if frames is None:
            return None
        try:
            notice = decode_publisher_notice(bsonmsg.decode(frames[1:]))
        except ProtocolError as error:
            log.warning("%s: ignored a bad notice from the monitor: %s", self.p.name, error)
            return None
        if not self._heard(notice.epoch):
            return None
        if isinstance(notice, ExchangeLost):
            if notice.front != self.p.exchange:
                return None
            state = "is leaving"
            if notice.dead or notice.why:
                state = "died" if notice.dead else f"refuses appends ({notice.why})"
            log.warning("%s: exchange %s %s; failing over", self.p.name, notice.front, state)
            return "", not notice.dead
        if notice.producer == self.p.producer_id.hex() and notice.front != self.p.exchange:
            log.info("%s: re-allocated by the monitor to %s", self.p.name, notice.front)
            return notice.front, True
        return None

    def _move(self, target: str, alive: bool) -> None:
        old = self.p.exchange or ""
        # Even an exchange declared dead gets a short drain: one that was only slow (a starved
        # CPU, a throttled disk) then loses nothing of what it was sent.
        drained = self._drain_old(
            limits.drain_timeout_ms if alive else limits.publisher_dead_drain_ms
        )
        self.dealer.close(0)
        self.probing = False  # the new exchange is probed once batches go to it
        self.p.moves += 1
        if drained:
            self._release_barriers()
        if target:
            self._connect(target)
        else:
            self._place(lost=old)
        self._resend_barriers()

    def _drain_old(self, timeout_ms: int) -> bool:
        """Ask the old exchange to confirm it forwarded everything sent to it (bounded)."""
        token = dataplane.TOKEN.pack(0)
        if not send_nowait(self.dealer, [dataplane.DRAIN, token]):
            return False
        deadline = time.monotonic() + timeout_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            if not wait_readable(self.dealer, int(left * 1000) + 1):
                break
            frames = self.dealer.recv_multipart()
            if frames[0] == dataplane.DRAINED and frames[1] == token:
                return True
            self._reply(frames)
        log.warning("%s: old exchange did not confirm the drain within %d ms",
                    self.p.name, timeout_ms)  # fmt: skip
        return False

    # --- sending and replies -------------------------------------------------------------------
    def _pump(self) -> None:
        while self.resend:
            if self.resend[0].token in self.unconfirmed and not self._send(self.resend[0]):
                return
            self.resend.popleft()
        while (item := self.p._next_outbound()) is not None:
            if len(self.unconfirmed) >= limits.unconfirmed_batches_max:
                return  # wait for confirmations: the caller feels it as a full buffer
            if not self._send(item):
                return
            if item.batch is not None and self.p.acks != "none":
                if not self.unconfirmed:
                    self.progress = time.monotonic()
                self.unconfirmed[item.token] = item
            elif item.batch is not None:
                self.sent_since_probe = True
            self.p._sent(item)

    def _send(self, item: _Outbound) -> bool:
        token = dataplane.TOKEN.pack(item.token)
        if item.batch is None:
            if not self.unconfirmed and len(self.p._barriers) <= 1:
                self.progress = time.monotonic()  # the first thing now awaiting an answer
            frames = [dataplane.DRAIN, token]
        elif self.p.acks == "none":
            frames = [dataplane.BATCH, item.batch]
        elif self.p.acks == "leader":
            frames = [dataplane.CONFIRMED_BATCH, token, item.batch]
        else:
            frames = [dataplane.COMMITTED_BATCH, token, item.batch]
        return send_nowait(self.dealer, frames, copy=False)

    def _replies(self) -> None:
        for frames in drained(self.dealer, 10_000):
            self._reply(frames)

    def _reply(self, frames: list[bytes]) -> None:
        kind = frames[0]
        token = (
            dataplane.TOKEN.unpack(frames[1])[0] if len(frames) > 1 and len(frames[1]) == 8 else 0
        )
        if kind == dataplane.DRAINED:
            self.progress = time.monotonic()
            if token == _PROBE:
                self.probing = False
                return
            self.drained.add(token)
            self._settle()
        elif kind == dataplane.ACK:
            if self.unconfirmed.pop(token, None) is not None:
                self.progress = time.monotonic()
                self.p.confirmed_batches += 1
                self._settle()
        elif kind in (dataplane.NACK, dataplane.REFUSED):
            reason = frames[-1].decode(errors="replace")
            log.error("%s: exchange refused a batch: %s", self.p.name, reason)
            self.unconfirmed.pop(token, None)
            with self.p._lock:
                if len(self.p.refused) < 10_000:
                    self.p.refused.append(reason)

    def _settle(self) -> None:
        """A flush completes when its drain came back and every batch before it is confirmed."""
        if not self.drained:
            return
        oldest = min(self.unconfirmed, default=None)
        done = [t for t in self.drained if oldest is None or t < oldest]
        with self.p._lock:
            events = [self.p._barriers.pop(t, None) for t in done]
        self.drained.difference_update(done)
        for event in events:
            if event is not None:
                event.set()

    def _release_barriers(self) -> None:
        """A confirmed drain covers every flush sent to the old exchange."""
        with self.p._lock:
            self.drained.update(self.p._barriers)
        self._settle()

    def _resend_barriers(self) -> None:
        with self.p._lock:
            tokens = sorted(t for t in self.p._barriers if t not in self.drained)
        for token in tokens:
            self._send(_Outbound(token, None))

    def _close(self) -> None:
        if self.locator is not None:
            self.locator.close()
        for sock in (self.dealer, self.notices, self.wake):
            if sock is not None:
                sock.close(limits.data_linger_ms if sock is self.dealer else 0)
        self.placement.close()
