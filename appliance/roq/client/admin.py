"""AdminClient: the queue-lifecycle API of the GCM, from Python.

    admin = AdminClient(gcm="127.0.0.1:5000")      # or AdminClient(zk="127.0.0.1:2181")
    admin.create_queue("q1")                       # on the least-loaded host; host="…" to choose
    admin.list_queues(); admin.stop_queue("q1"); admin.start_queue("q1"); admin.delete_queue("q1")

Every call is one BSON request to the admin API (ports.base+3), built and its reply read by the
schemas of `roq.protocol.messages.admin`: an operation returns its typed reply. A GCM that is not
the leader answers with the leader's address and the client follows it; an unreachable GCM is
retried a bounded number of times (`limits.client_retry_max`), re-reading the leader from
ZooKeeper when a connect string was given. Refusals raise `AdminRefused` with the GCM's reason
and comment; a malformed reply raises `ProtocolError`. Not thread-safe: one AdminClient per thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roq import limits
from roq.backoff import backoff_s
from roq.errors import AdminError, AuthenticationRefused, RequestTimeout, TransportError
from roq.protocol.bsonmsg import Document, Reply
from roq.protocol.commands import AdminCommand, Reason, Result
from roq.protocol.messages.admin import (
    AddRules,
    ClusterStatus,
    CreateExchange,
    CreateQueue,
    CreateQueueAutomatically,
    ExchangeCreated,
    GetHostByQname,
    GetRules,
    GetStatus,
    ListQueues,
    MonitorLocation,
    QueueExists,
    QueueInfo,
    QueueList,
    QueuePlaced,
    RegisterRulesListener,
    RemoveExchange,
    RemoveQueue,
    StartQueue,
    StopQueue,
    StoredRules,
)
from roq.protocol.messages.deadletters import Action, DeadLetters, DeadLettersDone, Letter
from roq.protocol.messages.groups import GroupDelete, GroupInfo, Groups, GroupView
from roq.protocol.ports import GcmPort, endpoint_at
from roq.protocol.rules import RuleSet
from roq.transport import new_context, security
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)
# Requests that start or stop processes may take long; any other reply comes at once, so a dead
# GCM (the one ZooKeeper still names until its session expires) is given up on sooner.
_SLOW = frozenset(
    {
        AdminCommand.CREATE_QUEUE,
        AdminCommand.CREATE_QUEUE_AUTOMATICALLY,
        AdminCommand.START_QUEUE,
        AdminCommand.STOP_QUEUE,
        AdminCommand.REMOVE_QUEUE,
        AdminCommand.CREATE_XCHANGE,
        AdminCommand.REMOVE_XCHANGE,
    }
)


class AdminRefused(AdminError):
    def __init__(self, reason: str, comment: str):
        super().__init__(comment)
        self.reason = reason


class GcmUnreachable(TransportError):
    pass


# The wait between attempts: linear from the first, capped (limits.py)
_BACKOFF_S = (limits.client_retry_backoff_ms / 1000, limits.client_retry_backoff_ms_max / 1000)


class _Wait:
    """One operation's time: its budget (None: the attempts bound it), and a notice, once,
    when the GCM has not answered within `limits.client_wait_notice_s`: a command whose GCM is
    down says what it waits for at once instead of being silent until it gives up."""

    def __init__(self, given: str, budget_s: float | None, notice_s: float | None):
        self.given = given
        self.notice_s = notice_s
        self.started = time.monotonic()
        self.deadline = None if budget_s is None else self.started + budget_s
        self._noticed = notice_s is None  # a single short attempt (a quick locate): nothing

    def check(self) -> bool:
        """Asked while a reply is awaited: True ends the wait (the budget is spent)."""
        now = time.monotonic()
        if not self._noticed and now - self.started >= (self.notice_s or 0.0):
            self._noticed = True
            left = "" if self.deadline is None else f" (for up to {self.deadline - now:.0f} s more)"
            log.warning("waiting for %s: no answer yet%s", self.given, left)
        return self.deadline is not None and now >= self.deadline

    def bound_ms(self, timeout_ms: int) -> int:
        if self.deadline is None:
            return timeout_ms
        return max(1, min(timeout_ms, int((self.deadline - time.monotonic()) * 1000)))

    def sleep(self, seconds: float) -> bool:
        """Wait before the next attempt; False if the budget ends first (no attempt left)."""
        if self.deadline is not None and time.monotonic() + seconds >= self.deadline:
            return False
        time.sleep(seconds)
        return True

    def tries(self, attempts: int) -> str:
        return f"{attempts} attempt(s) in {time.monotonic() - self.started:.1f} s"


class AdminClient:
    def __init__(
        self,
        gcm: str | None = None,
        zk: str | None = None,
        namespace: str = "/roq",
        timeout_ms: int = limits.admin_request_timeout_ms,
        retries: int = limits.client_retry_max,
        *,
        leader: Callable[[], str] | None = None,
        budget_s: float | None = None,
    ):
        """`leader`, when given, finds the leading GCM's admin endpoint instead of `gcm` and
        `zk`: a process with a ZooKeeper session of its own reads it there (a monitor's
        actuator), where `zk` would open one more session for each lookup. `budget_s` bounds
        each operation as a whole, its attempts and their waits together (a command's
        --timeout); without it the attempts alone bound it."""
        if gcm is None and zk is None:
            gcm = "127.0.0.1:5000"
        self.gcm = gcm
        self.zk = zk
        self._leader = leader
        self.namespace = namespace
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.budget_s = budget_s
        self._context = new_context()
        self._endpoint: str | None = None

    # --- transport ---------------------------------------------------------------------------
    def _resolve(self) -> str:
        if self._leader is not None:
            return self._leader()
        if self.zk is not None:
            from roq.coordination.discovery import leader_admin_endpoint

            return leader_admin_endpoint(
                self.zk, self.namespace, security.zk_auth(), security.zk_tls()
            )
        assert self.gcm is not None
        host, _, port = self.gcm.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--gcm {self.gcm!r}: expected HOST:PORT (PORT = ports.base)")
        return endpoint_at(host, int(port), GcmPort.ADMIN)

    def _given(self) -> str:
        """Where the caller said the GCM is, as they said it (errors and notices name it)."""
        if self._leader is not None:
            return "the leading GCM"
        if self.zk is not None:
            return f"the GCM leader named in ZooKeeper {self.zk} ({self.namespace})"
        return f"the GCM at {self.gcm}"

    def request(self, doc: Mapping[str, Any]) -> Document:
        """One admin request, following the leader; raises AdminRefused or GcmUnreachable.
        Returns the reply document (its envelope checked); the operations below read it."""
        last_error, endpoint = "no attempt made", "?"
        timeout_ms, notice_s = self.timeout_ms, limits.client_slow_wait_notice_s
        if doc.get("CMD") not in _SLOW:
            timeout_ms = min(timeout_ms, limits.request_timeout_ms)
            notice_s = limits.client_wait_notice_s
        wait = _Wait(self._given(), self.budget_s, notice_s if self.retries > 1 else None)
        attempts = 0
        for attempt in range(self.retries):
            if attempt and not wait.sleep(backoff_s(attempt, *_BACKOFF_S, linear=True)):
                break
            attempts += 1
            try:
                endpoint = self._endpoint or self._resolve()
                reply = self._attempt(endpoint, doc, wait.bound_ms(timeout_ms), wait)
            except AuthenticationRefused:
                raise  # another attempt would be refused the same way
            except (RequestTimeout, TransportError) as error:
                last_error = str(error)
                self._endpoint = None
                continue
            envelope = Reply.decode(reply)
            if envelope.result == Result.LEAD_LOST:
                self._endpoint = envelope.leader or None
                last_error = f"{endpoint} is not the leader"
                continue
            self._endpoint = endpoint
            if not envelope.ok:
                raise AdminRefused(envelope.error, envelope.comment)
            return reply
        raise GcmUnreachable(
            f"{self._given()} (admin endpoint {endpoint}) did not answer: {wait.tries(attempts)}"
            f"; last: {last_error}"
        )

    def _attempt(
        self, endpoint: str, doc: Mapping[str, Any], timeout_ms: int, wait: _Wait
    ) -> Document:
        requester = Requester(self._context, endpoint, timeout_ms)
        try:
            return requester.request(dict(doc), cancelled=wait.check)
        finally:
            requester.close()

    def close(self) -> None:
        self._context.term()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- operations ----------------------------------------------------------------------------
    def create_queue(self, name: str, host: str | None = None) -> QueuePlaced:
        if host:
            return QueuePlaced.decode(self.request(CreateQueue(name, host).encode()))
        return QueuePlaced.decode(self.request(CreateQueueAutomatically(name).encode()))

    def delete_queue(self, name: str) -> Reply:
        return Reply.decode(self.request(RemoveQueue(name).encode()))

    def stop_queue(self, name: str) -> Reply:
        return Reply.decode(self.request(StopQueue(name).encode()))

    def start_queue(self, name: str, host: str | None = None) -> QueuePlaced:
        return QueuePlaced.decode(self.request(StartQueue(name, host or "").encode()))

    def queue_exists(self, name: str) -> bool:
        try:
            self.request(QueueExists(name).encode())
        except AdminRefused as refused:
            if refused.reason == Reason.UNKNOWN_QUEUE:
                return False
            raise
        return True

    def list_queues(self) -> list[QueueInfo]:
        return list(QueueList.decode(self.request(ListQueues().encode())).queues)

    def status(self) -> ClusterStatus:
        return ClusterStatus.decode(self.request(GetStatus().encode()))

    def get_host_by_qname(self, name: str, need: str = "") -> MonitorLocation:
        """`need`: the permission the monitor is wanted for (a refusal names it)."""
        return MonitorLocation.decode(self.request(GetHostByQname(name, need).encode()))

    def create_exchange(
        self,
        name: str,
        transaction_id: str,
        host: str | None = None,
        below: int = 0,
        follower: bool = False,
    ) -> ExchangeCreated:
        request = CreateExchange(name, transaction_id, host or "", below, follower)
        return ExchangeCreated.decode(self.request(request.encode()))

    def remove_exchange(self, name: str, exchange_id: str) -> Reply:
        return Reply.decode(self.request(RemoveExchange(name, exchange_id).encode()))

    def add_rules(self, name: str, rules: Mapping[str, Any] | RuleSet) -> Reply:
        """Store a rule document (RoQ's 2006 body) or a `RuleSet`. A document goes as given:
        the GCM checks it and its refusal names the field."""
        if isinstance(rules, RuleSet):
            return Reply.decode(self.request(AddRules(name, rules).encode()))
        return Reply.decode(self.request(AddRules.request(name, rules)))

    def get_rules(self, name: str) -> RuleSet:
        return StoredRules.decode(self.request(GetRules(name).encode())).rules

    def register_rules_listener(self, name: str, address: str) -> Reply:
        """Have the GCM push the queue's rules to the PULL socket at `address` (2008)."""
        return Reply.decode(self.request(RegisterRulesListener(name, address).encode()))

    # --- consumer groups (2020–2022, answered by the queue's monitor) -------------------------
    def list_groups(self, queue: str) -> tuple[GroupView, ...]:
        return Groups.decode(self.request(GroupInfo("", queue).encode())).groups

    def get_group(self, queue: str, group: str) -> GroupView:
        found = Groups.decode(self.request(GroupInfo(group, queue).encode())).groups
        if len(found) != 1:
            raise AdminError(f"the monitor answered {len(found)} groups for {group}")
        return found[0]

    def delete_group(self, queue: str, group: str) -> Reply:
        return Reply.decode(self.request(GroupDelete(group, queue).encode()))

    def dead_letters(
        self, queue: str, group: str, action: Action, letters: Sequence[Letter]
    ) -> DeadLettersDone:
        """One step (at most limits.work_dlq_step_max letters), answered once stored (2023)."""
        step = DeadLetters(group, action, tuple(letters), queue)
        return DeadLettersDone.decode(self.request(step.encode()))
