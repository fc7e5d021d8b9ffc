"""Publisher: sends messages to a logical queue, in batches, and survives exchange moves.

    with Publisher("q1", gcm="127.0.0.1:5000") as pub:
        pub.send(b"hello", key=b"news")
        pub.flush()                     # everything sent so far has reached an exchange

Threads. The caller's threads call `send`, `flush` and `close`; under one lock they touch Python
buffers and send a wake-up on the caller's end of an inproc PAIR (the only socket they use). The
buffers, the sealed batches waiting for the socket and the flushes waiting for an answer are a
`_Handover`: the lock and the fields it guards, read and written only through its methods. One
I/O thread (`_PublisherIO`, `roq-pub-…`), started by the constructor, owns every other ZeroMQ
socket: the DEALER to the current exchange, the REQ and SUB to the queue's monitor, the PUB of
its KPIs (11 and 12, every second) to the monitor's stat input, and its end of the inproc
wake-up pair; and the state of the exchange and monitor it talks to (the current
addresses, the epochs, the unconfirmed batches), which the caller's threads only read.

Batching. Messages for one routing key accumulate until their payloads reach `batch_bytes`
or the oldest has waited `linger_ms`; then they are encoded once, in the log's record-batch
format, and sent as one frame. `linger_ms=0` makes no message wait for others: the I/O thread
takes whatever is pending as soon as it can, so an idle publisher sends each message on its own
and a busy one sends what arrived while it was sending as one batch (Kafka's `linger.ms=0`).
`batch_bytes=1` makes every message its own batch and frame, whatever the load.

Sequence numbers count per (publisher, routing key) from 0; subscribers use them to restore
order across a move and to drop duplicates.

Meta. `send` takes headers, a message id, and expiry and not-before times as keyword arguments
(`send_many` the same headers and times for all its messages); a batch holding any message with
them is written in the log format's version 2, every other batch in version 1, as before
(docs/log-format.md §1). They are carried to subscribers, **not yet** enforced.

Back-pressure (never a silent drop). Encoded batches wait in a buffer of `buffer_bytes` (and at
most `limits.publisher_pending_batches_max` batches) for the socket; ZeroMQ queues at most
`limits.data_hwm_messages` batches per connection and then pushes back through TCP. When the
buffer is full, `send` blocks up to `block_ms` (`on_full="block"`, the default) and then raises
`PublishTimeout`, or raises `BufferFull` at once (`on_full="raise"`). Either way a message whose
`send` raised was not queued, so sending it again makes no duplicate.

Moves. When the monitor re-allocates this publisher, or its exchange leaves, the I/O thread
stops sending, asks the old exchange to drain (every batch sent before the drain request has
been forwarded to subscribers when the answer comes), and only then connects to the new exchange.
When the exchange leaves, the drain gets `limits.publisher_leaving_drain_ms` (it answers at once
unless it died after saying so); when the monitor declares it dead, only
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

An exchange restarted at its own address (killed, and started again by its host; a host back
within its ZooKeeper session restarts the monitor too, which never knew the old process) is no
move: nobody tells its publishers, and the batches the old process took without confirming
would never be confirmed. Drain answers carry the exchange process's run id; the publisher
probes once on connecting, and again while confirmations are stalled (as `acks="none"` does),
and a new run id at the same address makes it send its unconfirmed batches and its flushes'
drains again (`_heard_run`).

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
from roq.backoff import Backoff
from roq.client.locate import (
    MonitorAddress,
    MonitorLocator,
    locate_monitor,
)
from roq.errors import AuthenticationRefused, ProtocolError, RoqError
from roq.log import format as batchfmt
from roq.log.format import new_message_id  # noqa: F401  (re-exported: a random 16-byte id)
from roq.protocol import bsonmsg, dataplane
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason, StatCommand
from roq.protocol.epoch import EpochWatch, field_epoch
from roq.protocol.messages.kpi import PublisherKpi
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
    copying_send_pays,
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


# what a buffer may hold before a message with meta (at most META_BYTES_MAX and its meta_len)
_META_ROOM = limits.batch_bytes_max - batchfmt.META_BYTES_MAX - 2


def _growth(buffer: _KeyBuffer, meta: bytes) -> int:
    """Bytes a v1 buffer grows by when a message with meta turns it into a v2 batch."""
    return 2 * len(buffer.payloads) if buffer.metas is None else 0


def _add_meta(buffer: _KeyBuffer, meta: bytes) -> None:
    """Record a message's meta (b"": none) in the buffer, turning it into a v2 batch (each
    record 2 bytes more for its meta_len) if it was not one."""
    if buffer.metas is None:
        buffer.metas = [b""] * len(buffer.payloads)
        buffer.size += 2 * len(buffer.payloads)
    buffer.metas.append(meta)
    if not buffer.shared:  # a shared meta (the same one) was counted once
        buffer.size += 2 + len(meta)


def _shares(buffer: _KeyBuffer, meta: bytes) -> bool:
    """Whether the buffer is sized as a shared-meta batch of exactly this meta."""
    return buffer.shared and buffer.metas is not None and buffer.metas[0] == meta


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
    metas: list[bytes] | None = None  # one per payload once a message has meta (a v2 batch)
    # sized as a shared-meta batch: every record has metas[0], counted once (send_many's runs)
    shared: bool = False


@dataclass
class _Outbound:
    token: int
    batch: bytes | None  # None: a barrier (drain request) for flush()
    count: int = 0


class Publisher:
    """A producer on one queue. Thread-safe: any thread may call send/flush/close.

    Ownership (docs/architecture.md §8). The settings below are written once, before the I/O
    thread starts, and only read after. What the caller's threads hand the I/O thread (buffers,
    sealed batches, flush barriers, the closing flag, the I/O thread's failure) lives in one
    `_Handover` with the lock that guards it. Sockets, the current exchange and monitor, and the
    confirmations belong to the I/O thread (`_PublisherIO`); the properties below read them."""

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
        self.on_full = on_full
        self.acks = acks
        where = (
            MonitorAddress(monitor)
            if monitor
            else locate_monitor(queue, gcm, zk, namespace, need="publish")
        )
        self._context = _new_context()
        self._shared = _Handover(
            self.name,
            self.producer_id,
            batch_bytes=max(1, min(batch_bytes, limits.batch_bytes_max // 2)),
            linger_s=linger_ms / 1000,
            buffer_bytes=buffer_bytes,
            block_s=block_ms / 1000 if on_full == "block" else None,
        )
        # how to ask the GCM again where the monitor is (None: the caller named the monitor)
        locate = None if monitor else (gcm, zk, namespace)
        wake_endpoint = f"inproc://wake-{self.producer_id.hex()}"
        self._io = _PublisherIO(
            self._shared, queue, acks, self._context, where, locate, wake_endpoint
        )
        self._shared.wake = open_socket(self._context, Kind.PAIR)
        connect(self._shared.wake, wake_endpoint)
        self._io.start()
        try:
            self._io.placed.wait(limits.placement_timeout_ms / 1000 + 5)
        except BaseException:  # interrupted (Ctrl-C in roq pub): no I/O thread outlives it
            self.close(timeout_s=0.1)
            raise
        if self.failure is not None or self.exchange is None:
            self.close(timeout_s=0.1)
            raise PublishError(f"{self.name}: no exchange: {self.failure or 'timed out'}")

    # --- caller side ---------------------------------------------------------------------------
    def send(
        self,
        payload: bytes,
        key: bytes = b"",
        *,
        headers: batchfmt.HeadersIn | None = None,
        message_id: bytes | uuid.UUID | None = None,
        expires_at_us: int | None = None,
        not_before_us: int | None = None,
    ) -> None:
        """Queue one message; it leaves within `linger_ms` or when its batch is full.

        `headers` (a mapping or (name, value) pairs: str names, bytes or str values), a
        16-byte `message_id` and the absolute times `expires_at_us` and `not_before_us` (µs
        since the Unix epoch, this machine's wall clock) travel with the message, checked
        against `limits.record_headers_*` (ValueError). The reading clients enforce the times:
        a message is handed to no application at or after its expiry, nor before its
        not-before time (docs/guarantees.md §15, "TTL and delay"). A full buffer blocks or
        raises *before* the message is queued: when `send` raises, the message was not
        taken."""
        _check_size(payload)
        meta = b""
        if headers or message_id is not None or expires_at_us is not None:
            meta = batchfmt.encode_meta(headers, message_id, expires_at_us, not_before_us)
        elif not_before_us is not None:
            meta = batchfmt.encode_meta(None, None, None, not_before_us)
        shared = self._shared
        with shared.lock:
            shared.check_usable()
            shared.wait_for_space()
            shared.append(key, payload, time.time_ns() // 1000, meta)

    def send_many(
        self,
        payloads: Sequence[bytes],
        key: bytes = b"",
        *,
        headers: batchfmt.HeadersIn | None = None,
        expires_at_us: int | None = None,
        not_before_us: int | None = None,
    ) -> None:
        """Queue several messages for one key under one lock and one timestamp: the fast path
        for a producer that has messages at hand. Messages are taken in order; if it raises
        on a full buffer, `error.taken` of them were queued and the rest were not. `headers`
        and the times, as in `send`, go with every message of the call (encoded once)."""
        sizes = [len(payload) for payload in payloads]
        if not sizes:
            return
        biggest = max(sizes)
        if biggest > limits.message_bytes_max:
            _check_size(payloads[sizes.index(biggest)])
        meta = b""  # the default path: v1, no call
        if headers or expires_at_us is not None or not_before_us is not None:
            meta = batchfmt.encode_meta(headers, None, expires_at_us, not_before_us)
        extra = len(meta) + 2 if meta else 0  # a v2 record's meta and meta_len, at most
        shared = self._shared
        taken = 0
        with shared.lock:
            stamp = time.time_ns() // 1000  # under the lock: threads' stamps in append order
            shared.check_usable()
            try:
                if shared.batch_bytes + biggest + extra + 512 > limits.batch_bytes_max:
                    for payload in payloads:  # a message may not fit beside others: one by one
                        shared.wait_for_space()
                        shared.append(key, payload, stamp, meta)
                        taken += 1
                    return
                # the run's records share `meta`: stored once per batch (append_run counts it)
                ends = list(itertools.accumulate(size + batchfmt.RECORD_BYTES for size in sizes))
                while taken < len(sizes):
                    shared.wait_for_space()
                    taken = shared.append_run(key, payloads, ends, taken, stamp, meta)
            except PublishError as error:
                error.taken = taken
                raise

    def flush(self, timeout_s: float = limits.drain_timeout_ms / 1000) -> None:
        """Return once every message sent before the call has reached an exchange (and, with
        acks, been confirmed); raise PublishTimeout if that takes longer than `timeout_s`."""
        done = self._shared.barrier()
        if not done.wait(timeout_s):
            raise PublishTimeout(f"{self.name}: flush not confirmed within {timeout_s:.1f} s")
        fresh = self._shared.fresh_refusals()
        if fresh:
            raise PublishError(f"{self.name}: {len(fresh)} batch(es) refused: {fresh[0]}")

    def close(self, timeout_s: float = limits.drain_timeout_ms / 1000) -> None:
        """Flush (bounded), then stop the I/O thread and close every socket."""
        try:
            if self._shared.running() and self.exchange is not None:
                self.flush(timeout_s)
        finally:
            self._shared.close()
            self._io.join(timeout_s + 1)
            self._shared.wake.close(0)
            self._context.term() if not self._io.is_alive() else None

    # --- what the I/O thread owns, read from any thread (each a snapshot) -----------------------
    @property
    def failure(self) -> BaseException | None:
        """Why the I/O thread stopped (None while it runs): a failed publisher refuses every
        call for good, and its owner replaces it."""
        with self._shared.lock:
            return self._shared.error

    @property
    def exchange(self) -> str | None:
        """The current exchange's front address (None before the first placement)."""
        return self._io.exchange

    @property
    def monitor(self) -> MonitorAddress:
        """The queue's monitor this publisher listens to (it follows a moved monitor)."""
        return self._io.monitor

    @property
    def epochs(self) -> EpochWatch:
        """The queue's highest assignment epoch seen, and the stale replies refused."""
        return self._io.epochs

    @property
    def moves(self) -> int:
        """How many times the publisher left an exchange for another."""
        return self._io.moves

    @property
    def confirmed_batches(self) -> int:
        return self._io.confirmed_batches

    @property
    def exchange_restarts(self) -> int:
        """How many times its exchange restarted at its address under this publisher (each
        time its unconfirmed batches were sent again)."""
        return self._io.restarts_seen

    @property
    def sent_batches(self) -> int:
        with self._shared.lock:
            return self._shared.sent_batches

    @property
    def sent_messages(self) -> int:
        with self._shared.lock:
            return self._shared.sent_messages

    @property
    def refused(self) -> list[str]:
        """The reasons the exchange gave for refused batches (a copy; at most 10,000)."""
        with self._shared.lock:
            return list(self._shared.refused)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handover:
    """What the caller's threads hand the I/O thread, and the one lock that guards it.

    Every field below `lock` is read and written only under it. The caller's side (`append`,
    `append_run`, `wait_for_space`, `check_usable`) expects the lock held, so that `send` takes
    it once; every other method takes it itself. `wake` is the caller's end of the inproc PAIR
    that wakes the I/O thread: the one socket not used by the thread that opened it, used only
    under the lock (ZeroMQ sockets are not thread-safe, the lock makes them one at a time)."""

    def __init__(
        self,
        name: str,
        producer_id: bytes,
        *,
        batch_bytes: int,
        linger_s: float,
        buffer_bytes: int,
        block_s: float | None,
    ):
        # settings: written here, only read after
        self.name, self.producer_id = name, producer_id
        self.batch_bytes, self.linger_s = batch_bytes, linger_s
        self.buffer_bytes = buffer_bytes
        self.block_s = block_s  # None: a full buffer raises BufferFull at once
        self.wake: Any = None  # set by the Publisher before the I/O thread starts
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)  # notified when batches leave or it fails
        self.buffers: dict[bytes, _KeyBuffer] = {}  # per key: messages not yet sealed
        self.seq: dict[bytes, int] = {}  # per key: the next sequence number to seal
        self.outq: collections.deque[_Outbound] = collections.deque()  # sealed, not yet sent
        self.outq_bytes = 0
        self.tokens = itertools.count(1)
        self.barriers: dict[int, threading.Event] = {}  # flushes not yet confirmed
        self.closing = False
        self.error: BaseException | None = None  # why the I/O thread stopped
        self.refused: list[str] = []  # reasons the exchange gave for refused batches
        self.refused_seen = 0  # how many of them a flush has raised already
        self.sent_messages = self.sent_batches = 0

    # --- caller side (lock held) ---------------------------------------------------------------
    def check_usable(self) -> None:
        if self.error is not None:
            raise PublishError(f"{self.name}: {self.error}") from self.error
        if self.closing:
            raise PublishError(f"{self.name} is closed")

    def append(self, key: bytes, payload: bytes, stamp: int, meta: bytes = b"") -> None:
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self._new_buffer(key)
        elif buffer.size + len(payload) + 512 > limits.batch_bytes_max or (
            meta and buffer.size + len(payload) + 512 + _growth(buffer, meta) > _META_ROOM
        ):
            self._seal(key, buffer)  # the big message would not fit: send what is there
            buffer = self._new_buffer(key)
        elif buffer.shared and not _shares(buffer, meta):
            self._seal(key, buffer)  # sized for one shared meta: another one would outgrow it
            buffer = self._new_buffer(key)
        if meta or buffer.metas is not None:
            _add_meta(buffer, meta)
        buffer.payloads.append(payload)
        buffer.stamps.append(stamp)
        buffer.size += len(payload) + batchfmt.RECORD_BYTES
        if buffer.size >= self.batch_bytes:
            self._seal(key, buffer)

    def append_run(
        self,
        key: bytes,
        payloads: Sequence[bytes],
        ends: list[int],
        start: int,
        stamp: int,
        meta: bytes = b"",
    ) -> int:
        """Append payloads[start:] up to the one that fills the key's batch (`ends` holds the
        running total of record sizes: heads and payloads); returns where the next run starts. One
        list extend per batch instead of one append per message: send_many's speed is the
        publisher's. A run goes into a buffer of its own format (v1 without meta; with meta, a
        buffer whose records all share this meta, which the batch stores once: `ends` count
        no meta per record)."""
        buffer = self.buffers.get(key)
        if (
            buffer is not None
            and buffer.payloads
            and ((buffer.metas is None) == bool(meta) or (meta and not _shares(buffer, meta)))
        ):
            self._seal(key, buffer)
            buffer = None
        buffer = buffer or self._new_buffer(key)
        if meta and not buffer.shared:  # a new buffer: the shared meta block, counted once
            buffer.shared = True
            buffer.size += batchfmt.SHARED_META_LEN.size + len(meta)
        before = ends[start - 1] if start else 0
        # the first record whose running total reaches batch_bytes closes the batch
        stop = min(bisect.bisect_left(ends, before + self.batch_bytes - buffer.size, start) + 1,
                   len(ends))  # fmt: skip
        buffer.payloads.extend(payloads[start:stop])
        buffer.stamps.extend(itertools.repeat(stamp, stop - start))
        if meta:
            buffer.metas = buffer.metas or []
            buffer.metas.extend(itertools.repeat(meta, stop - start))
        buffer.size += ends[stop - 1] - before
        if buffer.size >= self.batch_bytes:
            self._seal(key, buffer)
        return stop

    def _new_buffer(self, key: bytes) -> _KeyBuffer:
        if key not in self.seq:
            if len(key) > limits.key_bytes_max:
                raise PublishError(
                    f"routing key of {len(key)} bytes exceeds {limits.key_bytes_max}"
                )
            if len(self.seq) >= limits.publisher_keys_max:
                raise PublishError(f"more than {limits.publisher_keys_max} routing keys")
            self.seq[key] = 0
        if not self.buffers:
            # The idle I/O thread sleeps up to 100 ms: it must time this linger, or (linger 0)
            # take this message now. One wake-up per batch, not per message.
            self._poke()
        buffer = self.buffers[key] = _KeyBuffer(since=time.monotonic())
        return buffer

    def _seal(self, key: bytes, buffer: _KeyBuffer, poke: bool = True) -> None:
        """Encode the key's pending messages as one batch and queue it for the I/O thread
        (which needs no wake-up when it is the caller: `poke=False`)."""
        if not buffer.payloads:
            return
        first, stamps = self.seq[key], buffer.stamps
        if min(stamps) < stamps[0]:
            # The format stores each record's time as an unsigned delta from record 0's. A
            # message may be stamped before the batch's first: the wall clock stepped back, or
            # send_many stamped its messages, waited for space (the lock released) while
            # another thread appended. It takes the first's time: raising here would leave the
            # batch in place and fail every later seal, the caller's and the I/O thread's.
            stamps = [max(stamp, stamps[0]) for stamp in stamps]
        batch = batchfmt.encode_batch(
            self.producer_id, first, key, buffer.payloads, stamps, buffer.metas
        )
        count = len(buffer.payloads)
        self.seq[key] = first + count
        del self.buffers[key]
        self.outq.append(_Outbound(next(self.tokens), batch, count))
        self.outq_bytes += len(batch)
        if poke and len(self.outq) == 1:
            self._poke()

    def _poke(self) -> None:
        send_nowait(self.wake, [b""])  # not taken: a wake-up is already pending

    def _full(self) -> bool:
        return (
            self.outq_bytes > self.buffer_bytes
            or len(self.outq) >= limits.publisher_pending_batches_max
        )

    def wait_for_space(self) -> None:
        if not self._full():
            return
        if self.block_s is None:
            raise BufferFull(
                f"{self.name}: {len(self.outq)} batches ({self.outq_bytes} bytes) wait for "
                "the exchange"
            )
        deadline = time.monotonic() + self.block_s
        while self._full():
            self.check_usable()
            left = deadline - time.monotonic()
            if left <= 0:
                raise PublishTimeout(
                    f"{self.name}: exchange did not take data for {self.block_s} s"
                )
            self.space.wait(min(left, 0.1))

    # --- caller side (lock taken inside) -------------------------------------------------------
    def barrier(self) -> threading.Event:
        """Seal every key's messages and queue a flush barrier behind them: the event is set
        when the I/O thread saw it drained (and, with acks, everything before it confirmed)."""
        with self.lock:
            self.check_usable()
            for key, buffer in list(self.buffers.items()):
                self._seal(key, buffer)
            token = next(self.tokens)
            done = self.barriers[token] = threading.Event()
            self.outq.append(_Outbound(token, None))
            self._poke()
        return done

    def fresh_refusals(self) -> list[str]:
        """The refusals no flush has raised yet (raises if the publisher failed meanwhile)."""
        with self.lock:
            self.check_usable()
            fresh, self.refused_seen = self.refused[self.refused_seen :], len(self.refused)
        return fresh

    def running(self) -> bool:
        with self.lock:
            return self.error is None and not self.closing

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self._poke()

    # --- I/O thread side (lock taken inside) ---------------------------------------------------
    def take_stale(self) -> tuple[bool, int, bool]:
        """Seal what has lingered long enough. Returns, as the lock saw them: whether messages
        still linger (the I/O thread then polls for a fraction of the linger, not its idle
        100 ms), how many flushes wait for an answer, and whether the publisher is closing."""
        with self.lock:
            # the clock is read under the lock: read before it, a message the caller added
            # meanwhile looks younger than linger 0 and waits for the next poll timeout (1 ms),
            # its wake-up already spent (a p90 of 1.1 ms at 5,000 msg/s, docs/benchmarks.md §2)
            now = time.monotonic()
            for key, buffer in list(self.buffers.items()):
                if now - buffer.since >= self.linger_s:
                    self._seal(key, buffer, poke=False)
            return bool(self.buffers), len(self.barriers), self.closing

    def next_outbound(self) -> _Outbound | None:
        with self.lock:
            return self.outq[0] if self.outq else None

    def is_closing(self) -> bool:
        with self.lock:
            return self.closing

    def sent(self, item: _Outbound) -> None:
        with self.lock:
            self.outq.popleft()
            if item.batch is not None:
                self.outq_bytes -= len(item.batch)
                self.sent_batches += 1
                self.sent_messages += item.count
                self.space.notify_all()

    def sent_flushes(self) -> list[int]:
        """The tokens of the flushes not yet confirmed that have left the queue of things to
        send (tokens grow in the queue's order: those below its head went out). One still
        queued covers batches queued before it that no exchange has seen yet."""
        with self.lock:
            head = self.outq[0].token if self.outq else None
            return [t for t in self.barriers if head is None or t < head]

    def flushes_waiting(self) -> int:
        with self.lock:
            return len(self.barriers)

    def confirm_flushes(self, tokens: list[int]) -> None:
        with self.lock:
            events = [self.barriers.pop(token, None) for token in tokens]
        for event in events:
            if event is not None:
                event.set()

    def refuse(self, reason: str) -> None:
        with self.lock:
            if len(self.refused) < 10_000:
                self.refused.append(reason)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self.error = error
            self.space.notify_all()
            events = list(self.barriers.values())
        for event in events:
            event.set()


# the token of an acks="none" publisher's liveness probe: its batch tokens count from 1 and
# never reach it
_PROBE = (1 << 64) - 1


class _PublisherIO(threading.Thread):
    """The thread that owns the publisher's sockets (see the module docstring).

    Every field is this thread's: it alone writes them, and it reads the callers' hand-over only
    through `shared`'s methods. The Publisher's properties read `exchange`, `monitor`, `epochs`,
    `moves`, `confirmed_batches` and `restarts_seen` from other threads, each one reference (a
    snapshot)."""

    def __init__(
        self,
        shared: _Handover,
        queue: str,
        acks: str,
        context: Any,
        monitor: MonitorAddress,
        locate: tuple[str | None, str | None, str] | None,
        wake_endpoint: str,
    ):
        super().__init__(name=f"roq-pub-{shared.producer_id.hex()[:8]}", daemon=True)
        self.shared, self.pub_name, self.queue, self.acks = shared, shared.name, queue, acks
        self.context, self.monitor, self.locate = context, monitor, locate
        # the queue's highest assignment epoch seen: a monitor's reply or notice of an older
        # one is refused (`epochs.refused` counts them)
        self.epochs = EpochWatch(shared.name, monitor.epoch)
        self.exchange: str | None = None  # the current exchange's front address
        self.moves = 0
        self.confirmed_batches = 0
        self.placed = threading.Event()  # set once placed, or failed
        self.wake = open_socket(context, Kind.PAIR)
        self.wake.bind(wake_endpoint)
        topics = shared.producer_id.hex().encode()
        self.notices = open_socket(context, Kind.SUB, subscribe=topics)
        subscribe(self.notices, EVERY_PUBLISHER)
        connect(self.notices, monitor.at(MonitorPort.TO_PUBLISHERS))
        self.placement = Requester(
            context, monitor.at(MonitorPort.PLACEMENT), limits.placement_request_timeout_ms
        )
        # its KPIs (11 and 12) to the monitor's stat input, as RoQ's publishers did
        self.stats = open_socket(context, Kind.PUB, sndhwm=limits.publisher_stat_hwm)
        if monitor.stat_in:
            connect(self.stats, monitor.stat_in)
        self.next_stat = time.monotonic() + limits.publisher_stat_period_s
        self.stat_sent = 0  # sent_messages at the last KPI
        self.dealer: Any = None
        self.copy_batches = False  # a copying send on a CURVE connection (copying_send_pays)
        self.unconfirmed: dict[int, _Outbound] = {}  # sent batches the exchange must confirm
        self.resend: collections.deque[_Outbound] = collections.deque()  # after a fail-over
        self.drained: set[int] = set()  # flush tokens drained, waiting for confirmations
        # when a confirmation last came, or the first unconfirmed batch was sent: confirmations
        # that stop for `publisher_monitor_check_first_ms` make the publisher ask whether the
        # monitor moved (its host lost with the exchange, nobody left to say EXCHANGE_LOST)
        self.progress = time.monotonic()
        self.next_monitor_check = 0.0
        self.stall_from = -1.0  # the `progress` of the stall being checked (-1: none yet)
        self.checks = Backoff(  # the wait before the stall's next question
            limits.publisher_monitor_check_first_ms / 1000,
            limits.publisher_monitor_check_max_ms / 1000,
        )
        self.locator: MonitorLocator | None = None
        if locate is not None:
            self.locator = MonitorLocator(queue, locate, shared.producer_id.hex()[:8], "publish")
        # the exchange process our batches go to, as its drain answers name it (None: not heard
        # yet); another there means it restarted at the same address (`_heard_run`)
        self.exchange_run: bytes | None = None
        self.restarts_seen = 0
        # a probe is out (no answer yet); acks="none": batches were sent since the last one
        self.probing = False
        self.sent_since_probe = False
        self.next_probe = 0.0

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # the caller learns it on its next call
            log.error("%s: I/O thread failed: %s", self.pub_name, error)
            self.shared.fail(error)
            self.placed.set()
        finally:
            self._close()

    def _loop(self) -> None:
        poller = Poller()
        poller.register(self.wake, READABLE)
        poller.register(self.notices, READABLE)
        self._place(lost="")
        self.placed.set()
        poller.register(self.dealer, READABLE)
        # what the last turn's `take_stale` saw: messages lingering in the callers' buffers,
        # flushes waiting for an answer, the publisher closing (one lock per turn for all three)
        lingering, flushes, closing = False, 0, False
        finished = False
        while not finished:
            wait_ms = max(1, int(self.shared.linger_s * 500)) if lingering else 100
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
            lingering, flushes, closing = self.shared.take_stale()
            if self.acks == "none":
                self._probe(flushes)
            else:
                self._probe_stalled()
            # confirmations, a flush's drain or a probe's
            waiting = self.unconfirmed or flushes or self.probing
            if waiting and self._monitor_moved_while_stalled():
                poller.unregister(self.dealer)
                self._move("", limits.publisher_dead_drain_ms)
                poller.register(self.dealer, READABLE)
            finished = self._pump() and closing
            self._publish_stats()

    def _publish_stats(self) -> None:
        """11 (messages sent since start) and 12 (sent in the last period) to the monitor's
        stat input, once a period. Not taken when the socket is full: the period is missed."""
        now = time.monotonic()
        if now < self.next_stat:
            return
        period_s = now - self.next_stat + limits.publisher_stat_period_s
        self.next_stat = now + limits.publisher_stat_period_s
        total = self.shared.sent_messages  # this thread alone writes it (`shared.sent`)
        pid, wall = self.shared.producer_id.hex(), time.time()
        for kpi in (
            PublisherKpi(StatCommand.PUBLISHER_TOTAL, pid, self.queue, total, wall),
            PublisherKpi(StatCommand.PUBLISHER_MINUTE, pid, self.queue, total - self.stat_sent,
                         wall, period_s),
        ):  # fmt: skip
            send_nowait(self.stats, [bsonmsg.encode(kpi.encode())])
        self.stat_sent = total

    def _drain_wake(self) -> None:
        for _ in drained(self.wake, limits.control_hwm_messages):  # its high-water mark
            pass

    def _probe(self, flushes: int) -> None:
        """acks="none": a drain request now and then, while batches go out, so that a lost
        exchange (and monitor) is noticed without a flush."""
        now = time.monotonic()
        if self.probing or not self.sent_since_probe or now < self.next_probe:
            return
        self.next_probe = now + limits.publisher_monitor_check_ms / 1000
        self.sent_since_probe = False
        if not self.unconfirmed and not flushes:
            self.progress = now
        self._send_probe()
        self.probing = True  # not sent (the socket is full): counted as unanswered too

    def _send_probe(self) -> bool:
        """A drain request of our own (`_PROBE`): its answer proves the exchange alive and names
        its process (`_heard_run`). False if the socket did not take it."""
        return send_nowait(self.dealer, [dataplane.DRAIN, dataplane.TOKEN.pack(_PROBE)])

    def _probe_stalled(self) -> None:
        """acks: confirmations stopped for `publisher_monitor_check_first_ms`: a drain request
        of our own, whose answer names the exchange's process (`_heard_run`), at most once per
        `publisher_monitor_check_ms` (a probe the old process took and never answered is given
        up after that long)."""
        now = time.monotonic()
        if not self.unconfirmed or now < self.next_probe:
            return
        if now - self.progress < limits.publisher_monitor_check_first_ms / 1000:
            return
        self.next_probe = now + limits.publisher_monitor_check_ms / 1000
        self.probing = self._send_probe()

    # --- placement and moves -------------------------------------------------------------------
    def _place(self, lost: str) -> None:
        """Ask the monitor for an exchange until it names one (bounded) and connect to it. A
        monitor that does not answer, or is fenced, may have moved: the locator asks the GCM
        meanwhile, and an answer naming another monitor is taken before the next attempt."""
        request = PublisherInit(self.shared.producer_id.hex(), lost, panic=bool(lost)).encode()
        deadline = time.monotonic() + limits.placement_timeout_ms / 1000
        retry = Backoff(limits.placement_retry_first_ms / 1000, limits.placement_retry_ms / 1000)
        while True:
            found = self.locator.take() if self.locator is not None else None
            if found is not None:
                self._switch_monitor(found)
            forbidden = False
            try:
                reply = self.placement.request(request)
                envelope = Reply.decode(reply)
                if not self.epochs.heard(
                    self.monitor.base, self._follow_monitor, field_epoch(reply)
                ):
                    raise RoqError("a monitor of an older epoch answered")
                if envelope.ok:
                    self._connect(Placed.decode(reply).front)
                    return
                reason = envelope.comment
                forbidden = envelope.error == Reason.FORBIDDEN
                if envelope.error == Reason.FENCED and self.locator is not None:
                    self.locator.ask()  # its host lost its lease: the GCM may name another
            except AuthenticationRefused as error:  # asking again would be refused again
                raise PublishError(f"queue {self.queue}: {error}") from None
            except RoqError as error:
                reason = str(error)
                if self.locator is not None:
                    self.locator.ask()  # it did not answer: it may have moved
            if forbidden:
                raise PublishError(f"queue {self.queue}: refused: {reason}")
            if time.monotonic() > deadline or self.shared.is_closing():
                raise PublishError(f"no exchange for queue {self.queue}: {reason}")
            log.info("%s: waiting for an exchange (%s)", self.pub_name, reason)
            time.sleep(retry.next_s())

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
            self.checks.reset()
            self.next_monitor_check = self.progress + self.checks.next_s()
        if now >= self.next_monitor_check and self.locator.ask():
            self.next_monitor_check = now + self.checks.next_s()
        return False

    def _follow_monitor(self) -> bool:
        """Ask the GCM where the queue's monitor is (one bounded attempt, waited for: the
        caller has nothing else to do meanwhile); if it moved (its host was lost and the GCM
        re-placed it), listen to and ask the new one. True if so."""
        if self.locate is None:
            return False
        try:
            found = locate_monitor(self.queue, *self.locate, quick=True, need="publish")
        except RoqError as error:
            log.info("%s: where is the monitor? %s", self.pub_name, error)
            return False
        return self._switch_monitor(found)

    def _switch_monitor(self, found: MonitorAddress) -> bool:
        """Listen to and ask `found` if it is another monitor than ours and not older (an
        answer the locator had before an earlier move is stale). True if switched."""
        if 0 < found.epoch < self.epochs.highest:
            return False
        self.epochs.note(found.epoch)
        if found.base == self.monitor.base:
            return False
        log.warning("%s: the monitor moved from %s to %s (epoch %d)", self.pub_name,
                    self.monitor.base, found.base, found.epoch)  # fmt: skip
        disconnect(self.notices, self.monitor.at(MonitorPort.TO_PUBLISHERS))
        connect(self.notices, found.at(MonitorPort.TO_PUBLISHERS))
        if self.monitor.stat_in:
            disconnect(self.stats, self.monitor.stat_in)
        if found.stat_in:
            connect(self.stats, found.stat_in)
        self.placement.close()
        self.placement = Requester(
            self.context, found.at(MonitorPort.PLACEMENT), limits.placement_request_timeout_ms
        )
        self.monitor = found
        return True

    def _connect(self, front: str) -> None:
        self.dealer = open_socket(
            self.context, Kind.DEALER, sndhwm=limits.data_hwm_messages, rcvhwm=100_000
        )
        connect(self.dealer, front)
        self.copy_batches = copying_send_pays(self.dealer)
        self.exchange = front
        log.info("%s: sending to %s", self.pub_name, front)
        # Learn which process serves `front` before any batch goes to it (see `_heard_run`).
        self.exchange_run = None
        self.probing = self._send_probe()
        # acks: batches the previous exchange never confirmed go first, in their order; _pump
        # sends them as the socket takes them (more than its high-water mark may be waiting).
        self.resend = collections.deque(sorted(self.unconfirmed.values(), key=lambda i: i.token))

    def _notice(self) -> tuple[str, int] | None:
        """Read one monitor notice: (exchange to move to or "" to ask again, how long the old
        exchange's drain is waited for), or None when the notice is not for this publisher."""
        frames = recv_nowait(self.notices)
        if frames is None:
            return None
        try:
            notice = decode_publisher_notice(bsonmsg.decode(frames[1:]))
        except ProtocolError as error:
            log.warning("%s: ignored a bad notice from the monitor: %s", self.pub_name, error)
            return None
        if not self.epochs.heard(self.monitor.base, self._follow_monitor, notice.epoch):
            return None
        if isinstance(notice, ExchangeLost):
            if notice.front != self.exchange:
                return None
            state = "is leaving"
            if notice.dead or notice.why:
                state = "died" if notice.dead else f"refuses appends ({notice.why})"
            log.warning("%s: exchange %s %s; failing over", self.pub_name, notice.front, state)
            if notice.dead:
                return "", limits.publisher_dead_drain_ms
            return "", limits.publisher_leaving_drain_ms
        if notice.producer == self.shared.producer_id.hex() and notice.front != self.exchange:
            log.info("%s: re-allocated by the monitor to %s", self.pub_name, notice.front)
            return notice.front, limits.drain_timeout_ms
        return None

    def _move(self, target: str, drain_ms: int) -> None:
        old = self.exchange or ""
        # Even an exchange declared dead gets a short drain: one that was only slow (a starved
        # CPU, a throttled disk) then loses nothing of what it was sent.
        drained = self._drain_old(drain_ms)
        self.dealer.close(0)
        self.probing = False  # the new exchange is probed once batches go to it
        self.moves += 1
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
                    self.pub_name, timeout_ms)  # fmt: skip
        return False

    # --- sending and replies -------------------------------------------------------------------
    def _pump(self) -> bool:
        """Send what the socket takes; True if nothing sealed is left to send."""
        while self.resend:
            if self.resend[0].token in self.unconfirmed and not self._send(self.resend[0]):
                return False
            self.resend.popleft()
        while (item := self.shared.next_outbound()) is not None:
            if len(self.unconfirmed) >= limits.unconfirmed_batches_max:
                return False  # wait for confirmations: the caller feels it as a full buffer
            if not self._send(item):
                return False
            if item.batch is not None and self.acks != "none":
                if not self.unconfirmed:
                    self.progress = time.monotonic()
                self.unconfirmed[item.token] = item
            elif item.batch is not None:
                self.sent_since_probe = True
            self.shared.sent(item)
        return True

    def _send(self, item: _Outbound) -> bool:
        token = dataplane.TOKEN.pack(item.token)
        if item.batch is None:
            if not self.unconfirmed and self.shared.flushes_waiting() <= 1:
                self.progress = time.monotonic()  # the first thing now awaiting an answer
            frames = [dataplane.DRAIN, token]
        elif self.acks == "none":
            frames = [dataplane.BATCH, item.batch]
        elif self.acks == "leader":
            frames = [dataplane.CONFIRMED_BATCH, token, item.batch]
        else:
            frames = [dataplane.COMMITTED_BATCH, token, item.batch]
        return send_nowait(self.dealer, frames, copy=self.copy_batches)

    def _replies(self) -> None:
        for frames in drained(self.dealer, 10_000):
            self._reply(frames)

    def _reply(self, frames: list[bytes]) -> None:
        kind = frames[0]
        token = (
            dataplane.TOKEN.unpack(frames[1])[0] if len(frames) > 1 and len(frames[1]) == 8 else 0
        )
        if kind == dataplane.DRAINED:
            if len(frames) > 2:
                self._heard_run(frames[2])
            if token == _PROBE:
                self.probing = False
                if not self.unconfirmed:  # with batches unconfirmed, only they are progress
                    self.progress = time.monotonic()
                return
            self.progress = time.monotonic()
            self.drained.add(token)
            self._settle()
        elif kind == dataplane.ACK:
            if self.unconfirmed.pop(token, None) is not None:
                self.progress = time.monotonic()
                self.confirmed_batches += 1
                self._settle()
        elif kind in (dataplane.NACK, dataplane.REFUSED):
            reason = frames[-1].decode(errors="replace")
            log.error("%s: exchange refused a batch: %s", self.pub_name, reason)
            self.unconfirmed.pop(token, None)
            self.shared.refuse(reason)
            self._settle()  # a flush waiting for it ends now, and raises the refusal

    def _heard_run(self, run: bytes) -> None:
        """A drain answer named the exchange process that serves our address. Another than
        before means the exchange restarted there (killed, its host back within its session):
        the batches the old process took without confirming are gone with it, and the new one
        will never confirm them, so they go again, in order, with the flushes' drains (the
        monitor saw no move, so no fail-over would ever send them: the fault harness measured
        a producer 31 s without an acknowledgement)."""
        if self.exchange_run is not None and run != self.exchange_run:
            self.restarts_seen += 1
            log.warning("%s: exchange %s restarted (another process answers at its address): "
                        "sending its %d unconfirmed batch(es) again", self.pub_name,
                        self.exchange, len(self.unconfirmed))  # fmt: skip
            self.resend = collections.deque(
                sorted(self.unconfirmed.values(), key=lambda i: i.token)
            )
            self._resend_barriers()
        self.exchange_run = run

    def _settle(self) -> None:
        """A flush completes when its drain came back and every batch before it is confirmed."""
        if not self.drained:
            return
        oldest = min(self.unconfirmed, default=None)
        done = [t for t in self.drained if oldest is None or t < oldest]
        self.drained.difference_update(done)
        self.shared.confirm_flushes(done)

    def _release_barriers(self) -> None:
        """A confirmed drain covers every flush sent to the old exchange (not those still
        queued: batches before them have not been sent to any exchange)."""
        self.drained.update(self.shared.sent_flushes())
        self._settle()

    def _resend_barriers(self) -> None:
        tokens = sorted(t for t in self.shared.sent_flushes() if t not in self.drained)
        for token in tokens:
            self._send(_Outbound(token, None))

    def _close(self) -> None:
        if self.locator is not None:
            self.locator.close()
        for sock in (self.dealer, self.notices, self.wake, self.stats):
            if sock is not None:
                sock.close(limits.data_linger_ms if sock is self.dealer else 0)
        self.placement.close()
