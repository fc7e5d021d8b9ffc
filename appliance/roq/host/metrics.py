"""A host's metrics and health listener (`hcm.metrics.port`, off at 0): its own samples and its
children's, each monitor and exchange asked for them (1040 METRICS) over its control socket when
Prometheus scrapes, so a queue costs no port more (docs/operations.md, "Metrics").

Everything here runs in the listener's threads, never the host loop (which blocks while a child
starts): it reads the loop's state (a copy of its children list, flags), and talks to the
children through sockets of its own, each request bounded by `limits.metrics_child_timeout_ms`
and all of a scrape by `limits.metrics_gather_budget_s`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from roq import limits
from roq.coordination.paths import Paths
from roq.coordination.targets import Target, TargetKeeper
from roq.errors import RoqError
from roq.host.supervision import Child
from roq.metrics import Health, Listener
from roq.protocol.bsonmsg import Document, Reply
from roq.protocol.messages.control import Ping
from roq.protocol.metrics import MetricsReply, MetricsRequest, Sample, sample
from roq.transport.rpc import Requester

if TYPE_CHECKING:
    from roq.host.service import HostConfigManager

log = logging.getLogger(__name__)


def child_state(child: Child) -> str:
    """running, restarting or given_up, from the loop's bookkeeping (no waitpid here: the
    loop owns the process)."""
    if child.given_up:
        return "given_up"
    running = child.process is not None and child.process.returncode is None
    return "running" if running and child.restart_at is None else "restarting"


class HostMetrics:
    def __init__(self, host: HostConfigManager, port: int):
        self.host = host
        self.health = Health(self.problems)
        self.listener = Listener(host.address, port, "host", self.samples, self.health)
        target = Target("host", host.name, f"{host.address}:{port}")
        self.keeper = TargetKeeper(host.zk, Paths(host.settings.zk.namespace), target)
        self.scrape_failures = 0

    def start(self) -> None:
        self.listener.start()
        self.keeper.start()

    def stop(self) -> None:
        self.keeper.stop()
        self.listener.stop()

    # --- /metrics -----------------------------------------------------------------------------
    def samples(self) -> list[Sample]:
        host = self.host
        children = list(host.children)  # one copy: the loop may change the list meanwhile
        found = [
            sample("roq_up", 1, "host"),
            sample("roq_zookeeper_connected", 1 if host.zk.connected else 0, "host"),
            sample("roq_zookeeper_session_losses_total", host.session_losses, "host"),
            sample("roq_host_exchanges_max", host.max_exchanges, host.name),
            sample("roq_host_child_restarts_total", sum(c.restarts for c in children),
                   host.name),
            sample("roq_host_lease_valid", 1 if host.lease.valid(time.monotonic()) else 0,
                   host.name),
            *self._children_counts(children),
        ]  # fmt: skip
        found += self._gather([c for c in children if child_state(c) == "running"])
        found.append(sample("roq_host_scrape_failures_total", self.scrape_failures, host.name))
        return found

    def _children_counts(self, children: list[Child]) -> list[Sample]:
        counts: dict[tuple[str, str], int] = {}
        for child in children:
            key = (child.role, child_state(child))
            counts[key] = counts.get(key, 0) + 1
        return [
            sample("roq_host_children", n, self.host.name, role, state)
            for (role, state), n in sorted(counts.items())
        ]

    def _gather(self, children: list[Child]) -> list[Sample]:
        found: list[Sample] = []
        for child, reply in self._ask_each(children, MetricsRequest().encode()):
            if reply is None:
                self.scrape_failures += 1
                continue
            try:
                if not Reply.decode(reply).ok:
                    raise RoqError(str(reply.get("COMMENT", ""))[:200])
                samples, refused = MetricsReply.decode(reply)
            except RoqError as error:
                log.warning("host %s: %s sent no samples: %s", self.host.name, child.name, error)
                self.scrape_failures += 1
                continue
            if refused:
                log.debug("%s: %d samples refused", child.name, refused)
            found += samples.samples
        return found

    def _ask_each(
        self, children: list[Child], request: Document
    ) -> list[tuple[Child, Document | None]]:
        """Each child's reply (None: none in time, or past the scrape's budget)."""
        deadline = time.monotonic() + limits.metrics_gather_budget_s
        answers: list[tuple[Child, Document | None]] = []
        for child in children:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                answers.append((child, None))
                continue
            timeout_ms = min(left_ms, limits.metrics_child_timeout_ms)
            answers.append((child, _ask(self.host.context, child.control, request, timeout_ms)))
        return answers

    # --- /readyz ------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What keeps this host from serving: its ZooKeeper session, its registration, a child
        that does not answer PING or is not running."""
        host, found = self.host, []
        if not host.zk.connected:
            found.append("ZooKeeper session not connected")
        if host.registration_lost:
            found.append(f"host {host.name} not registered (its ZooKeeper session expired)")
        children = list(host.children)
        for child in children:
            if child_state(child) != "running":
                found.append(f"{child.name}: {child_state(child)}")
        running = [c for c in children if child_state(c) == "running"]
        for child, reply in self._ask_each(running, Ping().encode()):
            if reply is None:
                found.append(f"{child.name} does not answer on {child.control}")
        return found


def _ask(context: Any, endpoint: str, request: Document, timeout_ms: int) -> Document | None:
    requester = Requester(context, endpoint, timeout_ms)
    try:
        return requester.request(request)
    except RoqError:
        return None
    finally:
        requester.close()
