"""GlobalConfigurationManager — the `roq gcm` process.

Ports (ports.base = P): P+0 topology requests (BSON: 2000 get host by queue, 2 topology dump),
P+3 the admin API (BSON, RoQ's commands 2000–2011 plus roq's 2012–2014), P+5 the config
broadcast (PUB, 3 frames: {CMD:1500, CMD_ID:1500}, {Queues:[…]}, {hosts:[…], Hosts:[…]})
every `period` ms.
RoQ's P+1/P+4 shutdown sockets are replaced by SIGTERM, and P+2 (Java serialization) is gone.

Every GCM of a cluster serves its sockets; only the elected leader acts. The others answer
`{RESULT: 8, LEADER: <its admin endpoint>}` so clients follow. All state lives in ZooKeeper; the
leader's writes are fenced (see coordination.registry), so a deposed leader cannot overwrite it.
One thread owns all sockets (the main loop); the election runs in a thread of its own
(`gcm-election`, coordination/election.py), which touches ZooKeeper only, and the work of hosts
that stay gone is re-placed in `gcm-repair` (gcm/repair.py), whose host requests each open their
own socket in that thread, so a silent host never delays an admin reply.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.client import credentials
from roq.config import GcmSettings
from roq.coordination import session
from roq.coordination.election import Leadership
from roq.coordination.paths import Paths
from roq.coordination.registry import Fence, Registry
from roq.errors import CoordinationError, NotLeader
from roq.gcm import access
from roq.gcm.management import Management
from roq.gcm.metrics import GcmMetrics
from roq.gcm.repair import HostLossRepair, RepairThread
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.dispatch import Table
from roq.protocol.messages.admin import BroadcastQueue, ConfigBroadcast
from roq.protocol.ports import GcmPort, endpoint_at, port_at
from roq.protocol.principals import Principal
from roq.system import notify
from roq.system.netaddr import resolve_interface
from roq.transport import READABLE, Kind, Poller, bind, new_context, open_socket, security
from roq.transport.rpc import answer

log = logging.getLogger(__name__)

_TOPOLOGY = (AdminCommand.INIT_REQ, AdminCommand.GET_HOST_BY_QNAME)


class GlobalConfigurationManager:
    def __init__(self, settings: GcmSettings):
        self.settings = settings
        self.address = resolve_interface(settings.interface)
        self.base = settings.ports_base
        self.period_s = settings.broadcast_period_s
        self.id = f"gcm-{self.address}-{self.base}-{uuid.uuid4().hex[:6]}"
        self.context = new_context()
        auth = security.zk_auth()
        self.session_losses = 0  # roq_zookeeper_session_losses_total (kazoo's thread counts)
        self.zk = session.connect(
            settings.zk.servers, settings.zk.session_timeout_ms, auth=auth,
            on_state=self._on_session_state, tls=security.zk_tls(),
        )  # fmt: skip
        if settings.zk_close_root:
            session.close_root(self.zk, auth)
        session.secure_namespace(self.zk, Paths(settings.zk.namespace), auth)
        credentials.follow_principals(self.zk, settings.zk.namespace)
        self.registry = Registry(self.zk, Paths(settings.zk.namespace))
        self.registry.ensure_roots()
        self.management = Management(self.registry, settings, self.context)
        self.repair = HostLossRepair(self.management, settings.host_loss_grace_s)
        self.management.losses = self.repair.report
        self.leadership = Leadership(self.registry, self._identity(), self._on_elected)
        self.repair_thread = RepairThread(self.repair, lambda: self.leadership.fence)
        self._sockets: dict[str, Any] = {}
        # /metrics, /healthz, /readyz on metrics.port (0: none), from bind() on
        self.metrics: GcmMetrics | None = None
        # The topology port (ports.base) serves two of the admin API's routes, read-only.
        admin = self.management.table
        self.topology = Table(
            "gcm topology", {c: admin.routes[c] for c in _TOPOLOGY}, unknown=admin.unknown,
            bad=admin.bad,
        )  # fmt: skip

    def _on_session_state(self, state: str) -> None:
        if state == "LOST":
            self.session_losses += 1

    def endpoint(self, offset: GcmPort) -> str:
        return endpoint_at(self.address, self.base, offset)

    def _identity(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topology": self.endpoint(GcmPort.TOPOLOGY),
            "admin": self.endpoint(GcmPort.ADMIN),
            "broadcast": self.endpoint(GcmPort.BROADCAST),
        }

    def _on_elected(self, fence: Fence) -> None:
        if self.settings.format_db:
            log.warning("formatDB=true: wiping the cluster state under %s", self.registry.paths)
            self.registry.wipe(fence)
            self.registry.ensure_roots()

    def bind(self) -> None:
        """Bind every port before joining the election, so a port clash fails fast."""
        for name, kind, offset in (
            ("topology", Kind.REP, GcmPort.TOPOLOGY),
            ("admin", Kind.REP, GcmPort.ADMIN),
            ("broadcast", Kind.PUB, GcmPort.BROADCAST),
        ):
            sock = open_socket(self.context, kind)
            self._sockets[name] = sock
            bind(sock, self.address, port_at(self.base, offset))
        if self.settings.metrics_port:
            self.metrics = GcmMetrics(self, self.settings.metrics_port)
            self.metrics.start()

    def run(self, stop: threading.Event, on_ready: Callable[[], object] | None = None) -> None:
        self.leadership.start()
        self.repair_thread.start()
        poller = Poller()
        for name in ("topology", "admin"):
            poller.register(self._sockets[name], READABLE)
        topology, admin = self.endpoint(GcmPort.TOPOLOGY), self.endpoint(GcmPort.ADMIN)
        log.info("gcm %s serving on %s (admin %s)", self.id, topology, admin)
        if on_ready is not None:
            on_ready()
        next_broadcast = time.monotonic() + self.period_s
        while not stop.is_set():
            if self.metrics is not None:
                self.metrics.health.beat()
            notify.keepalive()  # systemd's watchdog (WatchdogSec=): only while this loop turns
            for sock, _ in poller.poll(limits.poll_interval_ms):
                if sock is self._sockets["admin"]:
                    answer(sock, self._admin, "gcm admin", log, self._authorize)
                else:
                    answer(sock, self._topology, "gcm topology", log, access.authorize)
            if time.monotonic() >= next_broadcast:
                next_broadcast = time.monotonic() + self.period_s
                self._broadcast()

    def _authorize(self, principal: Principal | None, request: Document) -> Document | None:
        """access.py's decision, with the queues a creation would add to (its quota)."""
        quota = access.Quota(self.settings.queues_quota, self.registry.queue_names)
        return access.authorize(principal, request, quota)

    def _admin(self, request: Document) -> Document:
        """Where an admin request enters (already authorized, access.py). Only the leader
        serves it, under its fence (`management.table` decodes it and calls the handler); a
        standby answers every request `{RESULT: 8, LEADER}`, whatever its command."""
        return self._serve(self.management.table, request)

    def _topology(self, request: Document) -> Document:
        """Commands 2 and 2000 only: another is refused before the lead is asked."""
        if request["CMD"] not in self.topology.commands:
            return bsonmsg.fail(Reason.UNKNOWN_COMMAND, "topology port serves commands 2 and 2000")
        return self._serve(self.topology, request)

    def _serve(self, table: Table[Fence], request: Document) -> Document:
        """Every ZooKeeper failure is CoordinationError here (coordination/registry.py), so a
        timeout is answered `busy`, never `internal`."""
        try:
            fence = self.leadership.fence
            if fence is None:
                return bsonmsg.lead_lost(self._leader_admin())
            return self.management.handle(table, request, fence)
        except NotLeader as error:  # deposed mid-request: LEADER names the new one, if known
            log.info("gcm %s: %s", self.id, error)
            return bsonmsg.lead_lost(self._leader_admin())
        except CoordinationError as error:  # ZooKeeper went away mid-request: say so, go on
            log.warning("gcm %s: request %s failed: %s", self.id, request["CMD"], error)
            return bsonmsg.fail(Reason.BUSY, f"ZooKeeper unavailable, retry: {error}")

    def _leader_admin(self) -> str:
        """The leader's admin endpoint, "" if unknown (ZooKeeper unreachable: the client then
        asks where it started, or ZooKeeper)."""
        try:
            leader = self.registry.leader()
        except CoordinationError:
            return ""
        return str(leader.get("admin", "")) if leader else ""

    def _broadcast(self) -> None:
        if not self.leadership.is_leader:
            return
        try:
            broadcast = ConfigBroadcast(
                queues=tuple(
                    BroadcastQueue(q.name, q.host, running=q.state == "RUNNING")
                    for q in self.registry.queues()
                ),
                hosts=tuple(h.address for h in self.registry.hosts()),
            )
        except CoordinationError as error:
            # The session was lost under us (a stall past the session timeout); the election
            # thread has already dropped the lead, and this round is skipped, not fatal.
            log.warning("gcm %s: no broadcast this period: %s", self.id, error)
            return
        self._sockets["broadcast"].send_multipart(
            [bsonmsg.encode(frame) for frame in broadcast.frames()]
        )

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        self.repair_thread.stop()  # its host requests' sockets close before the context ends
        self.management.close()  # its rules listeners' sockets, before the context ends
        self.leadership.stop()
        for sock in self._sockets.values():
            sock.close(0)
        session.close(self.zk)
        self.context.term()
