"""The scaling actuator: the thread through which a monitor talks to the GCM's admin API.

The monitor's main loop must never block, and these requests block for seconds (2004 starts a
process on some host), so a thread of its own carries out the policy's decisions (2004 to scale
out, 2014 to scale in) and keeps the queue's rules fresh (2008 to register for pushes, then 2007
to read them, every `scaling.rules.refresh.ms`). It owns its AdminClient (not thread-safe) and
shares nothing with the main thread but two bounded queues, `actions` in and `results` out, and
the monitor's ZooKeeper session (thread-safe), where it looks the leading GCM up.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from dataclasses import dataclass

from roq import limits
from roq.backoff import Backoff
from roq.client.admin import AdminClient, AdminRefused
from roq.config import GcmAddress, ZooKeeperSettings
from roq.coordination.discovery import read_leader_admin
from roq.coordination.paths import Paths
from roq.coordination.session import SharedSession
from roq.errors import CoordinationError, RoqError
from roq.protocol.ports import GcmPort, endpoint_at
from roq.protocol.rules import RuleSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RulesRead:
    """The queue's rules as the GCM stores them (None: none stored, the implicit rule)."""

    rules: RuleSet | None


@dataclass(frozen=True)
class Acted:
    """How one action ended: `kind` "out", "copies" or "follower" (2004) or "in" (2014), after
    `seconds`; done with `exchange_id` added or retired, or refused with the admin API's
    `reason` ("unreachable" when no GCM answered) and its `comment`."""

    kind: str
    seconds: float
    ok: bool
    exchange_id: str = ""
    reason: str = ""
    comment: str = ""


Result = RulesRead | Acted  # what the actuator hands the monitor's main thread


class Actuator(threading.Thread):
    """Talks to the GCM for the monitor: rules (2007/2008) and exchanges (2004/2014).

    Owns its AdminClient (not thread-safe); these requests block for seconds (2004 starts a
    process), which the monitor's main loop must never do. Requests come in on `actions`, results
    go out on `results`; both queues are bounded."""

    def __init__(
        self, queue: str, zk: ZooKeeperSettings, session: SharedSession, refresh_s: float,
        listen: str, gcm: GcmAddress | None = None,
    ):  # fmt: skip
        super().__init__(name=f"scaling {queue}", daemon=True)
        self.queue = queue
        self.listen = listen  # tcp://ip:B+4, the monitor's rules PULL socket
        self.zk = zk.servers
        self.namespace = zk.namespace
        self.session = session  # the monitor's one ZooKeeper session
        # gcm.address's admin endpoint: asked when ZooKeeper names no leader (`_leader`)
        self.fallback = endpoint_at(gcm.address, gcm.ports_base, GcmPort.ADMIN) if gcm else ""
        self.refresh_s = refresh_s
        # (action, argument, below): see `Decision`
        self.actions: queue_mod.Queue[tuple[str, str, int]] = queue_mod.Queue(
            limits.scaling_actions_queued_max
        )
        self.results: queue_mod.Queue[Result] = queue_mod.Queue(limits.scaling_results_queued_max)
        self.stop = threading.Event()

    def run(self) -> None:
        paths = Paths(self.namespace)
        with AdminClient(
            zk=self.zk,
            namespace=self.namespace,
            retries=limits.scaling_admin_retries,
            leader=lambda: self._leader(paths),
        ) as admin:
            next_refresh = 0.0
            retry = Backoff(limits.scaling_rules_retry_s, self.refresh_s)
            while not self.stop.is_set():
                if time.monotonic() >= next_refresh:
                    if self._refresh_rules(admin):
                        wait_s = self.refresh_s
                        retry.reset()
                    else:  # the GCM is away: ask again, less and less often
                        wait_s = retry.next_s()
                    next_refresh = time.monotonic() + wait_s
                try:
                    action, argument, below = self.actions.get(
                        timeout=limits.poll_interval_ms / 1000
                    )
                except queue_mod.Empty:
                    continue
                self._put(self._act(admin, action, argument, below))

    def _leader(self, paths: Paths) -> str:
        """The leading GCM's admin endpoint as ZooKeeper names it; when it names none (or does
        not answer), the GCM at gcm.address, as RoQ's ScalingProcess had it: a GCM that does
        not lead answers with the leader, which the admin client follows."""
        try:
            return read_leader_admin(self.session.client(), paths)
        except CoordinationError as error:
            if not self.fallback:
                raise
            log.info("scaling %s: %s; asking gcm.address %s", self.queue, error, self.fallback)
            return self.fallback

    def _refresh_rules(self, admin: AdminClient) -> bool:
        """Register for pushes first, then read: no update can fall between the two."""
        try:
            admin.register_rules_listener(self.queue, self.listen)
            try:
                rules: RuleSet | None = admin.get_rules(self.queue)
            except AdminRefused:
                rules = None  # none stored: the implicit rule applies
        except (RoqError, ValueError) as error:
            log.info("queue %s: rules not read yet (%s); retrying", self.queue, error)
            return False
        self._put(RulesRead(rules))
        return True

    def _act(self, admin: AdminClient, action: str, argument: str, below: int = 0) -> Acted:
        started = time.monotonic()

        def ended(ok: bool, exchange_id: str = "", reason: str = "", comment: str = "") -> Acted:
            return Acted(action, time.monotonic() - started, ok, exchange_id, reason, comment)

        try:
            if action in ("out", "copies", "follower"):
                created = admin.create_exchange(
                    self.queue, argument, below=below, follower=action == "follower"
                )
                return ended(True, created.exchange.exchange_id)
            admin.remove_exchange(self.queue, argument)
            return ended(True, argument)
        except AdminRefused as refused:
            return ended(False, reason=refused.reason, comment=str(refused))
        except (RoqError, ValueError, KeyError) as error:
            return ended(False, reason="unreachable", comment=str(error))

    def _put(self, result: Result) -> None:
        try:
            self.results.put(result, timeout=1.0)
        except queue_mod.Full:
            log.warning("queue %s: scaling result dropped (monitor not reading)", self.queue)
