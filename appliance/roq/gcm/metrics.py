"""A GCM's metrics and health listener (`metrics.port`, off at 0; docs/operations.md, "Metrics"):
whether it leads and under which epoch, its ZooKeeper session, and, on the leader, the hosts and
queues ZooKeeper records. It runs in the listener's threads: it reads ZooKeeper (kazoo is
thread-safe) and the election's flags, never the GCM's sockets."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from roq.coordination.paths import Paths
from roq.coordination.targets import Target, TargetKeeper
from roq.errors import CoordinationError
from roq.metrics import Health, Listener
from roq.protocol.metrics import Sample, sample

if TYPE_CHECKING:
    from roq.gcm.service import GlobalConfigurationManager

log = logging.getLogger(__name__)


class GcmMetrics:
    def __init__(self, gcm: GlobalConfigurationManager, port: int):
        self.gcm = gcm
        self.health = Health(self.problems)
        self.listener = Listener(gcm.address, port, "gcm", self.samples, self.health)
        target = Target("gcm", gcm.id, f"{gcm.address}:{port}")
        self.keeper = TargetKeeper(gcm.zk, Paths(gcm.settings.zk.namespace), target)

    def start(self) -> None:
        self.listener.start()
        self.keeper.start()

    def stop(self) -> None:
        self.keeper.stop()
        self.listener.stop()

    def samples(self) -> list[Sample]:
        gcm = self.gcm
        fence = gcm.leadership.fence
        found = [
            sample("roq_up", 1, "gcm"),
            sample("roq_zookeeper_connected", 1 if gcm.zk.connected else 0, "gcm"),
            sample("roq_zookeeper_session_losses_total", gcm.session_losses, "gcm"),
            sample("roq_gcm_leader", 0 if fence is None else 1),
            sample("roq_gcm_epoch", 0 if fence is None else fence.version),
        ]
        return found + (self._cluster() if fence is not None else [])

    def _cluster(self) -> list[Sample]:
        """What ZooKeeper records (the leader's view; a standby's would repeat it)."""
        try:
            hosts = self.gcm.registry.hosts()
            queues = self.gcm.registry.queues()
        except CoordinationError as error:
            log.debug("gcm metrics: %s", error)
            return []
        states: dict[str, int] = {}
        for queue in queues:
            states[str(queue.state)] = states.get(str(queue.state), 0) + 1
        return [
            sample("roq_gcm_hosts", len(hosts)),
            *(sample("roq_gcm_queues", n, state) for state, n in sorted(states.items())),
        ]

    def problems(self) -> list[str]:
        """What keeps this GCM from serving: its ZooKeeper session, a leader (itself or
        another: a standby serves by pointing clients at it)."""
        gcm = self.gcm
        if not gcm.zk.connected:
            return ["ZooKeeper session not connected"]
        if gcm.leadership.is_leader:
            return []
        try:
            leader = gcm.registry.leader()
        except CoordinationError as error:
            return [f"cannot read the leader: {error}"]
        return [] if leader else ["no GCM leads the cluster"]
