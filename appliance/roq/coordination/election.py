"""GCM leader election: kazoo's Election recipe, an epoch fence, and the leader znode.

`Leadership.start()` runs the election in its own thread. While this process leads, `fence` is
set and the ephemeral leader znode names its endpoints; when the session is lost or `stop()` is
called, `fence` is cleared before anything else, so the serving thread refuses writes at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.protocol.states import KazooState
from kazoo.recipe.election import Election

from roq import limits
from roq.coordination import session
from roq.coordination.registry import Fence, Registry

log = logging.getLogger(__name__)


class Leadership:
    def __init__(
        self,
        registry: Registry,
        identity: dict[str, Any],
        on_elected: Callable[[Fence], None] | None = None,
    ):
        self.registry = registry
        self.identity = identity
        # the current term (None: not leading), one reference: set by `gcm-election`, cleared by
        # it and by kazoo's state listener; read by the main loop and `gcm-repair`
        self.fence: Fence | None = None
        self._on_elected = on_elected
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._election = Election(registry.zk, registry.paths.election, identity.get("id"))
        self._thread = threading.Thread(target=self._run, name="gcm-election", daemon=True)
        registry.zk.add_listener(self._on_state)

    def start(self) -> None:
        self._thread.start()

    @property
    def is_leader(self) -> bool:
        return self.fence is not None

    def _on_state(self, state: Any) -> None:
        if state in (KazooState.LOST, KazooState.SUSPENDED):
            # While suspended we cannot know whether another GCM took over: stop writing now.
            if self.fence is not None:
                log.warning("ZooKeeper session %s: no longer acting as leader", state)
            self.fence = None
            self._lost.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._election.run(self._lead)
            except KazooException as error:
                log.warning("election interrupted: %s; retrying", error)
            self._stop.wait(0.5)

    def _lead(self) -> None:
        self._lost.clear()
        fence = self.registry.bump_epoch()
        if not self._publish_leader():
            return
        log.info("elected leader (epoch %d)", fence.version)
        if self._on_elected is not None:
            self._on_elected(fence)
        self.fence = fence
        while not self._stop.is_set() and not self._lost.is_set():
            self._stop.wait(0.2)
        self.fence = None
        self._withdraw_leader()

    def _publish_leader(self) -> bool:
        data = json.dumps(self.identity).encode()
        for _ in range(limits.leader_create_tries):
            try:
                self.registry.zk.create(
                    self.registry.paths.leader, data, ephemeral=True, makepath=True
                )
                return True
            except NodeExistsError:
                if self._stop.wait(0.1):
                    return False
        log.error("a stale leader znode did not go away; giving up this term")
        return False

    def _withdraw_leader(self) -> None:
        """Delete the leader znode, only if this session created it. A GCM whose session
        expired (stopped or cut off past the timeout) gets here with a new session, after a
        standby took over and created its own leader znode: deleting that one left the
        cluster with a leader no client could find (tests/faults, SIGSTOP of a machine)."""
        zk = self.registry.zk
        try:
            stat = zk.exists(self.registry.paths.leader)
            client_id = zk.client_id
            if stat is None or client_id is None or stat.ephemeralOwner != client_id[0]:
                return
            zk.delete(self.registry.paths.leader, version=stat.version)
        except KazooException:
            pass  # the session is gone, and so is the ephemeral

    def stop(self) -> None:
        self.fence = None
        self._stop.set()
        self._election.cancel()
        # close() also runs when bind() failed (port taken), before the thread was started.
        # Waiting helps only while ZooKeeper answers: the thread then deletes the leader znode
        # and its lock, so a standby takes over now rather than after the session timeout.
        if self._thread.is_alive() and session.responds(self.registry.zk):
            self._thread.join(timeout=limits.election_stop_join_s)
