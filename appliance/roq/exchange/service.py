"""roq exchange: receives publishers' record batches and fans them out to subscribers.

Ports (F = the front port the host allocated; 4 in all):

    F    ROUTER  publishers' DEALERs send batches, drains and confirmed batches here
    F+1  XPUB    subscribers' SUB sockets connect here; frames are [key][batch]
    F+2  REP     control socket (PING / SHUTDOWN / MONITOR_MOVED from the host, REPLICAS from
                 the monitor)
    F+3  ROUTER  reads of the message log (replay, catch-up, seek by time): `logserver.py`;
                 replication writes from other exchanges: `replication.py`

Hot path (DESIGN §6b): a batch is received with one copy out of ZeroMQ (cheaper than a zero-copy
frame for all but the largest batches, `_pump`), its header bounds, CRC and records checked
(`format.check_batch`, `format.check_records`: a batch whose records do not fill it is refused,
or it would block every replay), and the same bytes are forwarded with the routing key
as the first frame, so ZeroMQ's prefix matching in the subscribers does the key routing. There is
no per-message Python work when a batch's records have one size (the record check is then a few
strided byte slices); records of mixed sizes are walked, ~80 ns each (docs/benchmarks.md §6b).

With `useLog` (the default) every batch is appended to the exchange's message log before it
is forwarded: the log stamps the batch's offset (its byte position) into the header, so
subscribers see offsets they can resume from. `acks=leader` is answered once the append
returned (the batch survives a crash of the exchange process; a crash of the machine too under
`log.flush=every-batch`). If the log cannot be written (full or read-only disk), batches are
refused with a reason rather than forwarded without being kept, and the exchange says so to its
monitor at once (a report whose `Refusing` names the reason), which moves its publishers to
exchanges that can append and places none here; every heartbeat it tries whether
`limits.exchange_space_probe_bytes` can be written beside its log (`Log.room_for`), and once
that, or an append, works it reports again without `Refusing` and takes publishers again.

The exchange reports its load to its monitor every `heartbeat.period` (the report is also the
heartbeat) and publishes RoQ's KPI envelope (20/21/22) to the stat monitor every
`monitor.stat.period`. Its report socket is an XPUB: a monitor that subscribes (a monitor
started, restarted or re-placed, which the host's MONITOR_MOVED points it to) gets a report at
once, so it can place publishers on this exchange without waiting for a heartbeat. It tells
the monitor at once when its count of subscriptions changes (the subscribers' XPUB socket
hands every subscribe and unsubscribe up), so a new exchange takes publishers as soon as the
queue's subscribers have joined it rather than after a fixed wait. On SHUTDOWN or SIGTERM
it tells the monitor it is leaving, keeps serving while its publishers drain and move away
(bounded), then exits.

The main thread runs the poll loop and owns every socket but one, the log and its replica
copies. Three helper threads keep slow work off it: the pulse (`pulse.py`, its own PUB socket
to the monitor), the log's flusher (`log/flusher.py`, fdatasync under `log.flush=interval`) and
the process's janitor (`log/janitor.py`, unlinks retired segments); none touches a socket of
the loop. The flusher and the janitor each hand over through one lock-guarded slot; the pulse
only reads the time of the loop's last turn (one float).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from roq import limits
from roq.config import ExchangeSettings
from roq.errors import CorruptRecord, LogError, LogUnavailable, ProtocolError
from roq.exchange import metrics
from roq.exchange.logserver import LogServer
from roq.exchange.pulse import Pulse
from roq.exchange.slotcuts import SlotCuts
from roq.log import Log, log_directory, mark_retired
from roq.log import format as batchfmt
from roq.log.dedup import IdWindow
from roq.protocol import bsonmsg, dataplane
from roq.protocol.commands import ChildCommand, Reason
from roq.protocol.dispatch import Done, Encodable, Refused, Route, route
from roq.protocol.epoch import EpochWatch
from roq.protocol.messages.control import ExchangeStatus, MonitorMoved, Replicas
from roq.protocol.messages.kpi import ExchangeKpi
from roq.protocol.messages.monitor import (
    CopyEnd,
    ExchangeIdentity,
    ExchangePulse,
    ExchangeReport,
    ExchangeSubscriptions,
    ProducerRate,
    ReportedLoad,
)
from roq.protocol.ports import ExchangePort, endpoint_at, port_at
from roq.protocol.principals import Permission
from roq.replication import CopySender, ReplicaStore, Replicator
from roq.system import procstat
from roq.system.lease import Fence, fenced_exit_s
from roq.transport import (
    READABLE,
    Kind,
    Poller,
    bind,
    connect,
    copying_send_pays,
    disconnect,
    drained,
    open_socket,
    recv_nowait,
    security,
    send_nowait,
)
from roq.transport.control import ControlServer

log = logging.getLogger(__name__)

# Not a bound: the producer id under which producers past limits.exchange_producers_tracked_max
# are counted together.
_OTHERS = b"\xff" * 16


@dataclass
class ExchangeSpec:
    queue: str
    exchange_id: str
    address: str
    port: int
    monitor: str  # tcp://ip:B, the monitor's report socket
    stat: str  # tcp://ip:S, the stat monitor's input
    lease: str = ""  # its host's lease file (fencing, system/lease.py); "": always acts
    epoch: int = 0  # its monitor's assignment epoch when started (protocol/epoch.py)
    # A keeper of a lost exchange's log (host/keepers.py): it binds only F+2 and F+3, serves
    # reads of the log and its copies, and sends them to the exchanges the monitor names
    keeper: bool = False
    # A log follower (log.followers): binds only F+2 and F+3 like a keeper, and holds the copies
    # of live logs its monitor assigns it on a host without the queue's exchanges
    follower: bool = False

    @property
    def takes_publishers(self) -> bool:
        return not (self.keeper or self.follower)

    @property
    def front(self) -> str:
        return endpoint_at(self.address, self.port, ExchangePort.FRONT)

    @property
    def back(self) -> str:
        return endpoint_at(self.address, self.port, ExchangePort.BACK)

    @property
    def name(self) -> str:
        role = "log keeper" if self.keeper else "log follower" if self.follower else "exchange"
        return f"{role} {self.queue}/{self.exchange_id}"


@dataclass(frozen=True)
class Rates:
    """One period of a `LoadMeter`, per second."""

    msgs: float
    payload: float
    producers: int
    top: tuple[ProducerRate, ...]  # the busiest producers first


@dataclass
class LoadMeter:
    """Messages and payload bytes since the last rollover, in all and per producer."""

    msgs: int = 0
    payload: int = 0
    producers: dict[bytes, list[int]] = field(default_factory=dict)
    total_msgs: int = 0
    total_bytes: int = 0

    def add(self, producer: bytes, count: int, payload_bytes: int) -> None:
        self.msgs += count
        self.payload += payload_bytes
        entry = self.producers.get(producer)
        if entry is None:
            if len(self.producers) >= limits.exchange_producers_tracked_max:
                producer = _OTHERS
            entry = self.producers.setdefault(producer, [0, 0])
        entry[0] += count
        entry[1] += payload_bytes

    def rollover(self, seconds: float) -> Rates:
        """Per-second rates of the period that ends now, and a fresh period."""
        seconds = max(seconds, 1e-3)
        top = sorted(self.producers.items(), key=lambda item: item[1][1], reverse=True)
        rates = Rates(
            self.msgs / seconds,
            self.payload / seconds,
            len(self.producers),
            tuple(
                ProducerRate(pid.hex(), m / seconds, b / seconds)
                for pid, (m, b) in top[: limits.exchange_producers_reported_max]
            ),
        )
        self.total_msgs += self.msgs
        self.total_bytes += self.payload
        self.msgs = self.payload = 0
        self.producers = {}
        return rates


@dataclass
class Forwarded:
    """Messages and payload bytes forwarded to live subscribers since the start."""

    msgs: int = 0
    payload: int = 0

    def add(self, count: int, payload_bytes: int) -> None:
        self.msgs += count
        self.payload += payload_bytes


def _present(ids: list[bytes | None]) -> list[bytes]:
    return [found for found in ids if found is not None]


class BadFrameLog:
    """Logs refused frames without letting a flood of them flood the log: at most `per_period`
    lines per period, then one line saying how many were not shown."""

    def __init__(self, name: str, per_period: int = 10, period_s: float = 1.0):
        self.name, self.per_period, self.period_s = name, per_period, period_s
        self.count = 0
        self._shown = self._hidden = 0
        self._since = time.monotonic()

    def refused(self, reason: str, what: str = "dropped a bad frame") -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._since >= self.period_s:
            if self._hidden:
                log.warning("%s: %d more bad frames not shown", self.name, self._hidden)
            self._shown = self._hidden = 0
            self._since = now
        if self._shown < self.per_period:
            self._shown += 1
            log.warning("%s: %s: %s", self.name, what, reason)
        else:
            self._hidden += 1


class Exchange:
    """One exchange process. Its main thread owns every socket."""

    def __init__(self, context: Any, spec: ExchangeSpec, settings: ExchangeSettings):
        self.spec = spec
        self.settings = settings
        self.heartbeat_s = settings.heartbeat_s
        self.kpi_s = settings.stat_period_s
        self._last_report = self._next_report = self._last_kpi = self._next_kpi = 0.0
        self.load = LoadMeter()
        self.kpi_load = LoadMeter()
        self.bad = BadFrameLog(spec.name)
        self.subscriptions = 0  # (subscriber connection, key prefix) pairs on the XPUB socket
        self.forwarded = Forwarded()  # to live subscribers (roq_exchange_messages_out_total)
        self._subscriptions_told = 0
        self._next_subscriptions_notice = 0.0
        self.refusing = ""  # why the log refuses appends ("" while they succeed)
        self._next_room_probe = 0.0
        self.accepted_bytes = 0  # the offset the next batch would have in the log
        self.slot_cuts = SlotCuts()  # work queues: where the log's slots end (monitor/slots.py)
        # message ids appended within dedup.window.ms (a keeper takes no publishers)
        self.dedup = IdWindow(settings.dedup_window_ms if spec.takes_publishers else 0)
        self._slot_messages = 0  # appended since the last cut
        self.leaving_since: float | None = None
        self.retired = False  # a keeper told to retire (`_retire`): it exits EXIT_RETIRED
        self.started = time.time()  # tells the monitor a restarted exchange from its old self
        # ... and its publishers (in drain answers): a process restarted at the same address
        # never confirms what was sent to the one before it
        self.run_id = os.urandom(dataplane.RUN_BYTES)
        self.fence = Fence(spec.lease, spec.name, fenced_exit_s(settings.session_timeout_ms))
        self.fenced_out = False  # its lease ended long ago: it exits EXIT_FENCED
        # the highest assignment epoch of the queue seen (its start's, 1031's, 1030's): a
        # monitor's word of an older one, from a monitor since re-placed, is refused
        self.epochs = EpochWatch(spec.name, spec.epoch)
        self._acting = True  # read by the pulse thread too (a bool: atomic)
        self._last_inbound = time.monotonic()
        self._loop_turned = time.monotonic()  # read by the pulse thread (a float: atomic)
        self._cpu = procstat.CpuMeter()
        self._kpi_cpu = procstat.CpuMeter()
        self.log = self._open_log()
        self._open_sockets(context)
        self.log_server: LogServer | None = None
        self.replicator: Replicator | None = None
        self.copy_sender: CopySender | None = None  # copies of gone logs sent again
        # acks=all batches appended, awaiting their copies: (publisher, token, end, since)
        self.committed_acks: collections.deque[tuple[bytes, bytes, int, float]] = (
            collections.deque()
        )
        # acks=leader confirmations and drain answers, sent at the end of the loop turn (in
        # order): sent one by one between receives they cost publishers 20-40 % of their p50
        # latency at 5,000 msg/s (docs/benchmarks.md, Findings)
        self.replies: list[list[bytes]] = []
        if self.log is not None:
            copies = ReplicaStore(settings.log_root, spec.queue, spec.exchange_id, settings.log,
                                  copied=self._copied_ids)  # fmt: skip
            self.log_server = LogServer(self.replay, self.log, spec.name, copies)
            self.replicator = Replicator(
                context, spec.exchange_id, self.log, spec.name,
                # a keeper's or follower's own log takes no publisher: nothing waits on it
                min_copies=settings.copies_for_acks_all if spec.takes_publishers else 1,
            )  # fmt: skip
            own = self.log if spec.keeper else None
            self.copy_sender = CopySender(context, copies, spec.name, own)

    def _open_log(self) -> Log | None:
        """The exchange's log (None with useLog=false), and the de-duplication window rebuilt
        from its tail."""
        spec, settings = self.spec, self.settings
        if not spec.takes_publishers and not settings.use_log:
            raise LogUnavailable(f"{spec.name}: a log keeper or follower needs useLog=true")
        if not settings.use_log:
            return None
        directory = log_directory(settings.log_root, spec.queue, spec.exchange_id)
        opened = Log.open(
            directory, settings.log, name=spec.name, background_flush=True, background_delete=True
        )
        log.info("%s: log %s holds offsets %d..%d", spec.name, directory,
                 opened.start_offset, opened.end_offset)  # fmt: skip
        self._rebuild_window(opened)
        return opened

    def _open_sockets(self, context: Any) -> None:
        spec = self.spec
        self.front = open_socket(
            context,
            Kind.ROUTER,
            rcvhwm=self.settings.publisher_hwm_batches,  # batches: memory
            sndhwm=limits.exchange_replies_hwm,  # replies, which the ROUTER would drop
        )
        # Who may connect (docs/security.md §5): the front takes publishers of this queue, the
        # back and the log port its subscribers (replication writes on the log port are checked
        # per request: logserver.py).
        publish = security.access_domain(Permission.PUBLISH, queue=spec.queue)
        subscribe = security.access_domain(Permission.SUBSCRIBE, queue=spec.queue)
        # log reads: subscribers, and work-queue consumers reading their slots
        reader = security.access_domain(Permission.SUBSCRIBE, Permission.CONSUME, queue=spec.queue)
        if spec.takes_publishers:  # not a keeper, even one that kept its address, nor a follower
            bind(self.front, spec.address, port_at(spec.port, ExchangePort.FRONT), publish)
        self.back = open_socket(
            context,
            Kind.XPUB,
            sndhwm=self.settings.subscriber_hwm_batches,
            linger_ms=limits.data_linger_ms,
        )
        if spec.takes_publishers:
            bind(self.back, spec.address, port_at(spec.port, ExchangePort.BACK), subscribe)
        self.copy_forward = copying_send_pays(self.back)  # CURVE copies anyway
        hwm = limits.log_server_hwm_messages
        self.replay = open_socket(context, Kind.ROUTER, sndhwm=hwm, rcvhwm=hwm)
        bind(self.replay, spec.address, port_at(spec.port, ExchangePort.LOG), reader)
        control = port_at(spec.port, ExchangePort.CONTROL)
        # The control commands of an exchange (beside PING and SHUTDOWN): the host's news that
        # the monitor moved, and the monitor's replica assignments when there is a log to copy.
        extra: dict[int, Route[Any, None]] = {
            ChildCommand.MONITOR_MOVED: route(MonitorMoved.decode, self.monitor_moved)
        }
        if self.log is not None:
            extra[ChildCommand.REPLICAS] = route(Replicas.decode, self.assign_replicas)
        self.control = ControlServer(context, spec.address, control, spec.name, extra)
        self.control.status = self.status
        self.control.metrics = lambda: metrics.samples(self)
        # an XPUB, so that a monitor's subscription (it started, or this exchange was pointed at
        # a new one) is seen and answered with a report at once
        self.reports = open_socket(context, Kind.XPUB, sndhwm=limits.exchange_reports_hwm)
        connect(self.reports, spec.monitor)
        self.kpi = open_socket(context, Kind.PUB, sndhwm=limits.exchange_kpi_hwm)
        connect(self.kpi, spec.stat)
        identity = ExchangePulse(spec.exchange_id, spec.front, self.started, loop_age_s=0.0)
        self.pulse = Pulse(
            context, spec.monitor, identity, self.heartbeat_s, lambda: self._loop_turned,
            acting=lambda: self._acting,
        )  # fmt: skip

    # --- main loop -----------------------------------------------------------------------------
    def _poller(self) -> Poller:
        poller = Poller()
        for sock in (self.front, self.back, self.control.sock, self.replay, self.reports):
            if sock is not self.front or self._acting:  # fenced: publishers' batches wait
                poller.register(sock, READABLE)
        for sock in self._replication_sockets():
            poller.register(sock, READABLE)
        self._replica_sockets = set(self._replication_sockets())
        return poller

    def _replication_sockets(self) -> list[Any]:
        """The links to this log's replicas, and to the targets of the gone logs it sends."""
        if self.replicator is None or self.copy_sender is None:
            return []
        return self.replicator.sockets() + self.copy_sender.sockets()

    def run(self, stop: threading.Event) -> None:
        poller = self._poller()
        self._last_report = self._last_kpi = time.monotonic()
        self._next_report, self._next_kpi = self._last_report, self._last_kpi
        self._log_serving()
        self.pulse.start()
        while not self._finished():
            self._loop_turned = time.monotonic()
            if (stop.is_set() or self.control.stop_requested) and self.leaving_since is None:
                self._leave()
            events = dict(poller.poll(limits.poll_interval_ms))
            poller = self._follow_fence(poller, events)
            if self.front in events:
                # A slice of the heartbeat period at most: a saturated exchange on a starved
                # CPU or a throttled disk must still heartbeat, or the monitor declares it dead.
                self._pump(time.monotonic() + self.heartbeat_s / 4)
                self._timers()
            if self.back in events:
                self._count_subscriptions()
            if self.reports in events:
                self._monitor_subscribed()
            if self.control.sock in events:
                self.control.handle()
            if self.replay in events:
                self._serve_log()
                self._timers()
            if self.log is not None:
                self.log.tick(time.monotonic())
            if self.replicator is not None:
                self._replicate(events)
                if set(self._replication_sockets()) != self._replica_sockets:
                    poller = self._poller()  # the monitor changed the replica set
            self._send_replies()
            self._timers()

    def _log_serving(self) -> None:
        if not self.spec.takes_publishers:
            log.info("%s: serving reads of its log and copies on %s", self.spec.name,
                     endpoint_at(self.spec.address, self.spec.port, ExchangePort.LOG))  # fmt: skip
        else:
            log.info("%s: serving publishers on %s, subscribers on %s", *self._where())

    def _send_replies(self) -> None:
        for frames in self.replies:
            self.front.send_multipart(frames)
        self.replies.clear()

    def _timers(self) -> None:
        """The heartbeat report, the KPI stream and a changed subscription count, when due."""
        now = time.monotonic()
        if self.refusing:
            self._probe_room(now)
        if self.subscriptions != self._subscriptions_told:
            self._tell_subscriptions(now)
        if now >= self._next_report:
            self._report(now - self._last_report)
            self._last_report, self._next_report = now, now + self.heartbeat_s
        if now >= self._next_kpi:
            self._publish_kpi(now - self._last_kpi)
            self._last_kpi, self._next_kpi = now, now + self.kpi_s

    def _tell_subscriptions(self, now: float) -> None:
        if now < self._next_subscriptions_notice:
            return  # bounded: a crowd of subscribers joining costs one notice per interval
        self._subscriptions_told = self.subscriptions
        self._next_subscriptions_notice = now + limits.exchange_subscriptions_notice_ms / 1000
        self._send_report(ExchangeSubscriptions(self._identity(), self.subscriptions))

    def _where(self) -> tuple[str, str, str]:
        return self.spec.name, self.spec.front, self.spec.back

    def _follow_fence(self, poller: Poller, events: dict[Any, int]) -> Poller:
        """This pass's lease check: fenced, it stops reading its publishers' batches (this
        pass's too); fenced long past the lease, it is done (`fenced_out`: it goes as it is,
        having acted on nothing since)."""
        now = time.monotonic()
        if self.fence.acting(now) != self._acting:
            self._acting = not self._acting
            poller = self._poller()
            events.pop(self.front, None)
        self.fenced_out = self.fence.given_up(now)
        return poller

    def _finished(self) -> bool:
        if self.fenced_out:
            return True
        if self.leaving_since is None:
            return False
        now = time.monotonic()
        quiet = now - self._last_inbound >= limits.exchange_leave_quiet_s
        return (quiet and now - self.leaving_since >= limits.exchange_leave_quiet_s) or (
            now - self.leaving_since >= limits.exchange_leave_max_s
        )

    def _leave(self) -> None:
        """Tell the monitor first, so publishers move away while this exchange still drains."""
        log.info("%s: leaving; publishers are told to move", self.spec.name)
        self.leaving_since = time.monotonic()
        self._send_report(ExchangeReport(self._identity(), None, leaving=True))

    def _pump(self, deadline: float) -> None:
        taken, burst_bytes = 0, limits.exchange_burst_bytes  # a local: compared per batch
        # Copying receive: a zero-copy Frame object costs more than copying all but the
        # largest batches (benchmarks/exchange_flood.py), and the log copies anyway.
        for frames in drained(self.front, limits.exchange_burst_batches):
            self._last_inbound = time.monotonic()
            taken += len(frames[-1])
            self._handle(frames[0], [memoryview(frame) for frame in frames[1:]])
            if time.monotonic() > deadline or taken > burst_bytes:
                return

    def _monitor_subscribed(self) -> None:
        """A monitor connected (its SUB subscribes): report now, not a heartbeat later."""
        for frames in drained(self.reports, limits.control_hwm_messages):
            if frames[0][:1] == b"\x01":
                self._next_report = 0.0  # the loop's timers send it this turn

    def _count_subscriptions(self) -> None:
        """Subscribe (first byte 1) and unsubscribe (0) messages from the XPUB socket: ZeroMQ has
        already applied them to its filter; they are read only to be counted."""
        for frames in drained(self.back, limits.exchange_burst_batches):
            message = frames[0]
            if message[:1] == b"\x01":
                self.subscriptions += 1
            elif message[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)

    def _handle(self, peer: bytes, frames: list[memoryview]) -> None:
        try:
            message = dataplane.parse_inbound(frames)
        except ProtocolError as error:
            self.bad.refused(f"{error} (from publisher connection {peer.hex()})")
            return
        if message.batch is None:
            self.replies.append([peer, *dataplane.drained(message.token, self.run_id)])
            return
        try:
            offset = self._accept(message.batch)
        except (ProtocolError, CorruptRecord, LogUnavailable) as error:
            unlogged = isinstance(error, LogUnavailable)
            if unlogged:
                self._cannot_append(str(error))
            self.bad.refused(
                str(error),
                "refused a batch: the log is unavailable" if unlogged else "dropped a bad frame",
            )
            reply = (
                dataplane.nack(message.token, str(error))
                if message.token
                else dataplane.refused(str(error))
            )
            self.front.send_multipart([peer, *reply])
            return
        if offset is None:  # a duplicate: stored already, so a success for its publisher
            offset = self.log.end_offset if self.log is not None else self.accepted_bytes
            end = offset  # confirmed once all appended so far is committed: the original is
        else:
            end = offset + len(message.batch)
        if message.kind == dataplane.COMMITTED_BATCH and self.replicator is not None:
            # confirmed once replicated
            self.committed_acks.append((peer, message.token, end, time.monotonic()))
        elif message.token:
            self.replies.append([peer, *dataplane.ack(message.token, offset)])

    def _replicate(self, events: dict[Any, int]) -> None:
        """Read replicas' answers, back-fill laggards, confirm acks=all batches now committed."""
        assert self.replicator is not None and self.copy_sender is not None
        for sock in self._replica_sockets:
            if sock in events:
                self.replicator.on_answer(sock)
                self.copy_sender.on_answer(sock)  # each ignores the other's sockets
        self.replicator.backfill()
        self.copy_sender.backfill()
        if not self._acting:
            return  # fenced: acknowledges nothing (its publishers ask elsewhere)
        committed = self.replicator.committed()
        while self.committed_acks and self.committed_acks[0][2] <= committed:
            peer, token, end, _ = self.committed_acks.popleft()
            self.front.send_multipart([peer, *dataplane.ack(token, end)])
        if self.replicator.below_min_copies:
            self._refuse_uncopied()

    def _refuse_uncopied(self) -> None:
        """Fewer copies in sync than min.insync.copies: the acks=all batches that waited past
        `limits.acks_all_insync_wait_s` are refused, retriably (Kafka's
        NotEnoughReplicasAfterAppend: they are in this log, and a subscriber may yet read them
        once a copy catches up; a publisher that sends them again is de-duplicated)."""
        assert self.replicator is not None
        oldest = time.monotonic() - limits.acks_all_insync_wait_s
        if not self.committed_acks or self.committed_acks[0][3] > oldest:
            return
        replicator = self.replicator
        reason = (
            f"queue {self.spec.queue}: not acknowledged: {replicator.copies_in_sync} of "
            f"min.insync.copies={replicator.min_copies} copies of exchange "
            f"{self.spec.exchange_id}'s log in sync for {limits.acks_all_insync_wait_s:g} s "
            "(retriable: send again)"
        )
        refused = 0
        while self.committed_acks and self.committed_acks[0][3] <= oldest:
            peer, token, _, _ = self.committed_acks.popleft()
            self.front.send_multipart([peer, *dataplane.nack(token, reason)])
            refused += 1
        log.warning("%s: refused %d acks=all batch(es): %s", self.spec.name, refused, reason)

    def monitor_moved(self, moved: MonitorMoved) -> Encodable:
        """1031, from the host: the queue's monitor was re-placed (unless the move is older
        than a monitor this exchange has seen)."""
        if not self.epochs.admits(moved.epoch, f"the move to {moved.monitor}"):
            return self._stale(moved.epoch)
        return self._follow_monitor(moved)

    def assign_replicas(self, assigned: Replicas) -> Encodable:
        """1030, from the monitor: who copies this log, and whose logs this exchange copies
        (the only leaders its copies take writes from). Served only with a log, so there is a
        replicator; decoded whole before anything changes."""
        assert self.replicator is not None
        if not self.epochs.admits(assigned.epoch, f"a monitor of epoch {assigned.epoch}"):
            return self._stale(assigned.epoch)
        pairs = [(r.replica_id, r.endpoint) for r in assigned.replicas]
        self.replicator.assign([p for p in pairs if p[0] != self.spec.exchange_id])
        if assigned.leaders is not None and self.log_server is not None:
            self.log_server.copies.accept(assigned.leaders)
        if assigned.drop_state_before and self.log_server is not None:
            self.log_server.copies.drop_state_before(assigned.drop_state_before)
        if assigned.consumed_before and self.log is not None:
            self._consumed_before(self.log, assigned.consumed_before)
        if self.copy_sender is not None:
            self.copy_sender.assign([(s.leader_id, s.target_id, s.endpoint)
                                     for s in assigned.sources])  # fmt: skip
        if assigned.retire and self.spec.keeper and not self.retired:
            self._retire()
        return Done("assigned")

    def _consumed_before(self, log_: Log, offset: int) -> None:
        """No reader needs this log before `offset` (an HTTP gateway's queue: every message
        there is evicted from its topic): its whole segments before it go, and its copies
        follow its start (PRUNE), as a compacted state log's do."""
        assert self.replicator is not None
        self.replicator.prune = True
        deleted = log_.retain_from(offset)
        if deleted:
            log.info("%s: %d segment(s) before offset %d deleted: no reader needs them",
                     self.spec.name, deleted, offset)  # fmt: skip

    def _retire(self) -> None:
        """A keeper's logs all have their copies on live exchanges (the monitor's word): the
        lost exchange's log directory is marked so no keeper serves it again, and the keeper
        leaves as an exchange does, then exits EXIT_RETIRED (host/keepers.py)."""
        why = f"retired {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: live exchanges hold"
        directory = log_directory(self.settings.log_root, self.spec.queue, self.spec.exchange_id)
        mark_retired(directory, f"{why} this log and the copies kept beside it")
        log.warning("%s: retires: live exchanges hold its log and copies", self.spec.name)
        self.retired = True
        self.control.stop_requested = True

    def _stale(self, epoch: int) -> Refused:
        return Refused(
            Reason.STALE_EPOCH,
            f"epoch {epoch} is older than epoch {self.epochs.highest}: refused",
        )

    def _follow_monitor(self, moved: MonitorMoved) -> Done:
        """The queue's monitor was re-placed after its host was lost: report to the new one."""
        if moved.monitor != self.spec.monitor:
            log.warning("%s: the monitor moved from %s to %s", self.spec.name,
                        self.spec.monitor, moved.monitor)  # fmt: skip
            disconnect(self.reports, self.spec.monitor)
            connect(self.reports, moved.monitor)
            self.pulse.retarget(moved.monitor)
        if moved.stat != self.spec.stat:
            disconnect(self.kpi, self.spec.stat)
            connect(self.kpi, moved.stat)
        self.spec.monitor, self.spec.stat = moved.monitor, moved.stat
        return Done("moved")

    def _accept(self, batch: memoryview) -> int | None:
        """Check one batch, forward it to subscribers and count it; returns its offset, or
        None for a duplicate (`_fresh_ids`), which is neither appended nor forwarded."""
        header = batchfmt.check_batch(batch, 0)
        if header.size != len(batch):
            raise ProtocolError(f"frame of {len(batch)} bytes holds a batch of {header.size}")
        try:
            batchfmt.check_records(batch, header)
        except CorruptRecord as error:
            raise CorruptRecord(
                f"batch of producer {header.producer_id.hex()} (key {header.key[:64]!r}, "
                f"sequence {header.first_seq}..{header.last_seq}): {error}"
            ) from None
        ids: list[bytes] = []
        if header.version != batchfmt.FORMAT_VERSION and self.dedup.window_ms:  # v1: no ids
            found = self._fresh_ids(batch, header)
            if found is None:
                return None
            ids = found
        if self.log is not None:
            stamped = bytearray(batch)  # the log stamps the offset in place: forward those bytes
            offset = self.log.append(stamped, header)
            if self.refusing:
                self._can_append()
            self.back.send_multipart([header.key, stamped], copy=self.copy_forward)
            self._slot_messages += header.count  # work queues: one add per batch
            if self._slot_messages >= self.settings.slot_messages:
                self.slot_cuts.add(offset + header.size)
                self._slot_messages = 0
        else:
            offset = self.accepted_bytes
            self.back.send_multipart([header.key, batch], copy=self.copy_forward)
        payload = header.size - batchfmt.HEADER_BYTES - len(header.key)
        payload -= batchfmt.RECORD_BYTES * header.count
        if self.subscriptions:  # the XPUB socket drops what no subscriber asked for
            self.forwarded.add(header.count, payload)
        self.load.add(header.producer_id, header.count, payload)
        self.kpi_load.add(header.producer_id, header.count, payload)
        self.accepted_bytes += header.size
        if ids:  # only once stored: a batch refused here may be sent again
            self.dedup.add_all(ids, time.time_ns() // 1_000_000)
        return offset

    def _fresh_ids(self, batch: memoryview, header: batchfmt.BatchHeader) -> list[bytes] | None:
        """The message ids of a v2 batch to remember once it is appended, or None when every
        record carries an id appended within the window: the batch is then a duplicate. A
        batch mixing new and seen ids is appended whole (its records' sequence numbers are
        contiguous: dropping some would leave a gap in the publisher's stream)."""
        ids = batchfmt.message_ids(batch, header)
        present = _present(ids)
        now_ms = time.time_ns() // 1_000_000
        if len(present) == len(ids) and self.dedup.all_seen(present, now_ms):
            self.dedup.duplicates += header.count
            return None
        return present

    def _copied_ids(
        self, frame: memoryview, checked: list[tuple[int, batchfmt.BatchHeader]]
    ) -> None:
        """Batches copied here from another exchange's log: their message ids join this one's
        window, so a publisher that sends them again here once that exchange died (its
        un-acknowledged batches) is de-duplicated. v1 batches cost one comparison each."""
        if not self.dedup.window_ms:
            return
        now_ms = time.time_ns() // 1_000_000
        for position, header in checked:
            if header.version != batchfmt.FORMAT_VERSION:
                ids = batchfmt.message_ids(frame, header, position)
                self.dedup.add_all(_present(ids), now_ms)

    def _rebuild_window(self, log_: Log) -> None:
        """The de-duplication window as it was: the ids of the log's tail written within the
        window (by the batches' timestamps), at most `limits.dedup_rebuild_bytes_max` of it.
        Read at the start, before any publisher is served."""
        if not self.dedup.window_ms:
            return
        cutoff_us = (time.time_ns() // 1_000_000 - self.dedup.window_ms) * 1000
        start = end = log_.end_offset
        for segment in reversed(log_.segments):  # known timestamps only: no scan to learn them
            old = segment.stats is not None and segment.stats.newest_ts_us < cutoff_us
            if old or end - segment.base > limits.dedup_rebuild_bytes_max:
                break
            start = segment.base
        began, offset = time.monotonic(), start
        try:
            while offset < end:
                read = log_.read(offset, limits.replication_backfill_read_bytes)
                for at, header in batchfmt.iter_batches(read.data):
                    if (
                        header.version != batchfmt.FORMAT_VERSION
                        and header.first_ts_us >= cutoff_us
                    ):
                        ids = batchfmt.message_ids(read.data, header, at)
                        self.dedup.add_all(_present(ids), header.first_ts_us // 1000)
                if read.next_offset <= offset:
                    break
                offset = read.next_offset
        except (CorruptRecord, LogError) as error:
            log.warning("%s: de-duplication window rebuilt up to offset %d only: %s",
                        self.spec.name, offset, error)  # fmt: skip
        if len(self.dedup):
            log.info("%s: de-duplication window: %d message ids from offsets %d..%d (%.2f s)",
                     self.spec.name, len(self.dedup), start, offset,
                     time.monotonic() - began)  # fmt: skip

    # --- appends refused (full or read-only disk) -------------------------------------------
    def _cannot_append(self, reason: str) -> None:
        """The monitor learns it at once (a report now): it moves this exchange's publishers to
        one that can append, and places none here until `_can_append`."""
        if self.refusing:
            return
        self.refusing = reason[: limits.message_str_chars_max]
        self._next_room_probe = time.monotonic() + self.heartbeat_s
        self._next_report = 0.0
        log.warning("%s: the log refuses appends (%s): publishers go elsewhere until it takes "
                    "them again", self.spec.name, reason)  # fmt: skip

    def _can_append(self) -> None:
        self.refusing = ""
        self._next_report = 0.0
        log.warning("%s: the log takes appends again: publishers may come back", self.spec.name)

    def _probe_room(self, now: float) -> None:
        """While refusing: whether a batch would now be written (every heartbeat)."""
        if self.log is None or now < self._next_room_probe:
            return
        self._next_room_probe = now + self.heartbeat_s
        if not self.log.room_for(limits.exchange_space_probe_bytes):
            self._can_append()

    def _serve_log(self) -> None:
        if self.log_server is not None:
            self.log_server.pump()
            return
        frames = recv_nowait(self.replay)  # no log: say so rather than leave the reader waiting
        if frames is None:
            return
        peer = frames[0]
        reply = dataplane.read_reply(dataplane.READ_ERROR, 0, 0, 0, b"useLog is false")
        self.replay.send_multipart([peer, *reply])

    # --- reports -------------------------------------------------------------------------------
    def _report(self, seconds: float) -> None:
        rates = self.load.rollover(seconds)
        load = ReportedLoad(
            msgs_rate=rates.msgs,
            bytes_rate=rates.payload,
            producers=rates.producers,
            top=rates.top,
            cpu=self._cpu.sample(),
            rss=procstat.rss_bytes(),
            load=procstat.load_average(),
            bad=self.bad.count,
            total_msgs=self.load.total_msgs,
            total_bytes=self.load.total_bytes,
            copies=self._copies(),
            subscriptions=self.subscriptions,
            end=self.log.end_offset if self.log is not None else 0,
            cuts=self.slot_cuts.report(),
            refusing=self.refusing,
            in_sync=self.replicator.copies_in_sync if self.replicator else 0,
            in_sync_min=self.replicator.min_copies if self.replicator else 0,
        )
        self._send_report(ExchangeReport(self._identity(), load, leaving=bool(self.leaving_since)))

    def _copies(self) -> tuple[CopyEnd, ...]:
        """The copies of other exchanges' logs held here: the monitor tells subscribers where
        to replay the log of an exchange that is dead."""
        if self.log_server is None:
            return ()
        ends = self.log_server.copies.ends()
        own = self.log_server.log
        # a keeper's own log is a copy of a lost exchange's, to be read: if it holds anything
        # (a lost log follower's own log is empty; its copies are what it keeps)
        if self.spec.keeper and own.end_offset > own.start_offset:
            ends[self.spec.exchange_id] = own.end_offset
        return tuple(CopyEnd(leader, end) for leader, end in sorted(ends.items()))

    def _identity(self) -> ExchangeIdentity:
        return ExchangeIdentity(
            queue=self.spec.queue,
            exchange_id=self.spec.exchange_id,
            front=self.spec.front,
            back=self.spec.back,
            period_s=self.heartbeat_s,
            started=self.started,
            logged=self.log is not None,
            host=self.settings.host_name or self.spec.address,
            keeper=self.spec.keeper,
            follower=self.spec.follower,
        )

    def _send_report(self, report: ExchangeReport | ExchangeSubscriptions) -> None:
        if not self._acting:
            return  # fenced: silent, so its monitor declares it dead and moves its publishers
        if not send_nowait(self.reports, [bsonmsg.encode(report.encode())]):
            log.debug("%s: monitor not keeping up; report dropped", self.spec.name)

    def _publish_kpi(self, seconds: float) -> None:
        """RoQ's 3-frame exchange KPI envelope (reference §2.9), per second instead of minute."""
        rates = self.kpi_load.rollover(seconds)
        kpi = ExchangeKpi(
            exchange_id=self.spec.exchange_id, queue=self.spec.queue, time=time.time(),
            period_s=seconds, total_processed=self.kpi_load.total_msgs, processed=rates.msgs,
            total_throughput=self.kpi_load.total_bytes, throughput=rates.payload,
            producers=rates.producers, cpu=procstat.load_average(),
            process_cpu=self._kpi_cpu.sample(), memory_mib=procstat.rss_bytes() / 2**20,
        )  # fmt: skip
        if not send_nowait(self.kpi, [bsonmsg.encode(frame) for frame in kpi.frames()]):
            log.debug("%s: stat monitor not keeping up; KPI dropped", self.spec.name)

    def status(self) -> dict[str, Any]:
        return ExchangeStatus(
            queue=self.spec.queue,
            exchange_id=self.spec.exchange_id,
            total_msgs=self.load.total_msgs + self.load.msgs,
            bad=self.bad.count,
            subscriptions=self.subscriptions,
            leaving=self.leaving_since is not None,
            log_start=self.log.start_offset if self.log else None,
            log_end=self.log.end_offset if self.log else None,
            replicas=tuple(self.replicator.status()) if self.replicator else (),
            committed=self.replicator.committed() if self.replicator else None,
            epoch=self.epochs.highest,
            stale=self.epochs.refused,
        ).encode()

    def close(self) -> None:
        self.fence.close()
        if self.pulse.is_alive():
            self.pulse.stop()
        for sock in (self.front, self.reports, self.kpi, self.replay):
            sock.close(0)
        if self.replicator is not None:
            self.replicator.close()
        if self.copy_sender is not None:
            self.copy_sender.close()
        if self.log_server is not None:
            self.log_server.copies.close()
        if self.log is not None:
            self.log.close()
        self.back.close()  # its linger lets the last batches reach subscribers (bounded)
        self.control.close()
