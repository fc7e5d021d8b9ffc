"""roq monitor: one per logical queue. Knows the queue's exchanges, places publishers, moves them.

Ports (B = the monitor port the host allocated, 6 in all; S = its stat port, 2):

    B+0  SUB   exchange reports (heartbeat + load, `MonitorCommand.EXCHANGE_REPORT`/`LEAVING`)
    B+1  ROUTER placement, for REQ peers: SUBSCRIBER_INIT → every exchange's back address;
               PUBLISHER_INIT / PUBLISHER_PANIC → the least-loaded exchange's front address;
               group (20–26) and task (40–45) commands; a TASK_GET may be held, answered later
    B+2  PUB   to publishers: [producer id hex | b"*"][BSON RELOCATE / EXCHANGE_LOST]
    B+3  PUB   to subscribers: NEW_EXCHANGE, and the full EXCHANGE_LIST every monitor.list.period
    B+4  PULL  scaling rules pushed by the GCM (admin 2008; RoQ's scaling process used S+2)
    B+5  REP   control (PING / SHUTDOWN from the host)
    S+0  SUB   statistics in (exchanges, subscribers): the stat monitor, inside this process
    S+1  PUB   the KPI stream: what came in on S (validated), plus the queue KPI (CMD 23)

Scaling (`roq.monitor.scaling.Scaler`, docs/elasticity.md) hooks in at three points only: every
report feeds its load window, a timer asks the policy (`policy.py`, pure) for a decision, and new
exchanges it created are filled by re-allocating publishers. Its admin requests run in its own
actuator thread (`actuator.py`).

An exchange silent for `monitor.dead.heartbeats` of its periods is dead (its publishers are told
with the exact front address they use, RoQ's never matched, and subscribers get the new list)
when its control connection is down, as a killed process leaves it; with that connection up it
is late, not dead, for up to `limits.monitor_late_silence_max_ms`, and time this monitor's own
loop did not turn is no exchange's silence (detector.py).
An exchange whose report says its log refuses appends (`Refusing`: a full or read-only disk) is
alive but of no use to publishers: with each such report its publishers are told to leave it
(EXCHANGE_LOST, not dead, with the reason; one that missed a notice hears the next), and no
publisher is placed or relocated there while another exchange can append. Its first report
without `Refusing` makes it placeable again. Exchanges report as soon as this monitor's
report socket connects to them (theirs is an XPUB), so a monitor just started or re-placed can
place publishers within milliseconds of its exchanges being told where it is.
The main thread runs the poll loop and owns every socket; the scaling actuator thread
(`actuator.py`) owns its AdminClient and talks to the main thread through two bounded queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from roq import limits
from roq.config import MonitorSettings
from roq.coordination.paths import Paths
from roq.coordination.session import SharedSession
from roq.errors import ProtocolError
from roq.monitor import metrics
from roq.monitor.detector import Lateness, TurnClock, credited, is_dead, is_late, late_max_s
from roq.monitor.grouplog import GroupLog
from roq.monitor.groups import GROUP_COMMANDS, GroupManager, Readable
from roq.monitor.migration import Migration
from roq.monitor.placement import (
    CopyPlan,
    ExchangeView,
    Move,
    assign_replicas,
    choose_exchange,
    mark_joined,
    plan_copies,
    plan_relocation,
)
from roq.monitor.publishers import PublisherKpis
from roq.monitor.scaling import Scaler
from roq.monitor.selection import live_members
from roq.monitor.state import CopyCandidate, StateKeeper
from roq.monitor.tasklog import TaskLog
from roq.monitor.tasks import TASK_COMMANDS, TaskManager
from roq.monitor.topics import TopicManager
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Encodable, Refused, Table, route
from roq.protocol.endpoints import parse_endpoint
from roq.protocol.epoch import EPOCH
from roq.protocol.messages.control import (
    CopyProgress,
    CopySource,
    MonitoredExchange,
    MonitorStatus,
    ReplicaAssignment,
    Replicas,
    ShortLog,
)
from roq.protocol.messages.kpi import PublisherKpi, QueueKpi, decode_kpi_message
from roq.protocol.messages.monitor import (
    CopyEnd,
    DeadLog,
    ExchangeEntry,
    ExchangeIdentity,
    ExchangeList,
    ExchangeLost,
    ExchangeMessage,
    ExchangePulse,
    ExchangeReport,
    ExchangeSubscriptions,
    NewExchange,
    Placed,
    PublisherInit,
    Relocate,
    ReplicaCopy,
    ReportedLoad,
    SubscriberInit,
    decode_exchange_message,
)
from roq.protocol.messages.topics import TOPIC_COMMANDS
from roq.protocol.names import is_state_log
from roq.protocol.ports import ExchangePort, MonitorPort, StatPort, port_at, sibling
from roq.protocol.principals import Permission, Principal, refusal
from roq.system.lease import Fence, fenced_exit_s
from roq.transport import (
    READABLE,
    ConnectionWatch,
    Kind,
    Poller,
    bind,
    connect,
    drained,
    open_socket,
    security,
    send_nowait,
)
from roq.transport.control import ControlServer
from roq.transport.rpc import Envelope, answer_routed, send_routed

log = logging.getLogger(__name__)
# With the state log, these replies show state written by their request: each is sent once the
# writes before it are on min.insync.copies copies (`StateKeeper.answer`).
_WAIT_FOR_COPIES = TASK_COMMANDS | TOPIC_COMMANDS


class Monitor:
    def __init__(
        self,
        context: Any,
        queue: str,
        address: str,
        port: int,
        stat_port: int,
        settings: MonitorSettings,
        lease: str = "",
        epoch: int = 0,
    ):
        self.queue, self.address, self.port, self.stat_port = queue, address, port, stat_port
        self.name = f"monitor {queue}"
        # its assignment epoch (protocol/epoch.py), in every reply and notice: a client or an
        # exchange that heard from a monitor placed later refuses this one's word
        self.epoch = epoch
        # fencing: its host's lease (system/lease.py); long past its end, the monitor exits
        exit_s = fenced_exit_s(settings.zk.session_timeout_ms)
        self.fence = Fence(lease, self.name, exit_s)
        self.fenced_out = False
        self._acting = True
        # until then it has not heard from every connected consumer (`_live_consumers`)
        self._deaf_until = time.monotonic() + limits.task_worker_rejoin_ms / 1000
        self.limits = settings.thresholds
        self.dead_after = settings.dead_heartbeats
        self.list_period_s = settings.list_period_s
        self.kpi_period_s = settings.stat_period_s
        self.exchanges: dict[str, ExchangeView] = {}  # by front address
        # By front address, never placed on: log keepers (host/keepers.py: lost exchanges'
        # logs to read and copy on) and log followers (log.followers: replicas first).
        self.keepers: dict[str, ExchangeView] = {}
        self.followers: dict[str, ExchangeView] = {}
        self.bad_frames = 0
        self.relocations = 0
        self.publisher_kpis = PublisherKpis()  # the publishers' 11 and 12, for STATUS
        self.replication_factor = settings.replication_factor
        self.copy_plans: dict[str, CopyPlan] = {}  # gone logs being copied again (_plan_copies)
        self.deaths = 0  # exchanges declared dead (roq_monitor_exchange_deaths_total)
        self.lates = 0  # ... kept as late, not dead (roq_monitor_exchanges_late_total)
        self._context = context
        self._controls: dict[str, Any] = {}  # front → DEALER to the exchange's control port
        # front → whether that DEALER's connection is up: a dead process's kernel closes it,
        # a late process's stays up (detector.py)
        self._links: dict[str, ConnectionWatch] = {}
        self._late: dict[str, float] = {}  # front → last heard, of those late but not dead
        # front → the longest silence it was heard again after, lately: its machine is starved
        self._lateness: dict[str, Lateness] = {}
        self._open_sockets(context)
        # its one ZooKeeper session, opened at its first use: the group store's, the task
        # store's and the scaling actuator's (coordination/session.py, SharedSession)
        self.zk = SharedSession(settings.zk.servers, settings.zk.session_timeout_ms,
                                security.zk_auth(), security.zk_tls())  # fmt: skip
        self.scaler = Scaler(
            context, queue, settings, self.zk, address, port_at(port, MonitorPort.RULES),
            emit=lambda event: self._send(self.kpi_out, [bsonmsg.encode(event.encode())]),
        )  # fmt: skip
        # the delivery-state log (`delivery.state=log`): task records and consumer groups there,
        # not in ZooKeeper
        log_state = settings.delivery_state == "log"
        self.state = self._state_keeper(context, settings) if log_state else None
        self.groups = GroupManager(
            queue, settings, self.zk, self._readable, self._reply_later,
            store=GroupLog(self.state) if self.state is not None else None,
        )  # fmt: skip
        self.tasks = TaskManager(  # request/response
            queue, settings, self.zk, self._live_consumers, self._reply_task, self.groups.wake,
            store=TaskLog(self.state) if self.state is not None else None,
        )  # fmt: skip
        self.topics = TopicManager(queue, self.state)  # the HTTP gateway's, in http-N queues
        self.table = self._placement_table()

    def _state_keeper(self, context: Any, settings: MonitorSettings) -> StateKeeper:
        # Without message logs (useLog=false) no exchange serves a log port to copy to: the
        # state log is then the monitor's alone, as the messages are the exchange's alone.
        copies = settings.replication_factor if settings.use_log else 1
        if copies < settings.replication_factor:
            log.warning("%s: useLog is false: its state log has no copy on another host",
                        self.name)  # fmt: skip
        return StateKeeper(
            context, self.queue, self.epoch, settings.log_root, settings.log,
            copies, min(settings.min_insync_copies, copies),
            settings.host_name or self.address,
            deliver=lambda envelope, doc: send_routed(self.requests, envelope, doc),
            refusal=lambda why: self._stamp(Refused(Reason.BUSY, why).encode()),
            migration=Migration(self.zk, Paths(settings.zk.namespace), self.queue),
        )  # fmt: skip

    def _open_sockets(self, context: Any) -> None:
        # Who may connect to each socket (docs/security.md §5): placement is open to every
        # principal and refuses per request, naming the missing permission.
        cluster = security.access_domain(cluster=True)
        publish = security.access_domain(Permission.PUBLISH, queue=self.queue)
        subscribe = security.access_domain(Permission.SUBSCRIBE, queue=self.queue)

        def bound(kind: Kind, port: int, access: str, **options: Any) -> Any:
            sock = open_socket(context, kind, **options)
            bind(sock, self.address, port, access)
            return sock

        def at(offset: MonitorPort) -> int:
            return port_at(self.port, offset)

        self.reports = bound(
            Kind.SUB,
            at(MonitorPort.REPORTS),
            cluster,
            rcvhwm=limits.monitor_stream_hwm,
            subscribe=b"",
        )
        # ROUTER, not REP: a request may be held (a TASK_GET's long poll) while others are
        # answered; every peer is a REQ socket and still gets exactly one reply per request
        self.requests = bound(Kind.ROUTER, at(MonitorPort.PLACEMENT), security.ZAP_DOMAIN)
        self.to_publishers = bound(
            Kind.PUB, at(MonitorPort.TO_PUBLISHERS), publish, sndhwm=limits.monitor_stream_hwm
        )
        self.to_subscribers = bound(
            Kind.PUB, at(MonitorPort.TO_SUBSCRIBERS), subscribe, sndhwm=limits.monitor_stream_hwm
        )
        s = self.stat_port
        self.stat_in = bound(
            Kind.SUB,
            port_at(s, StatPort.IN),
            security.ZAP_DOMAIN,
            rcvhwm=limits.monitor_stream_hwm,
            subscribe=b"",
        )
        self.kpi_out = bound(
            Kind.PUB, port_at(s, StatPort.KPI), subscribe, sndhwm=limits.monitor_stream_hwm
        )
        self.control = ControlServer(context, self.address, at(MonitorPort.CONTROL), self.name)
        self.control.status = self.status
        self.control.metrics = lambda: metrics.samples(self)

    # --- main loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        poller = Poller()
        handlers = {
            self.reports: self._pump_reports,
            self.requests: lambda: answer_routed(
                self.requests,
                self._answer,
                self.name,
                log,
                self._authorize,
                max_bytes=limits.task_frame_bytes_max,
            ),
            self.stat_in: self._pump_stats,
            self.control.sock: self.control.handle,
            self.scaler.sock: self.scaler.pump_rules,
        }
        for sock in handlers:
            poller.register(sock, READABLE)
        self._state_socks: set[Any] = set()
        now = time.monotonic()
        next_list, next_kpi = now + self.list_period_s, now + self.kpi_period_s
        next_scale = now
        self._deaf_until = now + limits.task_worker_rejoin_ms / 1000  # listening from now
        placement = port_at(self.port, MonitorPort.PLACEMENT)
        log.info("%s: placing publishers on tcp://%s:%d (epoch %d)", self.name, self.address,
                 placement, self.epoch)  # fmt: skip
        clock = TurnClock(now)
        while not (stop.is_set() or self.control.stop_requested or self.fenced_out):
            self._follow_copies(poller)
            wait_ms = self._poll_ms()
            ready = poller.poll(wait_ms)
            self._credit(clock.missed(time.monotonic(), wait_ms / 1000))
            self._check_fence(time.monotonic())  # before the requests that came in are answered
            for sock, _ in ready:
                if sock in handlers:
                    handlers[sock]()
            self.tasks.flush()  # this turn's task writes, one multi (or append), then replies
            if self.state is not None:
                self._pump_state(poller, {sock for sock, _ in ready})
            self.tasks.expire_waits()
            self.groups.expire_waits()
            now = time.monotonic()
            if not self._serving():
                self._deaf_until = now + limits.task_worker_rejoin_ms / 1000
            if not self._acting:
                continue  # fenced: no reaping, scaling, lists or replica assignments
            self._reap(now)
            if now >= next_scale:
                self._scale(now)
                self.groups.tick()
                self.tasks.tick()
                if self.state is not None:
                    self.state.tick()
                next_scale = now + limits.poll_interval_ms / 1000
            if now >= next_list:
                self._publish_list()
                self._cut_dead_logs()
                self._assign_replicas()  # again each period: a restarted exchange forgot it
                next_list = now + self.list_period_s
            if now >= next_kpi:
                self._publish_queue_kpi()
                next_kpi = now + self.kpi_period_s
        log.info("%s: stopping", self.name)

    def _pump_state(self, poller: Poller, ready: set[Any]) -> None:
        """Copies' answers, the turn's batch sent to them, the replies now committed."""
        assert self.state is not None
        self.state.pump(ready)
        self.groups.pump()  # a group commit copied: the next one starts now, not at a request
        self._follow_copies(poller)

    def _follow_copies(self, poller: Poller) -> None:
        """The poller follows the state log's copy set: `_assign_replicas` closes a released
        copy's socket anywhere in a turn, and a closed socket must not reach the next poll."""
        if self.state is None:
            return
        socks = set(self.state.sockets())
        for sock in self._state_socks - socks:
            poller.unregister(sock)
        for sock in socks - self._state_socks:
            poller.register(sock, READABLE)
        self._state_socks = socks

    def _poll_ms(self) -> int:
        """The loop's next wait: its timer period, or less when a held request's wait ends
        sooner (a held LEASE waits 25 ms: answered late, its consumer would idle longer)."""
        due = self.groups.next_deadline()
        if self.state is not None and self.state.pending():
            return limits.state_pending_poll_ms  # held replies: a copy's answer wakes it sooner
        if due is None:
            return limits.poll_interval_ms
        return max(0, min(limits.poll_interval_ms, int((due - time.monotonic()) * 1000) + 1))

    def _check_fence(self, now: float) -> None:
        """Fenced (its host's lease ran out), the monitor answers placements with a refusal and
        sends no notice; another monitor may already serve the queue. Back under a lease, the
        exchanges' silence while it was not listening is not held against them."""
        acting = self.fence.acting(now)
        self.fenced_out = self.fence.given_up(now)  # the loop ends: it exits EXIT_FENCED
        if self._acting and not acting:
            self.tasks.release(self._fenced())
            self.groups.release_waits(self._fenced())
        if acting and not self._acting:
            for view in self._reporters():
                view.last_seen = now
        self._acting = acting

    # --- exchange reports ----------------------------------------------------------------------
    def _pump_reports(self) -> None:
        for frames in drained(self.reports, limits.monitor_burst_messages):
            try:
                message = decode_exchange_message(bsonmsg.decode(frames))
            except ProtocolError as error:
                self.bad_frames += 1
                log.warning("%s: ignored a bad exchange report: %s", self.name, error)
                continue
            self._on_report(message)

    def _on_report(self, message: ExchangeMessage) -> None:
        if not self._acting:
            return  # read (the socket must not fill) and left: no relocation, no notice
        now = time.monotonic()
        if isinstance(message, ExchangePulse):
            front = message.front
            view = self.exchanges.get(front) or self.followers.get(front)
            self._on_pulse(view or self.keepers.get(front), message, now)
            return
        if isinstance(message, ExchangeSubscriptions):
            self._on_subscriptions(self.exchanges.get(message.identity.front), message)
            return
        identity = message.identity
        if identity.keeper:
            self._on_keeper(message, now)
            return
        if identity.follower:
            self._on_follower(message, now)
            return
        view = self.exchanges.get(identity.front)
        if view is not None and view.started != identity.started:
            self._forget(view, now, "restarted")  # its memory (and what it held) is gone
            view = None
        if view is None:
            if len(self.exchanges) >= limits.monitor_exchanges_max:
                # a bound of this monitor, not a fault of the report: not counted as a bad one
                log.warning(
                    "%s: exchange %s (%s) not tracked: already %d exchanges known",
                    self.name, identity.exchange_id, identity.front, limits.monitor_exchanges_max,
                )  # fmt: skip
                return
            view = self._register(identity, now)
        self._heard(view, now)
        view.period_s = identity.period_s
        if message.leaving or message.load is None:
            self._on_leaving(view)
            return
        self._update_load(view, message.load)
        if view.refusing:
            self._to_publishers(ExchangeLost(view.front, False, self.epoch, view.refusing))
        if view.logged:
            self.groups.observe(view.exchange_id, message.load.end, message.load.cuts)
        self.scaler.observe(view.exchange_id, message.load, now)
        self._relocate(view, now)

    def _reporters(self) -> list[ExchangeView]:
        """Everything that reports to this monitor: its exchanges, log followers and keepers."""
        return [*self.exchanges.values(), *self.followers.values(), *self.keepers.values()]

    def _copy_holders(self) -> list[ExchangeView]:
        """Those that take copies of live logs: the exchanges and the log followers."""
        return [*self.exchanges.values(), *self.followers.values()]

    def _on_follower(self, report: ExchangeReport, now: float) -> None:
        """A log follower's report: it takes the copies `_assign_replicas` gives it, and is a
        source and target of the gone logs' copies; it takes no publishers."""
        identity = report.identity
        view = self.followers.get(identity.front)
        if view is not None and view.started != identity.started:
            self._forget_follower(view, "restarted")  # what it held in memory is gone
            view = None
        changed = view is None
        if view is None:
            if report.leaving or report.load is None:
                return  # its last reports as it leaves: not to be filed again
            view = self._file_follower(identity, now)
            if view is None:
                return
        self._heard(view, now)
        view.period_s = identity.period_s
        load = report.load
        if report.leaving or load is None:
            self._forget_follower(view, "left")
            self._assign_replicas()
            return
        self._saw_state_copies(view, load.copies)
        copies = _message_log_copies(load.copies)
        # Which logs it holds, not their ends (they grow with every report under load): the
        # periodic assignment (monitor.list.period) takes the ends, as for an exchange
        changed = changed or copies.keys() != view.copies.keys() or load.refusing != view.refusing
        view.copies, view.refusing, view.cpu, view.rss = copies, load.refusing, load.cpu, load.rss
        if changed:
            self._assign_replicas()  # what it holds (or can hold) changed: plans may change

    def _file_follower(self, identity: ExchangeIdentity, now: float) -> ExchangeView | None:
        if len(self.followers) >= limits.monitor_exchanges_max:
            log.warning("%s: log follower %s not tracked: already %d followers known",
                        self.name, identity.exchange_id, len(self.followers))  # fmt: skip
            return None
        view = ExchangeView(
            exchange_id=identity.exchange_id, front=identity.front, back=identity.back,
            first_seen=now, last_seen=now, period_s=identity.period_s,
            started=identity.started, logged=True, host=identity.host, follower=True,
        )  # fmt: skip
        self.followers[view.front] = view
        log.info("%s: log follower %s joined (%s)", self.name, view.exchange_id, view.front)
        return view

    def _forget_follower(self, view: ExchangeView, why: str) -> None:
        del self.followers[view.front]
        self._close_control(view.front)
        if why == "left":
            log.info("%s: log follower %s left", self.name, view.exchange_id)
        else:
            log.warning("%s: log follower %s %s: forgotten", self.name, view.exchange_id, why)

    def _on_keeper(self, report: ExchangeReport, now: float) -> None:
        """A log keeper's report: the logs it holds are read from it and copied from it to
        live exchanges (`_plan_copies`) until they have replicationFactor copies."""
        identity = report.identity
        view = self.keepers.get(identity.front)
        if (view is None or view.started != identity.started) and report.leaving:
            return  # a retiring keeper's last reports: gone already, not to be filed again
        if view is None or view.started != identity.started:
            if view is None and len(self.keepers) >= limits.monitor_exchanges_max:
                log.warning("%s: log keeper %s not tracked: already %d keepers known",
                            self.name, identity.exchange_id, len(self.keepers))  # fmt: skip
                return
            view = ExchangeView(
                exchange_id=identity.exchange_id, front=identity.front, back=identity.back,
                first_seen=now, last_seen=now, period_s=identity.period_s,
                started=identity.started, logged=True, keeper=True,
            )  # fmt: skip
            view.host = identity.host
            self.keepers[view.front] = view
            log.warning("%s: log keeper of lost exchange %s joined (%s)", self.name,
                        view.exchange_id, view.front)  # fmt: skip
        self._heard(view, now)
        view.period_s = identity.period_s
        if report.leaving or report.load is None:
            del self.keepers[view.front]
            self._close_control(view.front)
            log.info("%s: log keeper %s left", self.name, view.exchange_id)
        else:
            self._saw_state_copies(view, report.load.copies)
            copies = _message_log_copies(report.load.copies)
            if copies == view.copies:
                return
            view.copies = copies
        self._assign_replicas()  # what it holds changed: the copy plans may change

    def _on_pulse(self, view: ExchangeView | None, pulse: ExchangePulse, now: float) -> None:
        """The process is up: it counts as a heartbeat while its loop still turns (a loop
        stalled past the bound, or a restarted process, is left to the reports)."""
        if view is None or view.started != pulse.started:
            return
        if pulse.loop_age_s * 1000 < limits.exchange_loop_stall_max_ms:
            self._heard(view, now)

    def _on_subscriptions(self, view: ExchangeView | None, notice: ExchangeSubscriptions) -> None:
        """Subscribers joined or left an exchange: a new one may now take publishers."""
        if view is None or view.started != notice.identity.started:
            return  # its first report registers it, and carries the count too
        view.subscriptions = notice.subscriptions
        self._mark_joined()

    def _mark_joined(self) -> None:
        waiting = [x.exchange_id for x in self.exchanges.values() if not x.joined]
        mark_joined(list(self.exchanges.values()))
        for view in self.exchanges.values():
            if view.joined and view.exchange_id in waiting:
                log.info("%s: subscribers have joined exchange %s (%d subscriptions)",
                         self.name, view.exchange_id, view.subscriptions)  # fmt: skip

    def _register(self, identity: ExchangeIdentity, now: float) -> ExchangeView:
        view = ExchangeView(
            exchange_id=identity.exchange_id,
            front=identity.front,
            back=identity.back,
            first_seen=now,
            last_seen=now,
            period_s=identity.period_s,
            started=identity.started,
            logged=identity.logged,
        )
        view.host = identity.host
        self.exchanges[view.front] = view
        log.info("%s: exchange %s joined (%s)", self.name, view.exchange_id, view.front)
        self._to_subscribers(NewExchange(_entry(view), self.epoch).encode())
        # At once rather than at the next list period: until then the new (or restarted)
        # exchange's log had no replica and every other log could not be copied to it, and
        # acks=all was confirmed on the leader alone (it now waits for this word, limits.py)
        self._assign_replicas()
        return view

    def _saw_state_copies(self, view: ExchangeView, copies: Sequence[CopyEnd]) -> None:
        """The state logs the exchange copies: where a recovering monitor reads (state.py)."""
        if self.state is not None and not self.state.ready:
            found = {c.leader_id: c.end for c in copies if is_state_log(c.leader_id)}
            self.state.saw_copies(view.exchange_id, _log_endpoint(view.front), found)

    def _update_load(self, view: ExchangeView, load: ReportedLoad) -> None:
        view.bytes_rate = load.bytes_rate
        view.msgs_rate = load.msgs_rate
        view.producers = load.producers
        view.cpu = load.cpu
        view.rss = load.rss
        view.subscriptions = load.subscriptions
        self._mark_joined()
        view.top = [(p.producer, p.bytes_rate) for p in load.top]
        view.copies = _message_log_copies(load.copies)
        self._saw_state_copies(view, load.copies)
        if load.refusing and not view.refusing:
            log.warning("%s: exchange %s refuses appends (%s); moving its publishers elsewhere",
                        self.name, view.exchange_id, load.refusing)  # fmt: skip
        elif view.refusing and not load.refusing:
            log.warning("%s: exchange %s takes appends again; placeable", self.name,
                        view.exchange_id)  # fmt: skip
        view.refusing = load.refusing
        view.in_sync, view.in_sync_min = load.in_sync, load.in_sync_min

    def _on_leaving(self, view: ExchangeView) -> None:
        if not view.leaving:
            log.info(
                "%s: exchange %s is leaving; moving its publishers", self.name, view.exchange_id
            )
            self.groups.moved_from(view.exchange_id, limits.publisher_leaving_drain_ms / 1000)
        view.leaving = True
        self._to_publishers(ExchangeLost(view.front, dead=False, epoch=self.epoch))

    def _relocate(self, source: ExchangeView, now: float) -> None:
        moves = plan_relocation(source, list(self.exchanges.values()), now, self.limits)
        for move in moves:
            self._move(move, f"{move.source.exchange_id} is overloaded")

    def _scale(self, now: float) -> None:
        followers = sum(1 for x in self.followers.values() if not x.leaving and not x.refusing)
        for move in self.scaler.tick(list(self.exchanges.values()), now, self.limits, followers):
            self._move(move, f"{move.target.exchange_id} was added to share the load")

    def _move(self, move: Move, why: str) -> None:
        self.relocations += 1
        log.info(
            "%s: moving publisher %s (%.0f B/s) from %s to %s: %s",
            self.name, move.producer, move.bytes_rate, move.source.exchange_id,
            move.target.exchange_id, why,
        )  # fmt: skip
        target, source = move.target, move.source
        self.groups.moved_from(source.exchange_id, limits.drain_timeout_ms / 1000)
        self._to_publishers(
            Relocate(move.producer, target.exchange_id, target.front, source.front, self.epoch)
        )

    def _dead_s(self, view: ExchangeView) -> float:
        return self.dead_after * view.period_s

    def _silent(self, now: float) -> list[ExchangeView]:
        """The dead: silent past their periods with their connection down, or past
        `limits.monitor_late_silence_max_ms` with it up (detector.py)."""
        return [v for v in self._reporters() if is_dead(*self._evidence(v, now))]

    def _evidence(self, view: ExchangeView, now: float) -> tuple[float, float, bool, float]:
        """What the detector weighs: its silence, its periods, its connection, its starvation."""
        lateness = self._lateness.get(view.front)
        starved_s = lateness.starved_s(now) if lateness is not None else 0.0
        return now - view.last_seen, self._dead_s(view), self._linked(view), starved_s

    def _linked(self, view: ExchangeView) -> bool:
        link = self._links.get(view.front)
        return link is not None and link.up()

    def _heard(self, view: ExchangeView, now: float) -> None:
        """A report, or a pulse that counts: the exchange is not silent."""
        self._lateness.setdefault(view.front, Lateness()).heard(now - view.last_seen, now)
        silent_since = self._late.pop(view.front, None)
        if silent_since is not None:
            log.warning("%s: exchange %s heard again after %.1f s of silence: late, not dead",
                        self.name, view.exchange_id, now - silent_since)  # fmt: skip
        view.last_seen = now

    def _note_late(self, now: float) -> None:
        """Log each exchange once when it passes its periods but is kept: its connection is up."""
        for view in self._reporters():
            silent_s, dead_s, linked, starved_s = self._evidence(view, now)
            if view.front in self._late or not is_late(silent_s, dead_s, linked, starved_s):
                continue
            self._late[view.front] = view.last_seen
            self.lates += 1
            log.warning("%s: exchange %s silent for %.1f s, its connection up: late, not dead "
                        "yet (its bound %.1f s; its longest silence lately %.1f s)",
                        self.name, view.exchange_id, silent_s,
                        late_max_s(dead_s, starved_s), starved_s)  # fmt: skip

    def _credit(self, missed_s: float) -> None:
        """Time this loop did not turn is no exchange's silence (detector.py)."""
        if not missed_s:
            return
        now = time.monotonic()
        log.info("%s: its loop turned %.2f s late: not counted as its exchanges' silence",
                 self.name, missed_s)  # fmt: skip
        for view in self._reporters():
            view.last_seen = credited(view.last_seen, missed_s, now)

    def _reap(self, now: float) -> None:
        self._note_late(now)
        if not self._silent(now):
            return
        # Reports that arrived while this loop served something else are not silence.
        self._pump_reports()
        dead = self._silent(now)
        for view in dead:
            if view.keeper:
                log.warning("%s: log keeper %s silent: forgotten", self.name, view.exchange_id)
                del self.keepers[view.front]
                self._close_control(view.front)
            elif view.follower:
                self._forget_follower(view, self._why_dead(view, now))
            else:
                self._forget(view, now, self._why_dead(view, now))
        if dead:
            self._publish_list()
            self._assign_replicas()  # the dead one's leaders get other replicas at once

    def _why_dead(self, view: ExchangeView, now: float) -> str:
        silent_s, dead_s, linked, starved_s = self._evidence(view, now)
        if not linked:
            return f"silent for {silent_s:.1f} s, its connection down"
        bound_s = late_max_s(dead_s, starved_s)
        return f"silent for {silent_s:.1f} s, its connection up (bound {bound_s:.1f} s)"

    def _forget(self, view: ExchangeView, now: float, why: str) -> None:
        """A dead exchange: its publishers fail over (the notice names the address they use)."""
        del self.exchanges[view.front]
        self.scaler.forget(view.exchange_id)
        self._close_control(view.front)
        if view.leaving:  # it said it was leaving: its silence is the expected end
            log.info("%s: exchange %s (%s) left", self.name, view.exchange_id, view.front)
        else:
            self.deaths += 1
            log.warning("%s: exchange %s (%s) %s: declared dead",
                        self.name, view.exchange_id, view.front, why)  # fmt: skip
            self.groups.moved_from(view.exchange_id, limits.publisher_dead_drain_ms / 1000)
        self.groups.gone(view.exchange_id)  # it reports no more: its barriers end where it did
        self._to_publishers(ExchangeLost(view.front, dead=True, epoch=self.epoch))

    # --- placement requests --------------------------------------------------------------------
    # Every request is decoded once, into its message class, by the table (`_placement_table`);
    # its handler returns a typed reply, and every reply (refusals, and the held requests'
    # replies sent later) is stamped with the monitor's epoch in one place, `_stamp`.
    def _placement_table(self) -> Table[Envelope | None]:
        """SUBSCRIBER_INIT, PUBLISHER_INIT/PANIC, the group (20–26), task (40–45) and topic
        (50–55) commands."""
        return Table(
            self.name,
            {
                MonitorCommand.SUBSCRIBER_INIT: route(SubscriberInit.decode, self._subscriber),
                MonitorCommand.PUBLISHER_INIT: route(PublisherInit.decode, self._place),
                MonitorCommand.PUBLISHER_PANIC: route(PublisherInit.decode, self._place),
                **self.groups.routes(),
                **self.tasks.routes(),
                **self.topics.routes(),
            },
            self._stamp,
            unknown=lambda command: f"unknown command {command}",  # its wording before the table
        )

    def _stamp(self, reply: Document) -> Document:
        return {**reply, EPOCH: self.epoch}

    def _authorize(
        self, principal: Principal | None, request: Mapping[str, Any]
    ) -> Document | None:
        """Publishers need publish on the queue, subscribers subscribe, work-queue consumers
        consume: refused by name. Only the command is read (before the table decodes it)."""
        command = request.get("CMD")
        why = refusal(principal, request_needs(request), self.queue)
        if why is None and command in TOPIC_COMMANDS and principal and not principal.superuser:
            # a topic command names any owner or subscriber: the gateway's alone, which checks
            # its callers (a grant of admin on http-0 set positions over ZeroMQ otherwise)
            why = f"principal {principal.name} lacks the cluster role of topic commands"
        if why is None:
            return None
        log.warning("%s: refused a placement request: %s", self.name, why)
        return self._stamp(Refused(Reason.FORBIDDEN, why).encode())

    def _answer(self, request: Mapping[str, Any], envelope: Envelope) -> Document | None:
        """The reply, or None when a handler holds the request (answered by `_reply_later`).
        Fenced, every request is refused, whatever it holds."""
        if not self._acting:
            return self._stamp(self._fenced().encode())
        reply = self.table(request, envelope)
        if reply is None or self.state is None or request.get("CMD") not in _WAIT_FOR_COPIES:
            return reply
        self.state.answer(envelope, reply)  # it may show state not copied yet: it waits
        return None

    def _reply_later(self, envelope: Envelope, reply: Encodable) -> None:
        """The answer to a request held before (groups.py, tasks.py), stamped as any."""
        send_routed(self.requests, envelope, self._stamp(reply.encode()))

    def _reply_task(self, envelope: Envelope, reply: Encodable) -> None:
        """A task's reply: with the state log, once every state write before it is copied."""
        if self.state is None:
            self._reply_later(envelope, reply)
        else:
            self.state.answer(envelope, self._stamp(reply.encode()))

    def _fenced(self) -> Refused:
        return Refused(Reason.FENCED, f"{self.name} is fenced: its host lost its lease")

    def _subscriber(self, _: SubscriberInit) -> ExchangeList:
        return self._listing()

    def _place(self, request: PublisherInit) -> Placed | Refused:
        avoid = request.lost if request.panic else ""
        chosen = choose_exchange(
            list(self.exchanges.values()), time.monotonic(), self.limits, avoid
        )
        if chosen is None:
            return Refused(Reason.NO_CAPACITY, f"queue {self.queue} has no live exchange")
        log.info("%s: publisher %s placed on %s", self.name, request.producer, chosen.exchange_id)
        return Placed(chosen.exchange_id, chosen.front, self.epoch)

    def _listing(self) -> ExchangeList:
        entries = tuple(_entry(x) for x in self.exchanges.values())
        return ExchangeList(entries, self._copy_list(), self.epoch)

    def _copy_list(self) -> tuple[DeadLog, ...]:
        """The logs of exchanges that are gone (dead or retired) but copied on a live one, each
        with the live exchanges that hold a copy, the longest copy first. Built from the
        exchanges' own reports (and the log keepers'), so it holds for as long as a copy is
        there to be read."""
        live = {x.exchange_id for x in self.exchanges.values()}
        holders: dict[str, list[ReplicaCopy]] = {}
        for view in self._reporters():
            for leader_id, end in view.copies.items():
                if leader_id not in live and not view.leaving:
                    entry = ReplicaCopy(view.exchange_id, _log_endpoint(view.front), end)
                    holders.setdefault(leader_id, []).append(entry)
        return tuple(
            DeadLog(leader_id, tuple(sorted(found, key=lambda r: -r.end)))
            for leader_id, found in sorted(holders.items())
        )

    def _publish_list(self) -> None:
        self._to_subscribers(self._listing().notice())

    # --- work queues (monitor/groups.py) -------------------------------------------------------
    def _serving(self) -> bool:
        """Answering consumers: acting (not fenced) and, on the state log, recovered."""
        return self._acting and (self.state is None or self.state.ready)

    def _live_consumers(self, group_name: str, within_s: float = 0.0) -> int | None:
        """Consumers of the group heard from within `within_s` (0: a lease; a request's
        request.delegator.check.ms) or holding a slot (a request's "worker available");
        None while the monitor cannot know: it started, was fenced or recovered its state too
        recently for every connected consumer to have asked again (a kill -9 of the monitor
        ended its accepted tasks `no_worker` while their worker reconnected)."""
        if time.monotonic() < self._deaf_until:
            return None
        group = self.groups.groups.get(group_name)
        if group is None:
            return 0
        return live_members(group, time.monotonic() - (within_s or self.groups.rules.lease_s))

    def _readable(self) -> Readable:
        """Where each log is read now: a live exchange's own, else the longest copy of it."""
        where = {
            x.exchange_id: (_log_endpoint(x.front), "", self.groups.ends.get(x.exchange_id, 0))
            for x in self.exchanges.values()
            if x.logged
        }
        for dead in self._copy_list():
            if dead.leader_id not in where and dead.replicas:
                best = dead.replicas[0]
                where[dead.leader_id] = (best.log, dead.leader_id, best.end)
        return where

    def _cut_dead_logs(self) -> None:
        """A dead exchange's log ends where its longest copy does: its last slot closes there."""
        for dead in self._copy_list():
            if dead.replicas:
                self.groups.observe(dead.leader_id, dead.replicas[0].end, (), final=True)

    # --- stat monitor --------------------------------------------------------------------------
    def _pump_stats(self) -> None:
        """Forward valid statistics to the KPI stream; count and drop the rest."""
        for frames in drained(self.stat_in, limits.monitor_burst_messages):
            if self._valid_stat(frames):
                self._send(self.kpi_out, frames)
            else:
                self.bad_frames += 1

    def _valid_stat(self, frames: list[bytes]) -> bool:
        if not 1 <= len(frames) <= limits.stat_frames_max:
            return False
        try:
            docs = [bsonmsg.decode([frame], limits.stat_frame_bytes_max) for frame in frames]
            message = decode_kpi_message(docs)
        except ProtocolError as error:
            log.warning("%s: dropped a bad statistics message: %s", self.name, error)
            return False
        if isinstance(message, PublisherKpi):
            self.publisher_kpis.note(message, time.monotonic())
        return True

    def _publish_queue_kpi(self) -> None:
        views = list(self.exchanges.values())
        kpi = QueueKpi(
            queue=f"{self.queue}:{self.port}",
            exchanges=len(views),
            producers=sum(x.producers for x in views),
            throughput=sum(x.bytes_rate for x in views),
            msgs=sum(x.msgs_rate for x in views),
            time=time.time(),
        )
        self._send(self.kpi_out, [bsonmsg.encode(kpi.encode())])

    # --- output --------------------------------------------------------------------------------
    def _to_publishers(self, notice: Relocate | ExchangeLost) -> None:
        if not self._acting:
            return
        self._send(self.to_publishers, [notice.topic, bsonmsg.encode(notice.encode())])

    def _to_subscribers(self, notice: Document) -> None:
        if not self._acting:
            return
        self._send(self.to_subscribers, [bsonmsg.encode(notice)])

    def _send(self, sock: Any, frames: list[bytes]) -> None:
        if not send_nowait(sock, frames):
            log.warning("%s: a slow peer missed a notice (it will get the next list)", self.name)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return MonitorStatus(
            queue=self.queue,
            relocations=self.relocations,
            bad_frames=self.bad_frames,
            scaling=self.scaler.status(now),
            exchanges=tuple(
                MonitoredExchange(
                    exchange_id=x.exchange_id,
                    front=x.front,
                    back=x.back,
                    msgs_rate=x.msgs_rate,
                    bytes_rate=x.bytes_rate,
                    producers=x.producers,
                    cpu=x.cpu,
                    rss=x.rss,
                    leaving=x.leaving,
                    subscriptions=x.subscriptions,
                    placeable=x.is_placeable(now, self.limits.warmup_s)
                    and not (x.refusing or x.follower),
                    replicas=x.replicas,
                    copies=tuple(CopyEnd(k, v) for k, v in sorted(x.copies.items())),
                    age_s=now - x.first_seen,
                    refusing=x.refusing,
                    in_sync=x.in_sync,
                    in_sync_min=x.in_sync_min,
                    follower=x.follower,
                )
                for x in self._copy_holders()
            ),
            copies=self._copy_list(),
            epoch=self.epoch,
            short_logs=self._short_logs(),
            state=self.state.status() if self.state is not None else None,
            publishers=self.publisher_kpis.rows(now),
            publishers_untracked=self.publisher_kpis.untracked,
        ).encode()

    def _short_logs(self) -> tuple[ShortLog, ...]:
        """The gone exchanges' logs with fewer than replicationFactor complete copies."""
        ends = {x.exchange_id: x.copies for x in self._copy_holders()}

        def progress(plan: CopyPlan) -> tuple[CopyProgress, ...]:
            return tuple(
                CopyProgress(t, ends.get(t, {}).get(plan.leader_id, -1)) for t in plan.targets
            )

        return tuple(
            ShortLog(
                plan.leader_id,
                plan.end,
                len(plan.complete),
                self.replication_factor,
                plan.source,
                progress(plan),
            )
            for plan in self.copy_plans.values()
        )

    # --- replication ---------------------------------------------------------------------------
    def _assign_replicas(self) -> None:
        """Tell each exchange which exchanges copy its log, and whose logs it copies: this
        assignment is the only authority a replica accepts a copy on (only what changed is
        logged)."""
        views = self._copy_holders()
        self.topics.forget_exchanges({x.exchange_id for x in self.exchanges.values()})
        plan = assign_replicas(views, self.replication_factor)
        by_id = {x.exchange_id: x for x in views}
        copied: dict[str, list[str]] = {x.exchange_id: [] for x in views}
        for leader_id, replica_ids in plan.items():
            for replica_id in replica_ids:
                copied[replica_id].append(leader_id)
        if self.state is not None:
            for candidate in self.state.choose_copies(self._state_candidates(views)):
                copied[candidate.exchange_id].append(self.state.leader_id)
        drop_state_before = self.state.older_dropped_below() if self.state is not None else 0
        keepers = list(self.keepers.values())
        sources: dict[str, list[CopySource]] = {x.exchange_id: [] for x in views + keepers}
        for copy in self._plan_copies().values():
            for target in copy.targets:
                copied[target].append(copy.leader_id)  # it takes the copy's writes
                endpoint = _log_endpoint(by_id[target].front)
                sources[copy.source].append(CopySource(copy.leader_id, target, endpoint))
        for leader_id, replica_ids in plan.items():
            leader = by_id[leader_id]
            if replica_ids != leader.replicas:
                log.info(
                    "%s: %s is copied to %s",
                    self.name,
                    leader_id,
                    ", ".join(replica_ids) or "nobody",
                )
                leader.replicas = replica_ids
            replicas = [ReplicaAssignment(r, _log_endpoint(by_id[r].front)) for r in replica_ids]
            assignment = Replicas(
                tuple(replicas),
                tuple(copied[leader_id]),
                tuple(sources[leader_id]),
                self.epoch,
                drop_state_before=drop_state_before,
                consumed_before=self.topics.consumed_before(leader_id),
            )
            self._tell_exchange(leader, assignment)
        for follower in self.followers.values():  # copies logs, and is copied by nobody
            sent = Replicas((), tuple(copied[follower.exchange_id]),
                            tuple(sources[follower.exchange_id]), self.epoch,
                            drop_state_before=drop_state_before)  # fmt: skip
            self._tell_exchange(follower, sent)
        for keeper in keepers:  # copies no log and is copied by nobody: it sends, at most
            retire = self._kept_elsewhere(keeper)
            sent = Replicas((), (), tuple(sources[keeper.exchange_id]), self.epoch, retire)
            self._tell_exchange(keeper, sent)
        if self.state is not None:
            self.state.link()

    def _state_candidates(self, views: list[ExchangeView]) -> list[CopyCandidate]:
        """The exchanges that may copy the state log: live, logged, not leaving."""
        return [_copy_candidate(x) for x in views if x.logged and not x.leaving]

    def _kept_elsewhere(self, keeper: ExchangeView) -> bool:
        """Whether every log the keeper holds is a live exchange's own or has
        replicationFactor copies on live exchanges ending where the keeper's does (or later):
        then the keeper retires (host/keepers.py)."""
        live = [x for x in self._copy_holders() if x.logged and not x.leaving]
        ids = {x.exchange_id for x in self.exchanges.values()}
        for leader_id, end in keeper.copies.items():
            held = sum(1 for x in live if x.copies.get(leader_id, -1) >= end)
            if leader_id not in ids and held < self.replication_factor:
                return False
        if not keeper.leaving:
            log.info("%s: log keeper %s retires: its %d log(s) have %d copies on live exchanges",
                     self.name, keeper.exchange_id, len(keeper.copies),
                     self.replication_factor)  # fmt: skip
        return True

    def _plan_copies(self) -> dict[str, CopyPlan]:
        """Plans to copy again, at once, each log whose exchange is gone (dead, lost with its
        host, or retired) until it has replicationFactor complete copies on live exchanges
        (docs/architecture.md §7, "Copying a gone log again"). No grace: until then a second
        failure can take the log's last copy; an exchange its host restarts in place within
        that time finds its log as it left it, and a copy begun meanwhile only costs disk."""
        live = {x.exchange_id for x in self.exchanges.values()}
        keepers = list(self.keepers.values())
        views = self._copy_holders()
        reported = {c for x in [*views, *keepers] if not x.leaving for c in x.copies}
        gone = reported - live
        plans = plan_copies(views, self.replication_factor, gone, self.copy_plans, keepers)
        self._log_copy_plans(plans, reported | live)
        self.copy_plans = plans
        return plans

    def _log_copy_plans(self, plans: dict[str, CopyPlan], known: set[str]) -> None:
        """What changed: a copy started, moved, or a log that has its copies again (or is
        live again: `known` holds the live exchanges and those a copy is reported of)."""
        for leader_id, plan in plans.items():
            before = self.copy_plans.get(leader_id)
            if before is None or (before.source, before.targets) != (plan.source, plan.targets):
                log.warning(
                    "%s: the log of gone exchange %s has %d of %d copies (%d bytes): %s",
                    self.name, leader_id, len(plan.complete), self.replication_factor, plan.end,
                    f"copying it from {plan.source} to {', '.join(plan.targets)}"
                    if plan.targets else "no exchange can take another copy",
                )  # fmt: skip
        for leader_id in self.copy_plans.keys() - plans.keys():
            if leader_id in known:
                log.info("%s: the log of gone exchange %s has %d copies again (or is back)",
                         self.name, leader_id, self.replication_factor)  # fmt: skip
            else:
                log.error("%s: no live exchange holds a copy of gone exchange %s's log any more",
                          self.name, leader_id)  # fmt: skip

    def _tell_exchange(self, view: ExchangeView, assignment: Replicas) -> None:
        if not self._acting:
            return
        sock = self._controls.get(view.front) or self._open_control(view.front)
        for _ in drained(sock, limits.control_hwm_messages):  # its high-water mark
            pass  # replies carry nothing we need: discard them
        if not send_nowait(sock, [b"", bsonmsg.encode(assignment.encode())]):
            log.debug("%s: exchange %s control queue full", self.name, view.exchange_id)

    def _open_control(self, front: str) -> Any:
        """The DEALER to an exchange's control port, watched: its connection is the evidence
        that a silent exchange is late, not dead (detector.py)."""
        sock = open_socket(self._context, Kind.DEALER, sndhwm=limits.monitor_control_hwm)
        self._links[front] = ConnectionWatch(sock)
        connect(sock, sibling(front, ExchangePort.FRONT, ExchangePort.CONTROL))
        self._controls[front] = sock
        return sock

    def _close_control(self, front: str) -> None:
        self._late.pop(front, None)
        self._lateness.pop(front, None)
        link = self._links.pop(front, None)
        if link is not None:
            link.close()
        control = self._controls.pop(front, None)
        if control is not None:
            control.close(0)

    def close(self) -> None:
        self.fence.close()
        self.scaler.close()
        self.groups.close()  # its last commit, on the session (or the state log) closed below
        if self.state is not None:
            self.state.close()
        self.zk.close()
        for front in list(self._controls):
            self._close_control(front)
        for sock in (
            self.reports, self.requests, self.to_publishers, self.to_subscribers,
            self.stat_in, self.kpi_out,
        ):  # fmt: skip
            sock.close(0)
        self.control.close()


def _entry(view: ExchangeView) -> ExchangeEntry:
    """The exchange as subscribers see it."""
    return ExchangeEntry(view.exchange_id, view.back, view.logged)


def _log_endpoint(front: str) -> str:
    """Where an exchange serves log reads and replication writes (F+3), from its front (F)."""
    return sibling(front, ExchangePort.FRONT, ExchangePort.LOG)


# A queue's request settings read without a change (TASK_CONFIG with no Settings): by a worker
# (request.worker.repeats, request.worker.wait.ms at its start), a requester or an admin.
_READ_SETTINGS = (Permission.CONSUME, Permission.PUBLISH, Permission.ADMIN)


def request_needs(request: Mapping[str, Any]) -> tuple[Permission, ...]:
    """The permissions of which the placement request needs one: its command's, but a read
    of the request settings (TASK_CONFIG without a change) is a worker's too."""
    command = request.get("CMD")
    if command == MonitorCommand.TASK_CONFIG and not request.get("Settings"):
        return _READ_SETTINGS  # a worker's request.worker.* at its start
    return _needs(command)


def _needs(command: Any) -> tuple[Permission, ...]:
    """The permissions of which a placement request needs one (docs/security.md §5)."""
    if command in (MonitorCommand.PUBLISHER_INIT, MonitorCommand.PUBLISHER_PANIC):
        return (Permission.PUBLISH,)
    if command == MonitorCommand.GROUP_INFO:
        return (Permission.CONSUME, Permission.SUBSCRIBE, Permission.ADMIN)
    if command in (MonitorCommand.GROUP_DELETE, MonitorCommand.GROUP_DEAD_LETTERS,
                   MonitorCommand.TASK_CONFIG):  # fmt: skip
        return (Permission.ADMIN,)
    if command in (MonitorCommand.TASK_START, MonitorCommand.TASK_FINISH):
        return (Permission.CONSUME,)  # a worker serving the queue's requests
    if command in TASK_COMMANDS:
        return (Permission.PUBLISH,)  # a requester: submit, poll for and take its result
    if command in TOPIC_COMMANDS:
        return (Permission.ADMIN,)  # and the cluster role (`_authorize`): the HTTP gateway's
    if command in GROUP_COMMANDS:
        return (Permission.CONSUME,)
    return (Permission.SUBSCRIBE,)


def _copy_candidate(view: ExchangeView) -> CopyCandidate:
    host = view.host or parse_endpoint(view.front).host  # its host's name, else its address
    return CopyCandidate(view.exchange_id, _log_endpoint(view.front), host, bool(view.refusing))


def _message_log_copies(copies: Sequence[CopyEnd]) -> dict[str, int]:
    """The copies an exchange reports, but a monitor's state log's (monitor/state.py): those
    are no gone exchange's messages, to copy again, list or cut into slots."""
    return {c.leader_id: c.end for c in copies if not is_state_log(c.leader_id)}
