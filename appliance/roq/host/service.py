"""HostConfigManager — the `roq host` process: one per machine.

It registers the host in ZooKeeper (ephemeral: a dead host vanishes within the session timeout),
serves the GCM's requests on `hcm.port`, starts each queue's monitor and exchanges as child
processes of the same program, restarts crashed children with back-off, and stops them all when
it stops. One thread owns the request socket and the children (the main loop).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roq import limits
from roq.config import HostSettings
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import HostRecord, Registry
from roq.errors import DecodeError, PortInUse, RoqError
from roq.host import supervision
from roq.host.ports import PortAllocator
from roq.host.supervision import Child
from roq.log import replica_root
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import HostCommand, Reason
from roq.protocol.messages.host import (
    CreateExchangeOnHost,
    CreateQueueOnHost,
    ExchangeCount,
    ExchangeInfo,
    ExchangeOnHost,
    HostPong,
    QueueOnHost,
    RemoveExchangeOnHost,
    StopQueueOnHost,
)
from roq.protocol.ports import ExchangePort, MonitorPort, StatPort, endpoint_at
from roq.system.netaddr import resolve_interface
from roq.system.spawn import roq_command
from roq.transport import READABLE, Kind, Poller, bind, new_context, open_socket
from roq.transport.rpc import answer

log = logging.getLogger(__name__)


class HostConfigManager:
    def __init__(self, settings: HostSettings):
        self.settings = settings
        self.address = resolve_interface(settings.interface)
        self.name = settings.name or self.address
        self.max_exchanges = settings.exchanges_max
        self.context = new_context()
        self._session_lost = threading.Event()  # set from kazoo's thread, acted on in run()
        self._next_register = 0.0
        self.zk = session.connect(
            settings.zk.servers,
            settings.zk.session_timeout_ms,
            on_state=self._on_session_state,
        )
        self.registry = Registry(self.zk, Paths(settings.zk.namespace))
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
        self._handlers: dict[int, Callable[[Document], Document]] = {
            HostCommand.PING: lambda _: HostPong(self.name).encode(),
            HostCommand.CREATE_QUEUE: self.create_queue,
            HostCommand.CREATE_EXCHANGE: self.create_exchange,
            HostCommand.REMOVE_EXCHANGE: self.remove_exchange,
            HostCommand.STOP_QUEUE: self.stop_queue,
            HostCommand.REMOVE_QUEUE: self.stop_queue,
            HostCommand.INFO_EXCHANGE: self.info_exchange,
        }

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.address}:{self.settings.hcm_port}"

    def bind(self) -> None:
        self.sock = open_socket(self.context, Kind.REP)
        bind(self.sock, self.address, self.settings.hcm_port)
        # Own the name first: until then the claims may belong to a live host of this name.
        self._register()
        self._release_stale_claims()

    def _register(self) -> None:
        self.registry.register_host(
            HostRecord(self.name, self.address, self.endpoint, self.max_exchanges)
        )

    def _on_session_state(self, state: str) -> None:
        """kazoo's thread: no ZooKeeper call here. An expired session took the host's ephemeral
        record with it (a stall past zk.session.timeout: overload, a paused VM); kazoo opens a
        new session, and the main loop registers the host again on it."""
        if state == "LOST":
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

    def _release_stale_claims(self) -> None:
        """Claims left by a previous run of this host: its children died with it. Called only
        once this process holds the host name, so no live host's claims are touched."""
        for port, owner in self.registry.port_claims(self.name).items():
            log.info("releasing port %d left by a previous run (%s)", port, owner)
            self.registry.release_port(self.name, port)

    def run(self, stop: threading.Event, on_ready: Callable[[], object] | None = None) -> None:
        poller = Poller()
        poller.register(self.sock, READABLE)
        log.info("host %s serving on %s", self.name, self.endpoint)
        if on_ready is not None:
            on_ready()
        while not stop.is_set():
            if poller.poll(limits.poll_interval_ms):
                answer(self.sock, self._dispatch, f"host {self.name}", log)
            now = time.monotonic()
            for child in self.children:
                supervision.watch(child, self.context, now)
            if self._session_lost.is_set():
                self._reregister(now)

    def _dispatch(self, request: Document) -> Document:
        handler = self._handlers.get(request["CMD"])
        if handler is None:
            return bsonmsg.fail(Reason.UNKNOWN_COMMAND, f"unknown command {request['CMD']}")
        try:
            return handler(request)
        except DecodeError as error:
            return bsonmsg.fail(Reason.BAD_REQUEST, str(error))
        except RoqError as error:
            log.error("host %s: %s", self.name, error)
            return bsonmsg.fail(Reason.HOST_FAILED, str(error))

    # --- queries ------------------------------------------------------------------------------
    def _of(self, queue: str, role: str) -> list[Child]:
        return [c for c in self.children if c.queue == queue and c.role == role]

    def _exchange_count(self) -> int:
        return sum(1 for c in self.children if c.role == "exchange")

    def info_exchange(self, request: Document) -> Document:
        return ExchangeCount(self._exchange_count(), self.max_exchanges).encode()

    # --- queue lifecycle ---------------------------------------------------------------------
    def create_queue(self, request: Document) -> Document:
        """Idempotent: a queue already running here is answered with its addresses. All or
        nothing: a monitor started by this call is stopped again if its exchange cannot start."""
        queue = CreateQueueOnHost.decode(request).queue
        monitors = self._of(queue, "monitor")
        started = not monitors
        if started:
            if self._exchange_count() >= self.max_exchanges:
                return self._no_capacity(queue)
            monitors = [self._start_monitor(queue)]
        monitor = monitors[0]
        if not self._of(queue, "exchange"):
            if self._exchange_count() >= self.max_exchanges:
                return self._no_capacity(queue)
            try:
                self._start_exchange(queue, monitor.port, monitor.meta["stat_port"], txid="")
            except RoqError:
                if started:
                    self._stop_child(monitor)
                raise
        return self._queue_reply(queue, monitor)

    def _no_capacity(self, queue: str) -> Document:
        comment = (
            f"host {self.name} runs {self._exchange_count()} exchanges, its limit "
            f"exchange.max.perhost={self.max_exchanges}; cannot place queue {queue}"
        )
        log.warning(comment)
        return bsonmsg.fail(Reason.NO_CAPACITY, comment)

    def _queue_reply(self, queue: str, monitor: Child) -> Document:
        stat_port = monitor.meta["stat_port"]
        return QueueOnHost(
            monitor_host=endpoint_at(self.address, monitor.port, MonitorPort.REPORTS),
            stat_monitor_host=endpoint_at(self.address, stat_port, StatPort.KPI),
            monitor_port=monitor.port,
            stat_port=stat_port,
            exchanges=tuple(self._exchange_doc(c) for c in self._of(queue, "exchange")),
        ).encode()

    def _exchange_doc(self, child: Child) -> ExchangeInfo:
        return ExchangeInfo(
            exchange_id=child.id,
            port=child.port,
            txid=child.txid,
            front=endpoint_at(self.address, child.port, ExchangePort.FRONT),
            back=endpoint_at(self.address, child.port, ExchangePort.BACK),
        )

    def _start_monitor(self, queue: str) -> Child:
        for _ in range(limits.child_bind_attempts):
            port = self.ports.allocate("monitor", {"queue": queue})
            stat = self.ports.allocate("stat", {"queue": queue})
            child = Child(
                name=f"monitor {queue}",
                role="monitor",
                queue=queue,
                port=port,
                control=endpoint_at(self.address, port, MonitorPort.CONTROL),
                argv=roq_command(
                    "monitor",
                    queue,
                    "--bind",
                    self.address,
                    "--port",
                    str(port),
                    "--stat-port",
                    str(stat),
                    *self._overrides(),
                ),
                id=f"monitor-{queue}",
                meta={"stat_port": stat},
            )
            if self._launch(child, [port, stat]):
                return child
        raise PortInUse(f"could not start the monitor of {queue}: ports kept being taken")

    def _start_exchange(
        self,
        queue: str,
        monitor_port: int,
        stat_port: int,
        txid: str,
        monitor_address: str | None = None,
    ) -> Child:
        monitor_address = monitor_address or self.address
        for _ in range(limits.child_bind_attempts):
            port = self.ports.allocate("exchange", {"queue": queue, "txid": txid})
            exchange_id = f"{self.name.replace(':', '_')}-{port}-{uuid.uuid4().hex[:6]}"
            child = Child(
                name=f"exchange {queue}/{exchange_id}",
                role="exchange",
                queue=queue,
                port=port,
                control=endpoint_at(self.address, port, ExchangePort.CONTROL),
                id=exchange_id,
                txid=txid,
                argv=roq_command(
                    "exchange",
                    queue,
                    "--bind",
                    self.address,
                    "--port",
                    str(port),
                    "--monitor",
                    endpoint_at(monitor_address, monitor_port, MonitorPort.REPORTS),
                    "--stat",
                    endpoint_at(monitor_address, stat_port, StatPort.IN),
                    "--id",
                    exchange_id,
                    *self._overrides(),
                ),
            )
            if self._launch(child, [port]):
                return child
        raise PortInUse(f"could not start an exchange of {queue}: ports kept being taken")

    def _launch(self, child: Child, ports: list[int]) -> bool:
        """Start a child; False if it lost its ports to another program (try other ports)."""
        try:
            supervision.start(child, self.context)
        except PortInUse as error:
            log.warning("%s", error)
            for port in ports:
                self.ports.release(port)
                self.ports.in_use.add(port)  # keep skipping it until it is freed and reused
            return False
        except RoqError:
            for port in ports:
                self.ports.release(port)
            raise
        self.children.append(child)
        return True

    def _overrides(self) -> list[str]:
        """The host's non-default settings, handed to its children on their command line."""
        return [
            arg
            for name, value in self.settings.child_overrides
            for arg in ("-D", f"{name}={value}")
        ]

    def create_exchange(self, request: Document) -> Document:
        wanted = CreateExchangeOnHost.decode(request)
        queue, txid = wanted.queue, wanted.txid
        for child in self._of(queue, "exchange"):
            if child.txid == txid:
                return ExchangeOnHost(self._exchange_doc(child), "exists").encode()
        if self._exchange_count() >= self.max_exchanges:
            return self._no_capacity(queue)
        child = self._start_exchange(
            queue,
            wanted.monitor_port,
            wanted.stat_port,
            txid,
            monitor_address=wanted.monitor_address,
        )
        return ExchangeOnHost(self._exchange_doc(child), "created").encode()

    def remove_exchange(self, request: Document) -> Document:
        unwanted = RemoveExchangeOnHost.decode(request)
        queue, exchange_id = unwanted.queue, unwanted.exchange_id
        for child in self._of(queue, "exchange"):
            if child.id == exchange_id:
                self._stop_child(child)
                return bsonmsg.ok(f"exchange {exchange_id} stopped")
        return bsonmsg.ok(f"exchange {exchange_id} was not running here")

    def stop_queue(self, request: Document) -> Document:
        """1012, or 1008 (`delete_logs`): the queue's processes stop here."""
        stop = StopQueueOnHost.decode(request)
        queue = stop.queue
        # Exchanges first, so they can still tell their monitor they are leaving.
        for child in self._of(queue, "exchange") + self._of(queue, "monitor"):
            self._stop_child(child)
        if stop.delete_logs:
            self._delete_queue_files(queue)
        return bsonmsg.ok(f"queue {queue} stopped on {self.name}")

    def _delete_queue_files(self, queue: str) -> None:
        """The queue's own logs and the copies this host's exchanges kept of other exchanges'
        logs. Called after the queue's children here stopped, so nothing writes to them."""
        root = Path(self.settings.log_root)
        for directory in (root / queue, replica_root(root, queue)):
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
        reachable = session.responds(self.zk)
        if not reachable:
            log.warning("host %s: ZooKeeper unreachable; stopping without unregistering", self.name)
        for child in sorted(self.children, key=lambda c: c.role != "exchange"):
            try:
                self._stop_child(child, release=reachable)
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
        if self.sock is not None:
            self.sock.close(0)
        session.close(self.zk)
        self.context.term()
