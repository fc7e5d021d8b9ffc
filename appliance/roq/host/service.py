"""HostConfigManager — the `roq host` process: one per machine.

It registers the host in ZooKeeper (ephemeral: a dead host vanishes within the session timeout),
serves the GCM's requests on `hcm.port`, starts each queue's monitor and exchanges as child
processes of the same program, restarts crashed children with back-off, and stops them all when
it stops. The children it is restarting or gave up on are listed in its registration, for
`roq status`. One thread owns the request socket and the children (the main loop).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roq import limits
from roq.client import credentials
from roq.config import HostSettings
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import (
    ChildState,
    ExchangeRecord,
    HostRecord,
    QueueRecord,
    QueueState,
    Registry,
)
from roq.errors import NameTaken, PortInUse, RoqError
from roq.host import adoption, capacity, keepers, supervision
from roq.host.fencing import LeaseKeeper, lease_path, lease_seconds
from roq.host.metrics import HostMetrics
from roq.host.ports import PortAllocator
from roq.host.supervision import Child
from roq.log import replica_root, state_root
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import HostCommand, Reason
from roq.protocol.dispatch import Done, Encodable, Refused, Table, route
from roq.protocol.messages.control import MonitorMoved
from roq.protocol.messages.host import (
    CreateExchangeOnHost,
    CreateQueueOnHost,
    ExchangeCount,
    ExchangeInfo,
    ExchangeOnHost,
    HostPing,
    HostPong,
    InfoExchange,
    MonitorMovedOnHost,
    QueueOnHost,
    RemoveExchangeOnHost,
    StopMonitorOnHost,
    StopQueueOnHost,
)
from roq.protocol.ports import ExchangePort, MonitorPort, StatPort, endpoint_at
from roq.system import notify
from roq.system.netaddr import resolve_interface
from roq.system.spawn import roq_command
from roq.transport import READABLE, Kind, Poller, bind, new_context, open_socket, security
from roq.transport.rpc import answer

log = logging.getLogger(__name__)


@dataclass
class _Start:
    """A child spawned, not yet waited for: the ports it holds, and how to start it again on
    other ports if another program took these (`again`)."""

    child: Child
    ports: list[int]
    again: Callable[[], Child]
    done: bool = False  # waited for: running, or failed and its ports released


@dataclass
class _Adopting:
    """A queue being re-adopted (restart is resume): its record, and its processes spawned."""

    record: QueueRecord
    version: int
    monitor: _Start | None  # None: its monitor runs elsewhere (or here already)
    exchanges: list[tuple[ExchangeRecord, int, _Start]] = field(default_factory=list)

    def starts(self) -> list[_Start]:
        return ([self.monitor] if self.monitor else []) + [s for _, _, s in self.exchanges]


class HostConfigManager:
    def __init__(self, settings: HostSettings):
        self.settings = settings
        self.address = resolve_interface(settings.interface)
        self.name = settings.name or self.address
        self.capacity = capacity.of_host(settings.exchanges_max, settings.memory_log_bytes)
        self.max_exchanges = self.capacity.exchanges
        self.context = new_context()
        self._session_lost = threading.Event()  # set from kazoo's thread, acted on in run()
        self.session_losses = 0  # roq_zookeeper_session_losses_total
        self._next_register = 0.0
        self._reported: list[ChildState] = []  # the children's states in the host's record
        self._next_report = 0.0
        self._next_fenced_check = 0.0  # children that exited fenced: ZooKeeper asked then
        auth = security.zk_auth()
        self.zk = session.connect(
            settings.zk.servers,
            settings.zk.session_timeout_ms,
            on_state=self._on_session_state,
            auth=auth,
            tls=security.zk_tls(),
        )
        session.secure_namespace(self.zk, Paths(settings.zk.namespace), auth)
        # The children (no ZooKeeper of their own) read the principal table beside their lease.
        children_table = credentials.principals_file(str(lease_path(settings.log_root, self.name)))
        credentials.follow_principals(self.zk, settings.zk.namespace, children_table)
        self.registry = Registry(self.zk, Paths(settings.zk.namespace))
        self.lease = LeaseKeeper(
            self.zk,
            lease_path(settings.log_root, self.name),
            lease_seconds(settings.zk.session_timeout_ms),
            self.name,
        )
        self.registry.ensure_roots()
        self.ports = PortAllocator(
            self.registry,
            self.name,
            self.address,
            {
                "monitor": settings.monitor_base_port,
                "stat": settings.stat_base_port,
                "exchange": settings.exchange_base_port,
            },
            settings.ports_per_kind_max,
        )
        self.children: list[Child] = []
        self.sock: Any = None
        # /metrics, /healthz, /readyz on hcm.metrics.port (0: none), from bind() on
        self.metrics: HostMetrics | None = None
        # The GCM's requests (docs/protocol.md, "Host commands"): one typed entry each.
        self.table: Table[None] = Table(
            f"host {self.name}",
            {
                HostCommand.PING: route(HostPing.decode, lambda _: HostPong(self.name)),
                HostCommand.CREATE_QUEUE: route(CreateQueueOnHost.decode, self.create_queue),
                HostCommand.CREATE_EXCHANGE: route(
                    CreateExchangeOnHost.decode, self.create_exchange
                ),
                HostCommand.REMOVE_EXCHANGE: route(
                    RemoveExchangeOnHost.decode, self.remove_exchange
                ),
                HostCommand.STOP_QUEUE: route(StopQueueOnHost.decode, self.stop_queue),
                HostCommand.REMOVE_QUEUE: route(StopQueueOnHost.decode, self.stop_queue),
                HostCommand.INFO_EXCHANGE: route(InfoExchange.decode, self.info_exchange),
                HostCommand.MONITOR_MOVED: route(MonitorMovedOnHost.decode, self.monitor_moved),
                HostCommand.STOP_MONITOR: route(StopMonitorOnHost.decode, self.stop_monitor),
            },
        )

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.address}:{self.settings.hcm_port}"

    def bind(self) -> None:
        self.sock = open_socket(self.context, Kind.REP)
        # Only the cluster's own processes (the GCM) may ask a host to start or stop anything.
        bind(self.sock, self.address, self.settings.hcm_port, security.access_domain(cluster=True))
        if self.settings.metrics_port:  # before adopting: /healthz answers while it runs
            self.metrics = HostMetrics(self, self.settings.metrics_port)
            self.metrics.start()
        # Own the name first: until then the claims may belong to a live host of this name.
        self._claim_name()
        # This session's registration is checked: the children started next act at once.
        self.lease.confirm()
        self.lease.start()
        self._release_stale_claims()
        self.adopt()

    def _register(self) -> None:
        states = self._child_states()
        self.registry.register_host(self._record(states))
        self._reported = states

    def _record(self, children: list[ChildState]) -> HostRecord:
        return HostRecord(
            self.name, self.address, self.endpoint, self.max_exchanges, children=children
        )

    def _child_states(self) -> list[ChildState]:
        states = (supervision.report(child) for child in self.children)
        return [state for state in states if state is not None][: limits.host_children_reported_max]

    def _report_children(self, now: float) -> None:
        """Rewrite the host's record when a child starts or stops failing. Not while ZooKeeper
        is unreachable, and a failed write is retried at most every reregister interval, so
        that the loop keeps supervising."""
        states = self._child_states()
        if states == self._reported or now < self._next_report or not self.zk.connected:
            return
        try:
            written = self.registry.update_host(self._record(states))
        except RoqError as error:
            log.warning("host %s: cannot record its children's states: %s", self.name, error)
            written = False
        if written:
            self._reported = states
        else:
            self._next_report = now + limits.host_reregister_interval_s

    def _claim_name(self) -> None:
        """Register; if the name is held, take it from a dead process of this machine (its
        session restored with ZooKeeper's data, or not yet expired), else wait about a session
        timeout for the holder's session to expire. Still held: NameTaken (exit 75)."""
        wait_s = self.settings.zk.session_timeout_ms / 1000 * limits.host_name_wait_sessions
        deadline = time.monotonic() + wait_s + limits.host_name_wait_margin_s
        while True:
            try:
                self._register()
                return
            except NameTaken:
                if self._take_dead_registration():
                    continue
                if time.monotonic() >= deadline:
                    raise
            log.info("host %s: the name is still registered; waiting for it to expire", self.name)
            time.sleep(limits.host_name_wait_poll_s)

    def _take_dead_registration(self) -> bool:
        holder = self.registry.host(self.name)
        if holder is None:
            return True  # its session just expired
        # the pid proves something only on the machine that wrote it
        if holder.address != self.address or _alive(holder.pid):
            return False
        if not self.registry.remove_dead_registration(self.name, holder.pid):
            return False
        log.warning(
            "host %s: removed the registration left by pid %d, which is dead", self.name, holder.pid
        )
        return True

    def _on_session_state(self, state: str) -> None:
        """kazoo's thread: no ZooKeeper call here. An expired session took the host's ephemeral
        record with it (a stall past zk.session.timeout: overload, a paused VM); kazoo opens a
        new session, and the main loop registers the host again on it."""
        if state == "LOST":
            self.lease.suspend()  # the new session renews nothing before it is confirmed
            self.session_losses += 1
            self._session_lost.set()

    def _reregister(self, now: float) -> None:
        if now < self._next_register:
            return
        self._next_register = now + limits.host_reregister_interval_s
        if not session.responds(self.zk):
            return
        try:
            self._register()
        except RoqError as error:  # NameTaken: another live host holds the name; or no answer
            log.error("host %s: cannot register again after the session expired: %s",
                      self.name, error)  # fmt: skip
            return
        self._session_lost.clear()
        log.warning("host %s: registered again after its ZooKeeper session expired", self.name)
        self._stop_moved()
        self._follow_moved_monitors()
        self._keep_lost_logs()
        # What still runs here is still assigned here: its lease is renewed on this session.
        if self.lease.confirm():
            log.warning("host %s: the lease of its children is renewed", self.name)

    def _release_stale_claims(self) -> None:
        """Claims left by a previous run of this host: its children died with it. Called only
        once this process holds the host name, so no live host's claims are touched."""
        for port, owner in self.registry.port_claims(self.name).items():
            log.info("releasing port %d left by a previous run (%s)", port, owner)
            self.registry.release_port(self.name, port)

    @property
    def registration_lost(self) -> bool:
        """Its session expired and it has not registered again yet (read by /readyz)."""
        return self._session_lost.is_set()

    def run(self, stop: threading.Event, on_ready: Callable[[], object] | None = None) -> None:
        poller = Poller()
        poller.register(self.sock, READABLE)
        log.info("host %s serving on %s", self.name, self.endpoint)
        log.info("host %s runs at most exchange.max.perhost=%d exchanges, %s", self.name,
                 self.max_exchanges, self.capacity.why)  # fmt: skip
        if on_ready is not None:
            on_ready()
        while not stop.is_set():
            if self.metrics is not None:
                self.metrics.health.beat()
            notify.keepalive()  # systemd's watchdog (WatchdogSec=): only while this loop turns
            if poller.poll(limits.poll_interval_ms):
                answer(self.sock, self._dispatch, f"host {self.name}", log)
            now = time.monotonic()
            for child in self.children:
                supervision.watch(child, self.context, now)
            for child in [c for c in self.children if c.retired]:
                self._stop_child(child)  # releases its ports; its retired logs stay on disk
            if self._session_lost.is_set():
                self._reregister(now)
            else:
                self._restart_fenced(now)
                self._report_children(now)

    def _dispatch(self, request: Document) -> Document:
        try:
            reply = self.table(request, None)
        except RoqError as error:
            log.error("host %s: %s", self.name, error)
            return Refused(Reason.HOST_FAILED, str(error)).encode()
        assert reply is not None  # a REP socket's handlers hold nothing
        return reply

    # --- queries ------------------------------------------------------------------------------
    def _of(self, queue: str, role: str) -> list[Child]:
        return [c for c in self.children if c.queue == queue and c.role == role]

    def _exchange_count(self) -> int:
        return sum(1 for c in self.children if c.role == "exchange")

    def info_exchange(self, _: InfoExchange) -> Encodable:
        return ExchangeCount(self._exchange_count(), self.max_exchanges)

    # --- queue lifecycle ---------------------------------------------------------------------
    def create_queue(self, wanted: CreateQueueOnHost) -> Encodable:
        """Idempotent: a queue already running here is answered with its addresses. All or
        nothing: a monitor started by this call is stopped again if its exchange cannot start."""
        queue = wanted.queue
        monitors = self._of(queue, "monitor")
        if monitors and monitors[0].meta["epoch"] < wanted.epoch:
            if self._is_recorded(monitors[0]):
                return self._keep_recorded(monitors[0], wanted.epoch)
            monitors = [self._restart_monitor(monitors[0], wanted.epoch)]
        started = not monitors
        if started:
            if self._exchange_count() >= self.max_exchanges:
                return self._no_capacity(queue)
            prefer = adoption.monitor_ports(self.registry, queue, self.name)
            monitors = [self._start_monitor(queue, prefer, wanted.epoch)]
        monitor = monitors[0]
        if not self._of(queue, "exchange"):
            try:
                # `roq queue start`: the exchanges recorded here start again on their logs
                self._start_recorded_exchanges(queue, monitor)
                self._keep_lost_logs(queue)
                if not self._serving(queue) and not adoption.served_elsewhere(
                    self.registry, queue, self.name
                ):
                    if self._exchange_count() >= self.max_exchanges:
                        raise adoption.NoCapacity(queue)
                    self._start_exchange(
                        queue,
                        monitor.port,
                        monitor.meta["stat_port"],
                        txid="",
                        epoch=monitor.meta["epoch"],
                    )
            except adoption.NoCapacity:
                if started:
                    self._stop_child(monitor)
                return self._no_capacity(queue)
            except RoqError:
                if started:
                    self._stop_child(monitor)
                raise
        return self._queue_reply(queue, monitor)

    def _is_recorded(self, monitor: Child) -> bool:
        """Whether `monitor` is the one its RUNNING queue's record assigns: to this host, under
        its epoch (re-adopted at this host's start, or placed and recorded since)."""
        got = self.registry.queue(monitor.queue)
        if got is None:
            return False
        record = got[0]
        return (
            record.state == QueueState.RUNNING
            and record.host == self.name
            and record.epoch == monitor.meta["epoch"]
        )

    def _keep_recorded(self, monitor: Child, epoch: int) -> Refused:
        """A placement under a newer `epoch` of a queue whose recorded monitor runs here: it
        can only come from a GCM that took this host for gone just before it registered again
        (its record write, conditioned on this host's absence, then fails). Restarting the
        monitor for it would leave the queue none once the GCM withdraws the new one."""
        comment = (
            f"host {self.name} runs the recorded monitor of {monitor.queue} (epoch "
            f"{monitor.meta['epoch']}): it stays; not placed again under epoch {epoch}"
        )
        log.warning(comment)
        return Refused(Reason.BUSY, comment)

    def _restart_monitor(self, old: Child, epoch: int) -> Child:
        """A monitor of the queue runs here under an older epoch than the GCM now places it
        under (one left by a placement that was never recorded): it starts again under the new
        one, on its ports if it can; this host's exchanges of the queue follow it."""
        ports = (old.port, old.meta["stat_port"])
        self._stop_child(old)
        monitor = self._start_monitor(old.queue, ports, epoch)
        self._tell_moved(old.queue, self.address, monitor.port, monitor.meta["stat_port"], epoch)
        return monitor

    def _start_recorded_exchanges(self, queue: str, monitor: Child) -> None:
        for record, _ in adoption.recorded_exchanges(self.registry, queue, self.name):
            self._start_exchange(
                queue,
                monitor.port,
                monitor.meta["stat_port"],
                record.txid,
                recorded=(record.id, record.port),
                epoch=monitor.meta["epoch"],
                follower=record.follower,
            )

    # --- restart is resume -------------------------------------------------------------------
    def adopt(self) -> None:
        """Start again the monitors and exchanges ZooKeeper assigns to this host's name (same
        ids, so the same logs). Every process is spawned before any is waited for: each is a
        Python start (1 s, 3 s on a loaded machine), so a host resuming two queues of two
        exchanges serves them after one start, not six. An exchange reports to its monitor
        whichever comes up first (its report socket is the one the monitor subscribes to). A
        queue that cannot be re-adopted is logged and left: the host serves the others."""
        adopting = []
        for record, version in adoption.queues_to_adopt(self.registry, self.name):
            try:
                adopting.append(self._spawn_queue(record, version))
            except RoqError as error:
                self._not_adopted(record.name, error)
        for queue in adopting:
            try:
                self._adopted(queue)
            except RoqError as error:
                self._abandon(queue)
                self._not_adopted(queue.record.name, error)
        self._keep_lost_logs()

    def _not_adopted(self, queue: str, error: RoqError) -> None:
        log.error("host %s: could not re-adopt queue %s: %s", self.name, queue, error)

    def _spawn_queue(self, record: QueueRecord, version: int) -> _Adopting:
        """The queue's monitor, if it ran here (re-adopted, not re-placed: the same assignment,
        so the recorded epoch, on its recorded ports if free), and its exchanges recorded here,
        all spawned; an exchange is pointed at where its monitor is recorded to serve."""
        queue, epoch = record.name, record.epoch
        address = adoption.address_of(record.monitor)
        adopting = _Adopting(record, version, None)
        try:
            if record.host == self.name and not self._of(queue, "monitor"):
                ports = (record.monitor_port, record.stat_port)
                adopting.monitor = self._spawned(self._monitor_start(queue, ports, epoch))
                address = self.address
            for exchange, exchange_version in adoption.recorded_exchanges(
                self.registry, queue, self.name
            ):
                start = self._exchange_start(
                    queue, record.monitor_port, record.stat_port, exchange.txid, address,
                    recorded=(exchange.id, exchange.port), epoch=epoch,
                    follower=exchange.follower,
                )  # fmt: skip
                adopting.exchanges.append((exchange, exchange_version, self._spawned(start)))
        except RoqError:
            self._abandon(adopting)
            raise
        return adopting

    def _adopted(self, adopting: _Adopting) -> None:
        """Wait for the queue's spawned processes; record where they serve if it changed (a
        port another program took); a monitor on other ports tells the exchanges."""
        record = adopting.record
        monitor = self._ready(adopting.monitor) if adopting.monitor else None
        if monitor is not None and not self._record_monitor(record, adopting.version, monitor):
            log.warning("queue %s changed while it was re-adopted; leaving it", record.name)
            self._abandon(adopting)
            self._stop_queue_children(record.name)
            return
        for exchange, version, start in adopting.exchanges:
            self._record_exchange(exchange, version, self._ready(start))
        wanted = adopting.monitor.child if adopting.monitor else None
        if monitor is not None and wanted is not None and monitor is not wanted:
            self._tell_moved(record.name, self.address, monitor.port, monitor.meta["stat_port"],
                             record.epoch)  # fmt: skip
        log.info("host %s: re-adopted queue %s", self.name, record.name)

    def _record_monitor(self, record: QueueRecord, version: int, monitor: Child) -> bool:
        """The queue's record names where its monitor now serves; False if the record changed
        meanwhile (the GCM re-placed the queue while this host came back)."""
        port, stat = monitor.port, monitor.meta["stat_port"]
        endpoint = f"tcp://{self.address}:{port}"
        if endpoint == record.monitor and stat == record.stat_port:
            return True
        record.monitor, record.monitor_port, record.stat_port = endpoint, port, stat
        record.stat = f"tcp://{self.address}:{stat + 1}"
        return self.registry.move_queue(record, version)

    def _record_exchange(self, exchange: ExchangeRecord, version: int, child: Child) -> None:
        info = self._exchange_doc(child)
        if child.port != exchange.port or info.front != exchange.front:
            exchange.port, exchange.front, exchange.back = info.port, info.front, info.back
            self.registry.move_exchange(exchange, version)

    def _abandon(self, adopting: _Adopting) -> None:
        """Stop the queue's processes spawned and not yet waited for, and free their ports."""
        for start in adopting.starts():
            if not start.done:
                start.done = True
                supervision.stop(start.child, self.context)
                self._release(start.ports)

    def _keep_lost_logs(self, only: str = "") -> None:
        """A keeper for each lost exchange of a RUNNING queue whose log (or copies) this host
        holds and that has none running yet (host/keepers.py): it serves and re-copies them.
        A keeper that cannot start is logged and left: the host serves the rest."""
        root = self.settings.log_root
        if not self.settings.use_log:
            return
        for record in keepers.lost_logs(self.registry, self.name, root):
            queue = record.queue
            running = {c.id for c in self._of(queue, "keeper")}
            if (only and queue != only) or record.id in running:
                continue
            got = self.registry.queue(queue)
            if got is None:
                continue
            try:
                self._start_exchange(
                    queue, got[0].monitor_port, got[0].stat_port, record.txid,
                    adoption.address_of(got[0].monitor), recorded=(record.id, record.port),
                    epoch=got[0].epoch, keeper=True,
                )  # fmt: skip
            except RoqError as error:
                log.error("host %s: no keeper for the log of lost exchange %s/%s: %s",
                          self.name, queue, record.id, error)  # fmt: skip
                continue
            log.warning("host %s: keeps the log of lost exchange %s/%s for reads and copies",
                        self.name, queue, record.id)  # fmt: skip

    def _stop_moved(self) -> None:
        """Stop the children whose assignment ZooKeeper no longer gives this host: the GCM
        re-placed them (or stopped or deleted their queue) while this host was gone (its session
        expired). Their logs stay."""
        for child in adoption.moved_children(self.registry, self.name, self.children):
            log.warning("host %s: %s was re-placed while this host was gone; stopping it",
                        self.name, child.name)  # fmt: skip
            self._stop_child(child)

    def _restart_fenced(self, now: float) -> None:
        """The children that exited fenced (EXIT_FENCED): once the lease runs again (this
        session is confirmed and answers), each that ZooKeeper still assigns here starts again
        on its ports; the others go. ZooKeeper is asked at most every reregister interval."""
        waiting = [c for c in self.children if c.fenced_out]
        if not waiting or now < self._next_fenced_check or not self.lease.valid(now):
            return
        self._next_fenced_check = now + limits.host_reregister_interval_s
        try:
            moved = {id(c) for c in adoption.moved_children(self.registry, self.name, waiting)}
        except RoqError as error:
            log.warning("host %s: cannot check its fenced children's assignments: %s",
                        self.name, error)  # fmt: skip
            return
        for child in waiting:
            if id(child) in moved:
                log.warning("host %s: %s exited fenced and was re-placed meanwhile; it stays "
                            "stopped", self.name, child.name)  # fmt: skip
                self._stop_child(child)
                continue
            log.warning("host %s: %s exited fenced and is still assigned here; starting it "
                        "again", self.name, child.name)  # fmt: skip
            child.fenced_out, child.restart_at = False, now  # `supervision.watch` starts it

    def stop_monitor(self, unwanted: StopMonitorOnHost) -> Encodable:
        """1014: a monitor started here for a re-placement the GCM called off (the lost host
        came back first) stops, so no monitor of the queue runs unrecorded; the exchanges here
        go on reporting to the recorded one. Only the monitor of exactly that epoch: a later
        placement's is left alone, and so is the one the queue's record names (a request asked
        again, gcm/repair.py, after a later placement chose this very monitor)."""
        for child in self._of(unwanted.queue, "monitor"):
            if child.meta["epoch"] == unwanted.epoch and self._is_recorded(child):
                return Done(f"monitor of {unwanted.queue} (epoch {unwanted.epoch}) is recorded")
            if child.meta["epoch"] == unwanted.epoch:
                self._stop_child(child)
                return Done(f"monitor of {unwanted.queue} (epoch {unwanted.epoch}) stopped")
        return Done(f"no monitor of {unwanted.queue} under epoch {unwanted.epoch} here")

    def _follow_moved_monitors(self) -> None:
        """A monitor moved while this host was gone (the GCM moves it as soon as the host's
        registration goes, and told only the hosts registered then): the exchanges and keepers
        that still run here of its queue report to the recorded one from now on."""
        for queue in sorted({c.queue for c in self.children if c.role != "monitor"}):
            got = self.registry.queue(queue)
            if got is None or got[0].host == self.name:
                continue
            record = got[0]
            address = adoption.address_of(record.monitor)
            wanted = endpoint_at(address, record.monitor_port, MonitorPort.REPORTS)
            if any(_option(c.argv, "--monitor") != wanted for c in self._reporting(queue)):
                log.warning("host %s: queue %s's monitor moved to %s while this host was gone",
                            self.name, queue, wanted)  # fmt: skip
                self._tell_moved(
                    queue, address, record.monitor_port, record.stat_port, record.epoch
                )

    def _reporting(self, queue: str) -> list[Child]:
        """The children that report to the queue's monitor: its exchanges (log followers
        among them) and log keepers."""
        return self._of(queue, "exchange") + self._of(queue, "keeper")

    def _serving(self, queue: str) -> list[Child]:
        """The queue's exchanges here that take publishers: not its log followers."""
        return [c for c in self._of(queue, "exchange") if not c.meta.get("follower")]

    def monitor_moved(self, moved: MonitorMovedOnHost) -> Encodable:
        """1013: the queue's monitor was re-placed; this host's exchanges of it follow (1031),
        and start with the new address when they are restarted."""
        told = self._tell_moved(
            moved.queue, moved.monitor_address, moved.monitor_port, moved.stat_port, moved.epoch
        )
        return Done(f"{told} exchange(s) of {moved.queue} told")

    def _tell_moved(self, queue: str, address: str, port: int, stat_port: int, epoch: int) -> int:
        """This host's exchanges of `queue` report to the monitor at `address`, under `epoch`,
        now (1031) and when restarted (their command line); how many were told."""
        monitor = endpoint_at(address, port, MonitorPort.REPORTS)
        stat = endpoint_at(address, stat_port, StatPort.IN)
        notice = MonitorMoved(monitor, stat, epoch).encode()
        told = 0
        for child in self._reporting(queue):
            argv = _with_option(child.argv, "--monitor", monitor)
            argv = _with_option(argv, "--stat", stat)
            child.argv = _with_option(argv, "--epoch", str(epoch))
            told += supervision.tell(child, self.context, notice)
        return told

    def _no_capacity(self, queue: str) -> Refused:
        # the GCM prefixes "host <name>: " and the CLI prints it: say which setting to raise
        comment = (
            f"{self._exchange_count()} exchanges run here, its limit (exchange.max.perhost="
            f"{self.max_exchanges} {self.capacity.why}); cannot place queue {queue}: raise "
            "exchange.max.perhost in this host's HCM.properties (or roq up -D "
            "exchange.max.perhost=N), add a host, or delete a queue"
        )
        log.warning(comment)
        return Refused(Reason.NO_CAPACITY, comment)

    def _queue_reply(self, queue: str, monitor: Child) -> QueueOnHost:
        stat_port = monitor.meta["stat_port"]
        return QueueOnHost(
            monitor_host=endpoint_at(self.address, monitor.port, MonitorPort.REPORTS),
            stat_monitor_host=endpoint_at(self.address, stat_port, StatPort.KPI),
            monitor_port=monitor.port,
            stat_port=stat_port,
            exchanges=tuple(self._exchange_doc(c) for c in self._of(queue, "exchange")),
            epoch=monitor.meta["epoch"],
        )

    def _exchange_doc(self, child: Child) -> ExchangeInfo:
        return ExchangeInfo(
            exchange_id=child.id,
            port=child.port,
            txid=child.txid,
            front=endpoint_at(self.address, child.port, ExchangePort.FRONT),
            back=endpoint_at(self.address, child.port, ExchangePort.BACK),
            follower=bool(child.meta.get("follower")),
        )

    def _start_monitor(self, queue: str, prefer: tuple[int, int], epoch: int) -> Child:
        """On `prefer` (its recorded base and stat ports) if they are free, else on new ones;
        acting under the assignment `epoch` (restarts keep it: same command line)."""
        for attempt in range(limits.child_bind_attempts):
            start = self._monitor_start(queue, prefer if attempt == 0 else (0, 0), epoch)
            if self._await(self._spawned(start)):
                return start.child
        raise PortInUse(f"could not start the monitor of {queue}: ports kept being taken")

    def _monitor_start(self, queue: str, want: tuple[int, int], epoch: int) -> _Start:
        port = self.ports.allocate("monitor", {"queue": queue}, want[0])
        stat = self.ports.allocate("stat", {"queue": queue}, want[1])
        argv = roq_command(
            "monitor", queue, "--bind", self.address, "--port", str(port),
            "--stat-port", str(stat), "--lease", str(self.lease.path),
            "--epoch", str(epoch), *self._overrides(),
        )  # fmt: skip
        child = Child(
            name=f"monitor {queue}",
            role="monitor",
            queue=queue,
            port=port,
            control=endpoint_at(self.address, port, MonitorPort.CONTROL),
            argv=argv,
            id=f"monitor-{queue}",
            meta={"stat_port": stat, "epoch": epoch},
        )
        return _Start(child, [port, stat], lambda: self._start_monitor(queue, (0, 0), epoch))

    def _start_exchange(
        self,
        queue: str,
        monitor_port: int,
        stat_port: int,
        txid: str,
        monitor_address: str | None = None,
        recorded: tuple[str, int] = ("", 0),
        epoch: int = 0,
        keeper: bool = False,
        follower: bool = False,
    ) -> Child:
        """A new exchange, or with `recorded` (its id and port) one started again on its log;
        `epoch`: its monitor's, the oldest it takes a monitor's word from; `keeper`: the log
        keeper of the recorded exchange, which was lost (host/keepers.py); `follower`: a log
        follower (log.followers), which holds copies and takes no publishers."""
        for attempt in range(limits.child_bind_attempts):
            start = self._exchange_start(
                queue, monitor_port, stat_port, txid, monitor_address,
                (recorded[0], recorded[1] if attempt == 0 else 0), epoch, keeper, follower,
            )  # fmt: skip
            if self._await(self._spawned(start)):
                return start.child
        raise PortInUse(f"could not start an exchange of {queue}: ports kept being taken")

    def _exchange_start(
        self,
        queue: str,
        monitor_port: int,
        stat_port: int,
        txid: str,
        monitor_address: str | None = None,
        recorded: tuple[str, int] = ("", 0),
        epoch: int = 0,
        keeper: bool = False,
        follower: bool = False,
    ) -> _Start:
        monitor_address = monitor_address or self.address
        port = self.ports.allocate("exchange", {"queue": queue, "txid": txid}, recorded[1])
        exchange_id = recorded[0] or f"{self.name.replace(':', '_')}-{port}-{uuid.uuid4().hex[:6]}"
        argv = roq_command(
            "exchange", queue, "--bind", self.address, "--port", str(port),
            "--monitor", endpoint_at(monitor_address, monitor_port, MonitorPort.REPORTS),
            "--stat", endpoint_at(monitor_address, stat_port, StatPort.IN),
            "--id", exchange_id, "--lease", str(self.lease.path), "--epoch", str(epoch),
            *(["--keeper"] if keeper else []), *(["--follower"] if follower else []),
            *self._overrides(),
        )  # fmt: skip
        what = "log keeper" if keeper else "log follower" if follower else "exchange"
        child = Child(
            name=f"{what} {queue}/{exchange_id}",
            role="keeper" if keeper else "exchange",
            queue=queue,
            port=port,
            control=endpoint_at(self.address, port, ExchangePort.CONTROL),
            id=exchange_id,
            txid=txid,
            argv=argv,
            meta={"follower": True} if follower else {},
        )
        again = (queue, monitor_port, stat_port, txid, monitor_address, (exchange_id, 0), epoch,
                 keeper, follower)  # fmt: skip
        return _Start(child, [port], lambda: self._start_exchange(*again))

    def _spawned(self, start: _Start) -> _Start:
        supervision.spawn(start.child)
        return start

    def _await(self, start: _Start) -> bool:
        """Wait until a spawned child answers; False if it lost its ports to another program
        (the caller tries other ports)."""
        start.done = True
        try:
            supervision.wait_ready(start.child, self.context)
        except PortInUse as error:
            log.warning("%s", error)
            self._release(start.ports)
            self.ports.in_use.update(start.ports)  # keep skipping them until freed and reused
            return False
        except RoqError:
            self._release(start.ports)
            raise
        self.children.append(start.child)
        return True

    def _ready(self, start: _Start) -> Child:
        """A spawned child, once it answers; started again on other ports if it lost these."""
        return start.child if self._await(start) else start.again()

    def _release(self, ports: list[int]) -> None:
        for port in ports:
            self.ports.release(port)

    def _overrides(self) -> list[str]:
        """The host's non-default settings, handed to its children on their command line."""
        return [
            arg
            for name, value in self.settings.child_overrides
            for arg in ("-D", f"{name}={value}")
        ]

    def create_exchange(self, wanted: CreateExchangeOnHost) -> Encodable:
        queue, txid = wanted.queue, wanted.txid
        for child in self._of(queue, "exchange"):
            if (child.id == wanted.exchange_id) if wanted.exchange_id else (child.txid == txid):
                return ExchangeOnHost(self._exchange_doc(child), "exists")
        if self._exchange_count() >= self.max_exchanges and not wanted.exchange_id:
            return self._no_capacity(queue)  # a recorded exchange had its slot already
        recorded, follower = ("", 0), wanted.follower
        if wanted.exchange_id:
            found = self.registry.exchange(queue, wanted.exchange_id)
            recorded = (wanted.exchange_id, 0 if found is None else found[0].port)
            follower = follower or (found is not None and found[0].follower)
        child = self._start_exchange(
            queue,
            wanted.monitor_port,
            wanted.stat_port,
            txid,
            monitor_address=wanted.monitor_address,
            recorded=recorded,
            epoch=wanted.epoch,
            follower=follower,
        )
        return ExchangeOnHost(self._exchange_doc(child), "created")

    def remove_exchange(self, unwanted: RemoveExchangeOnHost) -> Encodable:
        queue, exchange_id = unwanted.queue, unwanted.exchange_id
        for child in self._of(queue, "exchange"):
            if child.id == exchange_id:
                self._stop_child(child)
                return Done(f"exchange {exchange_id} stopped")
        return Done(f"exchange {exchange_id} was not running here")

    def stop_queue(self, stop: StopQueueOnHost) -> Encodable:
        """1012, or 1008 (`delete_logs`): the queue's processes stop here."""
        queue = stop.queue
        self._stop_queue_children(queue)
        if stop.delete_logs:
            self._delete_queue_files(queue)
        return Done(f"queue {queue} stopped on {self.name}")

    def _stop_queue_children(self, queue: str) -> None:
        # Exchanges first, so they can still tell their monitor they are leaving.
        for child in self._of(queue, "exchange") + self._of(queue, "keeper"):
            self._stop_child(child)
        for child in self._of(queue, "monitor"):
            self._stop_child(child)

    def _delete_queue_files(self, queue: str) -> None:
        """The queue's own logs, the copies this host's exchanges kept of other exchanges' logs
        and of the monitor's state log, and that state log. Called after the queue's children
        here stopped, so nothing writes to them."""
        root = Path(self.settings.log_root)
        for directory in (root / queue, replica_root(root, queue), state_root(root, queue)):
            if directory.exists():
                shutil.rmtree(directory, ignore_errors=True)
                log.info("queue %s: deleted %s", queue, directory)

    def _stop_child(self, child: Child, release: bool = True) -> None:
        supervision.stop(child, self.context)
        self.children.remove(child)
        if release:
            self.ports.release(child.port)
            if "stat_port" in child.meta:
                self.ports.release(child.meta["stat_port"])
        log.info("%s stopped", child.name)

    def close(self) -> None:
        """Stop every child (exchanges first), unregister, close. Bounded by the children's
        shutdown bounds. Without ZooKeeper the children still stop; the port claims stay for the
        next start to reclaim, and the host's ephemeral record goes with the session."""
        if self.metrics is not None:
            self.metrics.stop()
        reachable = session.responds(self.zk)
        if not reachable:
            log.warning("host %s: ZooKeeper unreachable; stopping without unregistering", self.name)
        # all at once (exchanges asked first): the slowest child bounds the stop, not the sum
        children = sorted(self.children, key=lambda c: c.role != "exchange")
        supervision.stop_all(children, self.context)
        for child in children:
            try:
                self._stop_child(child, release=reachable)  # its process is gone: bookkeeping
            except RoqError as error:
                log.error("stopping %s: %s", child.name, error)
                # ZooKeeper may have gone since the probe: ask again rather than let every
                # remaining child's clean-up wait for its full request bound.
                reachable = session.responds(self.zk)
        if reachable:
            try:
                self.registry.unregister_host(self.name)
            except RoqError as error:
                log.warning("host %s: %s", self.name, error)
        self.lease.stop()  # after the children: a leaving exchange still drains its publishers
        if self.sock is not None:
            self.sock.close(0)
        session.close(self.zk)
        self.context.term()


def _option(argv: list[str], option: str) -> str:
    """The value after `option` in `argv` ("" if it is not there)."""
    return argv[argv.index(option) + 1] if option in argv[:-1] else ""


def _with_option(argv: list[str], option: str, value: str) -> list[str]:
    """`argv` with the value after `option` replaced."""
    at = argv.index(option) + 1
    return [*argv[:at], value, *argv[at + 1 :]]


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process of this machine other than this one (a pid reused after
    a reboot may be this very process)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
