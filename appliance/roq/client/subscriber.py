"""Subscriber: receives a logical queue's messages whose routing key starts with `key`.

    with Subscriber("q1", key=b"news", gcm="127.0.0.1:5000") as sub:
        for message in sub.messages(count=10, timeout_s=5):     # iterator style
            print(message.seq, message.payload)
        sub.run(callback, stop_event)                           # callback style

Threads. A Subscriber and all its sockets belong to the thread that created it; it starts no
thread of its own, so a callback runs in that thread and may block it (which is back-pressure:
see below).

Membership. It asks the queue's monitor for every exchange, connects one SUB socket to each
(a `Feed` per exchange), and follows the monitor's notices: a new exchange is joined at once,
and the full list the monitor republishes every period adds what is missing and drops exchanges
that are gone. A monitor that does not answer (its host was lost) is looked up again through the
GCM, which names the monitor it re-placed; the subscriber then follows that one.

Where to start: `start="now"` (the default: what is published from now on, on every exchange:
one that appears later is read from its log from the subscriber's start time), `"beginning"`
(everything each exchange's log still holds), `from_offset=N` (offset N of every exchange's log:
useful with one exchange) or `from_time=T` (epoch seconds: the first batch sent at or after T).
With `offsets_file`, `commit()` records how far this subscriber got (per exchange, and per
stream), and a new Subscriber with the same file resumes exactly there. `resume_state()` is the
same record as a dict, for a caller that keeps it elsewhere (the HTTP gateway's snapshot), and
`resume=` starts a Subscriber from one.

Order and duplicates: per exchange by log offsets (`feed.py`), across exchanges per producer and
routing key (`sequencer.py`).

TTL and delay (client/timing.py, docs/guarantees.md "TTL and delay"). A record whose
`expires_at_us` has passed when it would be handed to the application is dropped and counted in
`expired`. A record whose `not_before_us` has not come is held, with the later records of its
stream (producer and routing key), until it comes due: per-stream order is kept; other streams
flow on. At most `limits.subscriber_delay_held_max` records are held; then no more batches are
taken until some come due.

Corrupt batches (records that do not fill their batch: damage on disk the CRC cannot see) are
skipped and counted in `corrupt_records`, log bytes damaged beyond framing in `skipped_bytes`,
and delivery goes on (`feed.py`, `sequencer.py`).

Slow subscribers. The exchange queues at most `exchange.subscriber.hwm` batches for a subscriber;
past that, ZeroMQ drops that subscriber's batches (never anyone else's, and the exchange does not
grow). The subscriber sees the offset gap and reads the missing batches from the exchange's log at
its own pace (`feed.py`); only what retention already evicted is lost, and counted.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from roq import limits
from roq.client.feed import Feed
from roq.client.locate import MonitorAddress, locate_monitor
from roq.client.sequencer import Delivery, Sequencer
from roq.client.timing import DelayGate, expired, now_us
from roq.errors import (
    EXIT_NOPERM,
    AuthenticationRefused,
    BadInput,
    ProtocolError,
    RoqError,
)
from roq.log import format as batchfmt
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason
from roq.protocol.epoch import EpochWatch, field_epoch
from roq.protocol.messages.kpi import SubscriberKpi
from roq.protocol.messages.monitor import (
    DeadLog,
    ExchangeList,
    NewExchange,
    SubscriberInit,
    decode_subscriber_notice,
)
from roq.protocol.ports import MonitorPort
from roq.transport import (
    READABLE,
    Kind,
    Poller,
    connect,
    disconnect,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
)
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)

START_CHOICES = ("now", "beginning")


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
        start: str = "now",
        from_offset: int | None = None,
        from_time: float | None = None,
        offsets_file: str | Path | None = None,
        resume: dict[str, Any] | None = None,
        hwm: int = limits.subscriber_hwm_batches,
        gap_wait_ms: int = limits.subscriber_gap_wait_ms,
        join_timeout_s: float = limits.placement_timeout_ms / 1000,
    ):
        if start not in START_CHOICES:
            raise ValueError(f"start must be one of {START_CHOICES}")
        self.queue, self.key, self.hwm = queue, key, hwm
        self.start, self.from_offset, self.from_time = start, from_offset, from_time
        self.subscriber_id = uuid.uuid4().hex
        self.name = f"subscriber {self.subscriber_id[:8]} on {queue}"
        joining = time.monotonic()  # join_timeout_s bounds the GCM's answer and the join
        self.monitor = (
            MonitorAddress(monitor)
            if monitor
            else locate_monitor(
                queue, gcm, zk, namespace, need="subscribe", budget_s=join_timeout_s
            )
        )
        self._locate = None if monitor else (gcm, zk, namespace)  # to find a moved monitor
        # the queue's highest assignment epoch seen: a monitor's reply or notice of an older
        # one is refused (`epochs.refused` counts them)
        self.epochs = EpochWatch(self.name, self.monitor.epoch)
        from_start = start == "beginning" and from_offset is None and from_time is None
        self.sequencer = Sequencer(gap_wait_ms / 1000, from_start=from_start)
        # Records of delivered batches that messages() has not yielded yet (it stopped at its
        # count, or its caller stopped iterating), with the id of the exchange they came from.
        self._pending: collections.deque[tuple[str, batchfmt.Record]] = collections.deque()
        # delayed records (not due yet) and the later ones of their streams, as in _pending
        self._delayed: DelayGate[tuple[str, batchfmt.Record]] = DelayGate(
            limits.subscriber_delay_held_max
        )
        self.expired = 0  # records dropped: past their expiry when they would be handed out
        self.feeds: dict[str, Feed] = {}  # by back address
        self.offsets_file = Path(offsets_file) if offsets_file else None
        self._resume = self._apply_resume(resume) if resume else self._load_offsets()
        self.received_messages = self.received_batches = 0
        self.latency_us: list[float] = []  # per-batch samples since the last statistics
        self._context = new_context()
        self.notices = open_socket(self._context, Kind.SUB, subscribe=b"")
        connect(self.notices, self.monitor.at(MonitorPort.TO_SUBSCRIBERS))
        self.stats = self._stat_socket()
        self._placement = Requester(self._context, self.monitor.at(MonitorPort.PLACEMENT))
        self._next_stat = time.monotonic() + limits.subscriber_stat_period_s
        self._next_refresh = 0.0
        self._started_us = time.time_ns() // 1000
        self._joined = False
        self._join(max(0.0, join_timeout_s - (time.monotonic() - joining)))
        self._joined = True

    @property
    def exchanges(self) -> dict[str, str]:
        """Back address → exchange id of every exchange this subscriber reads."""
        return {back: feed.exchange_id for back, feed in self.feeds.items()}

    def _stat_socket(self) -> Any:
        sock = open_socket(self._context, Kind.PUB, sndhwm=limits.subscriber_stat_hwm)
        if self.monitor.stat_in:
            connect(sock, self.monitor.stat_in)
        return sock

    def _join(self, timeout_s: float) -> None:
        """Ask the monitor for every exchange, retrying until it has at least one (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self._placement.request(
                    SubscriberInit().encode(), limits.subscriber_join_request_timeout_ms
                )
                if not self.epochs.heard(
                    self.monitor.base, self._follow_monitor, field_epoch(reply)
                ):
                    raise RoqError("a monitor of an older epoch answered")
                listing = self._list_exchanges(reply)
                if listing is not None and listing.exchanges:
                    self._reconcile(listing, drop=False)
                    return
                reason = "the queue has no exchange yet"
                if listing is None and _fenced(reply) and self._follow_monitor():
                    continue  # its host lost its lease: the GCM may name the new monitor
                refused = Reply.decode(reply)
                if refused.error == Reason.FORBIDDEN:
                    raise SubscribeRefused(f"{self.name}: refused: {refused.comment}")
            except (AuthenticationRefused, SubscribeRefused):
                raise  # asking again would be refused again
            except RoqError as error:
                reason = str(error)
                if self._follow_monitor():
                    continue
            if time.monotonic() > deadline:
                raise RoqError(f"{self.name}: cannot join the queue: {reason}")
            time.sleep(limits.placement_retry_ms / 1000)

    def _follow_monitor(self) -> bool:
        """Ask the GCM where the monitor is (one bounded attempt); if it moved (re-placed after
        its host was lost), listen to and ask the new one. True if so."""
        if self._locate is None:
            return False
        try:
            found = locate_monitor(self.queue, *self._locate, quick=True, need="subscribe")
        except RoqError as error:
            log.info("%s: where is the monitor? %s", self.name, error)
            return False
        self.epochs.note(found.epoch)
        if found.base == self.monitor.base:
            return False
        log.warning("%s: the monitor moved from %s to %s (epoch %d)", self.name,
                    self.monitor.base, found.base, found.epoch)  # fmt: skip
        disconnect(self.notices, self.monitor.at(MonitorPort.TO_SUBSCRIBERS))
        connect(self.notices, found.at(MonitorPort.TO_SUBSCRIBERS))
        if self.monitor.stat_in:
            disconnect(self.stats, self.monitor.stat_in)
        if found.stat_in:
            connect(self.stats, found.stat_in)
        self._placement.close()
        self._placement = Requester(self._context, found.at(MonitorPort.PLACEMENT))
        self.monitor = found
        return True

    @staticmethod
    def _list_exchanges(reply: dict[str, Any]) -> ExchangeList | None:
        """The monitor's answer to SUBSCRIBER_INIT; None if it refused (ProtocolError if it is
        malformed)."""
        return ExchangeList.decode(reply) if Reply.decode(reply).ok else None

    # --- membership ----------------------------------------------------------------------------
    def _reconcile(self, listing: ExchangeList, drop: bool) -> None:
        """Join the live exchanges; read the logs of dead ones from their copies (`Copies`, the
        monitor's list); with `drop`, leave the rest."""
        listed = {x.back: x for x in listing.exchanges}
        for back, entry in listed.items():
            self._join_exchange(back, entry.exchange_id, entry.logged)
        dead = _copies_by_leader(listing.copies)
        for leader_id, found in dead.items():
            self._replay_copy(leader_id, found)
        if drop:
            for where in [w for w, f in self.feeds.items() if w not in listed]:
                if self.feeds[where].exchange_id in dead and self.feeds[where].copies:
                    continue  # reading the copy of a dead exchange's log
                feed = self.feeds.pop(where)
                log.info("%s: leaving exchange %s", self.name, feed.exchange_id)
                self.sequencer.forget(feed)
                feed.close()

    def _join_exchange(self, back: str, exchange_id: str, logged: bool) -> None:
        if back in self.feeds and self.feeds[back].exchange_id != exchange_id:
            self._set_aside(back)  # a new exchange on a dead one's port
        if back in self.feeds:
            self.feeds[back].use_owner(back)  # no-op unless it was reading a copy
            return
        returning = next((w for w, f in self.feeds.items() if f.exchange_id == exchange_id), None)
        if returning is not None:  # known by its copy while it was dead
            self.feeds[back] = self.feeds.pop(returning)
            self.feeds[back].use_owner(back)
            return
        feed = self.feeds[back] = Feed(self._context, exchange_id, back, self.key, self.hwm, logged)
        log.info("%s: receiving from exchange %s (%s)", self.name, exchange_id, back)
        self._position(feed)

    def _set_aside(self, back: str) -> None:
        feed = self.feeds.pop(back)
        if feed.copies:
            self.feeds[f"copy of {feed.exchange_id}"] = feed
        else:
            log.info("%s: leaving exchange %s", self.name, feed.exchange_id)
            self.sequencer.forget(feed)
            feed.close()

    def _replay_copy(self, leader_id: str, copies: list[tuple[str, int]]) -> None:
        """The exchange `leader_id` is dead: read what this subscriber wants of its log from a
        replica's copy (a feed already on it reads on from where it stands)."""
        feed = next((f for f in self.feeds.values() if f.exchange_id == leader_id), None)
        if feed is not None:
            feed.use_copies(copies)
            return
        if not self._wants_history(leader_id):
            return  # starting from now: a dead exchange has nothing new
        feed = Feed(self._context, leader_id, "", self.key, self.hwm, logged=True)
        self.feeds[f"copy of {leader_id}"] = feed
        feed.use_copies(copies)
        self._position(feed)

    def _wants_history(self, exchange_id: str) -> bool:
        if exchange_id in self._resume.get("exchanges", {}) or self.start == "beginning":
            return True
        if self._resume.get("since_us") is not None:
            return True
        return self.from_offset is not None or self.from_time is not None

    def _position(self, feed: Feed) -> None:
        """Where a new feed starts: the offsets file, then from_offset, from_time, beginning."""
        resume = self._resume.get("exchanges", {}).get(feed.exchange_id)
        since_us = self._resume.get("since_us")
        if resume is not None:
            feed.start_at(int(resume))
        elif since_us is not None:
            # resumed, but nothing was delivered from this exchange before: from where the
            # first run started (its "now"), not from this run's, which would skip what was
            # published in between
            feed.seek_time(int(since_us))
        elif self.from_offset is not None:
            feed.start_at(self.from_offset)
        elif self.from_time is not None:
            feed.seek_time(int(self.from_time * 1_000_000))
        elif self.start == "beginning":
            feed.start_at(0)
        elif self._joined and feed.logged:
            # An exchange that appeared after this subscriber joined: what it took before this
            # feed connected was still published after the subscriber started. Its log gives
            # that back (a restarted exchange's older batches are skipped by their time).
            feed.seek_time(self._started_us)

    def _on_notice(self) -> None:
        frames = recv_nowait(self.notices)
        if frames is None:
            return
        try:
            notice = decode_subscriber_notice(bsonmsg.decode(frames))
        except ProtocolError as error:  # the list comes again every period
            log.warning("%s: ignored a bad notice from the monitor: %s", self.name, error)
            return
        if not self.epochs.heard(self.monitor.base, self._follow_monitor, notice.epoch):
            return
        if isinstance(notice, NewExchange):
            entry = notice.entry
            self._join_exchange(entry.back, entry.exchange_id, entry.logged)
        else:
            self._reconcile(notice, drop=True)

    def _refresh(self, now: float) -> None:
        """A feed went silent: ask the monitor for the list now rather than wait for its next
        notice (which a slow notice socket may have missed). Bounded by a short timeout."""
        self._next_refresh = now + limits.subscriber_refresh_ms / 1000
        request = SubscriberInit().encode()
        try:
            reply = self._placement.request(request, limits.subscriber_refresh_timeout_ms)
            if not self.epochs.heard(self.monitor.base, self._follow_monitor, field_epoch(reply)):
                raise RoqError("a monitor of an older epoch answered")
            listing = self._list_exchanges(reply)
        except RoqError as error:
            log.warning("%s: cannot refresh the exchange list: %s", self.name, error)
            self._follow_monitor()  # the list comes from the new one at the next refresh
            return
        if listing is not None:
            self._reconcile(listing, drop=True)
        elif _fenced(reply):
            self._follow_monitor()

    # --- receiving -----------------------------------------------------------------------------
    def poll(self, timeout_ms: int = limits.poll_interval_ms) -> list[Delivery]:
        """Wait up to `timeout_ms` and return the batches now deliverable, in stream order."""
        out: list[Delivery] = []
        poller, owners = self._poller()
        ready = poller.poll(timeout_ms)
        now_us = time.time_ns() // 1000  # after the wait: what arrived during it is not older
        for sock, _ in ready:
            owner = owners[sock]
            if owner is None:
                self._on_notice()
            elif not self._still_open(owner, sock):
                continue  # a notice handled just before closed it (its exchange left)
            elif sock is owner.live:
                self._offer(owner, owner.receive(limits.subscriber_burst_batches), now_us, out)
            else:
                self._offer(owner, owner.on_reply(), now_us, out)
        now = time.monotonic()
        sequencer = self.sequencer
        for feed in self.feeds.values():
            feed.check_timeout(now)
            feed.check_idle(now)
            # A feed whose batches wait for another feed's older ones reads no further for now.
            held = sequencer.held_by_source.get(feed, 0)
            if feed.wants_more(sequencer.progress) and held < sequencer.held_per_source:
                feed.read_more()
        if not any(feed.reading for feed in self.feeds.values()):
            out.extend(self.sequencer.expire(now))  # a gap no log read in flight can fill
        if now >= self._next_refresh and any(feed.silent for feed in self.feeds.values()):
            self._refresh(now)
        if now >= self._next_stat:
            self._publish_stats(now)
        return out

    def _still_open(self, feed: Feed, sock: Any) -> bool:
        """Whether `sock` is still one of `feed`'s sockets and `feed` one of this subscriber's:
        receiving on a socket closed meanwhile raised, and ended the subscriber's thread."""
        current = any(feed is known for known in self.feeds.values())
        return current and (sock is feed.live or sock is feed.reader)

    def _poller(self) -> tuple[Poller, dict[Any, Feed | None]]:
        poller = Poller()
        owners: dict[Any, Feed | None] = {self.notices: None}
        poller.register(self.notices, READABLE)
        # While many batches wait for a gap to fill, leave the live streams unread: ZeroMQ then
        # drops for this subscriber only, and the log gives those batches back later.
        take_live = self.sequencer.held < self.sequencer.held_max // 2
        for feed in self.feeds.values():
            if take_live:
                poller.register(feed.live, READABLE)
                owners[feed.live] = feed
            if feed.reader is not None:
                poller.register(feed.reader, READABLE)
                owners[feed.reader] = feed
        return poller, owners

    def _offer(self, feed: Feed, batches: Any, now_us: int, out: list[Delivery]) -> None:
        now = time.monotonic()
        if feed.evicted_since_offer:
            feed.evicted_since_offer = False
            # What its log evicted will never come from it, so its gaps are not waited for; but
            # while another feed still reads its log, that log may hold them (a replay whose
            # stream began on another exchange): then they are waited for as any gap.
            if not any(other.catching_up for other in self.feeds.values() if other is not feed):
                self.sequencer.forgive(feed)
        elif not feed.catching_up:
            self.sequencer.forget(feed)
        for header, batch, sound in batches:
            if feed.logged and self.sequencer.refuses(header, feed):
                # no room to hold it: read it (and what follows it) from the log again later
                feed.rewind(header.base_offset, self.sequencer.progress)
                break
            self.received_batches += 1
            self.received_messages += header.count
            if len(self.latency_us) < 100_000:
                self.latency_us.append(now_us - header.first_ts_us)
            out.extend(self.sequencer.offer(header, batch, now, feed, corrupt=not sound))

    @property
    def corrupt_records(self) -> int:
        """Records skipped because their batch was corrupt (each is also logged)."""
        return self.sequencer.corrupt

    @property
    def skipped_bytes(self) -> int:
        """Bytes of exchanges' logs skipped because they could not be read at all (damaged on
        disk: the records they held are counted `lost` by the sequencer if later ones came)."""
        return sum(feed.skipped_bytes for feed in self.feeds.values())

    # --- position ------------------------------------------------------------------------------
    def positions(self) -> dict[str, int]:
        """Exchange id → the log offset this subscriber continues from."""
        return {
            feed.exchange_id: feed.next_offset
            for feed in self.feeds.values()
            if feed.next_offset is not None
        }

    def commit(self) -> None:
        """Record the position of everything delivered so far in `offsets_file` (atomically)."""
        if self.offsets_file is None:
            return
        temporary = self.offsets_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.resume_state()))
        os.replace(temporary, self.offsets_file)

    def resume_state(self) -> dict[str, Any]:
        """Where a new Subscriber (`resume=`) continues after everything delivered so far: per
        exchange the log offset, per stream the next sequence (JSON-compatible)."""
        exchanges = {**self._resume.get("exchanges", {}), **self.positions()}
        streams = {sid: stream.next_seq for sid, stream in self.sequencer.streams.items()}
        # Records not yet yielded must come again after a restart: start their exchange's read
        # at their batch, and their stream at their sequence (the rest of the batch is dropped
        # again as already delivered).
        for exchange_id, record in [*self._pending, *self._delayed.items()]:
            if exchange_id:
                held = exchanges.get(exchange_id, record.offset)
                exchanges[exchange_id] = min(held, record.offset)
            sid = (record.producer_id, record.key)
            streams[sid] = min(streams.get(sid, record.seq), record.seq)
        # Batches the sequencer holds for a gap were read but not delivered: their exchange's
        # read restarts at them too (their stream's position is already before them).
        for feed, offset in self.sequencer.held_offsets():
            if isinstance(feed, Feed) and feed.logged and feed.exchange_id in exchanges:
                exchanges[feed.exchange_id] = min(exchanges[feed.exchange_id], offset)
        state: dict[str, Any] = {
            "queue": self.queue,
            "exchanges": exchanges,
            "streams": [[pid.hex(), key.hex(), seq] for (pid, key), seq in streams.items()],
        }
        since_us = self._since_us()
        if since_us is not None:
            state["since_us"] = since_us
        return state

    def _since_us(self) -> int | None:
        """Where this subscriber's history starts in time, for the exchanges it has no offset
        of: a resumed one keeps its first run's; one that started "now" (or from_time) its own
        start. A run that received nothing thus still records where it started."""
        kept = self._resume.get("since_us")
        if kept is not None:
            return int(kept)
        if self.from_time is not None:
            return int(self.from_time * 1_000_000)
        if self.start == "now" and self.from_offset is None:
            return self._started_us
        return None  # from the beginning or an offset: every exchange has one (or starts at it)

    def _load_offsets(self) -> dict[str, Any]:
        if self.offsets_file is None or not self.offsets_file.exists():
            return {}
        try:
            return self._apply_resume(json.loads(self.offsets_file.read_text()))
        except (OSError, ValueError, TypeError) as error:
            raise BadInput(f"offsets file {self.offsets_file} is unreadable: {error}") from None

    def _apply_resume(self, state: dict[str, Any]) -> dict[str, Any]:
        for pid, key, next_seq in state.get("streams", []):
            self.sequencer.resume(bytes.fromhex(pid), bytes.fromhex(key), int(next_seq))
        return dict(state)

    def messages(self, count: int | None = None, timeout_s: float | None = None) -> Iterator[Any]:
        """Yield records (`format.Record`) until `count` were yielded or `timeout_s` passed
        without the count being reached (None: forever). Records of a batch that were not
        yielded (the count was reached mid-batch, or the caller stopped iterating) are kept
        for the next call, and `commit()` positions before them."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        yielded = 0
        while count is None or yielded < count:
            if self._pending:
                record = self._next_pending()  # popped first: a yielded record is delivered
                if record is not None:
                    yield record
                    yielded += 1
                continue
            wait = limits.poll_interval_ms
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = max(1, min(wait, int(left * 1000)))
            self._fill(wait)

    def run(self, callback: Callable[[Any], None], stop: threading.Event) -> None:
        """Call `callback(record)` for every message until `stop` is set."""
        while not stop.is_set():
            self._fill(limits.poll_interval_ms)
            while self._pending:
                record = self._next_pending()
                if record is not None:
                    callback(record)

    def _fill(self, wait_ms: int) -> None:
        """Wait up to `wait_ms` for batches and queue their records in `_pending`: those due,
        and those held for their not-before time once it comes (the wait ends then)."""
        gate = self._delayed
        due = gate.next_due()
        if due is not None:
            wait_ms = max(1, min(wait_ms, (due - now_us()) // 1000 + 1))
        if gate.full:  # take no more batches until some held ones come due
            time.sleep(wait_ms / 1000)
        else:
            for delivery in self.poll(wait_ms):
                source = getattr(delivery.source, "exchange_id", "")
                self._admit(source, delivery)
        if gate.held:
            self._pending.extend(gate.release(now_us()))

    def _admit(self, source: str, delivery: Delivery) -> None:
        pending, gate = self._pending, self._delayed
        now = 0
        for record in records(delivery):
            if record.meta is None and not gate.held:
                pending.append((source, record))  # the common path: one test per record
                continue
            now = now or now_us()
            if gate.offer((source, record), record, now):
                pending.append((source, record))

    def _next_pending(self) -> batchfmt.Record | None:
        """The next record to hand out; None if it expired (dropped and counted instead)."""
        record = self._pending.popleft()[1]
        if record.meta is not None and expired(record.meta, now_us()):
            self.expired += 1
            return None
        return record

    # --- statistics ----------------------------------------------------------------------------
    def _publish_stats(self, now: float) -> None:
        samples = sorted(self.latency_us)
        self.latency_us = []
        # The histogram lets the analytics job merge percentiles across subscribers and
        # periods; a mean and a p99 per period cannot be merged.
        totals = (self.received_messages, self.sequencer.lost, self.sequencer.duplicates)
        kpi = SubscriberKpi.of_samples(self.subscriber_id, self.queue, totals, samples, time.time())
        # Not taken when the socket is full: a slow stat monitor misses this period.
        send_nowait(self.stats, [bsonmsg.encode(kpi.encode())])
        self._next_stat = now + limits.subscriber_stat_period_s

    def close(self) -> None:
        for feed in self.feeds.values():
            feed.close()
        for sock in (self.notices, self.stats):
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


def _copies_by_leader(copies: tuple[DeadLog, ...]) -> dict[str, list[tuple[str, int]]]:
    """The monitor's `Copies` as leader id → [(replica log endpoint, copy end)], best first
    (a dead log without a copy is left out)."""
    return {
        dead.leader_id: [(r.log, r.end) for r in dead.replicas] for dead in copies if dead.replicas
    }


class SubscribeRefused(RoqError):
    """The monitor refused this subscriber: its principal lacks subscribe on the queue."""

    exit_code = EXIT_NOPERM


def _fenced(reply: dict[str, Any]) -> bool:
    """The monitor refused because its host lost its lease (another may serve the queue)."""
    return Reply.decode(reply).error == Reason.FENCED
