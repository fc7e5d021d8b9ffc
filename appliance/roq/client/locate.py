"""Finding a queue's monitor: through the GCM's admin API (`GET_HOST_BY_QNAME`, 2000).

Clients ask again when their monitor stops answering: after its host is lost the GCM re-places
it (gcm/repair.py) and answers with the new address (client/publisher.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.client.admin import AdminClient
from roq.errors import RoqError
from roq.protocol.messages.admin import MonitorLocation
from roq.protocol.ports import MonitorPort, StatPort, sibling

log = logging.getLogger(__name__)


class MonitorAddress:
    """`tcp://ip:B` of a queue's monitor, with the derived endpoints clients use."""

    def __init__(self, base: str, stat: str = "", epoch: int = 0):
        host, _, port = base.rpartition(":")
        if not host.startswith("tcp://") or not port.isdigit():
            raise RoqError(f"monitor address {base!r} is not tcp://HOST:PORT")
        self.base = base
        # tcp://ip:S+1, the KPI stream (GET_HOST_BY_QNAME's Stat_Monitor_host); statistics
        # are sent to its input, S (`stat_in`)
        self.stat = stat
        # the assignment epoch the GCM recorded for this monitor (0: unknown, or named by the
        # caller); the client refuses monitor messages of older ones (protocol/epoch.py)
        self.epoch = epoch
        self.host = host
        self.port = int(port)

    def at(self, offset: MonitorPort) -> str:
        """The monitor's endpoint at `offset` (the base address is B+0)."""
        return sibling(self.base, MonitorPort.REPORTS, offset)

    @property
    def stat_in(self) -> str:
        """Where statistics are sent (S), or "" when the monitor's stat address is unknown."""
        return sibling(self.stat, StatPort.KPI, StatPort.IN) if self.stat else ""


def locate_monitor(
    queue: str,
    gcm: str | None = None,
    zk: str | None = None,
    namespace: str = "/roq",
    *,
    quick: bool = False,
    need: str = "",
    budget_s: float | None = None,
) -> MonitorAddress:
    """Ask the leading GCM where `queue`'s monitor is (raises AdminRefused if it has none).
    `quick`: one attempt within `limits.monitor_locate_timeout_ms` (a client checking whether
    the monitor moved, from a loop that must not stall for long). `need`: the permission the
    monitor is wanted for (publish, subscribe, consume), which a refusal then names.
    `budget_s` bounds the question as a whole (a command's --timeout)."""
    bounds: dict[str, Any] = (
        {"timeout_ms": limits.monitor_locate_timeout_ms, "retries": 1}
        if quick
        else {"budget_s": budget_s}
    )
    with AdminClient(gcm=gcm, zk=zk, namespace=namespace, **bounds) as admin:
        found = admin.get_host_by_qname(queue, need)
    return MonitorAddress(found.monitor_host, found.stat_monitor_host, found.epoch)


class MonitorLocator:
    """Asks the GCM where a queue's monitor is in a thread of its own, one question at a time,
    so that a client's I/O loop never waits on the GCM: a dead GCM that ZooKeeper still names
    costs a request's timeout, and finding the leader through ZooKeeper a session's start. The
    loop asks (`ask`) and takes the answer on a later turn (`take`). The thread starts at the
    first question and keeps one AdminClient, so the leader's address is looked up again only
    when it stops answering."""

    def __init__(
        self, queue: str, where: tuple[str | None, str | None, str], name: str, need: str = ""
    ):
        self._need = need  # the permission the monitor is wanted for: a refusal names it
        self.queue = queue
        self._where = where  # (gcm, zk, namespace)
        self._name = name
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._answer: MonitorAddress | None = None
        self._in_flight = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def ask(self) -> bool:
        """Start a question; False if one is still in flight (it is not asked twice)."""
        with self._lock:
            if self._in_flight or self._stopping:
                return False
            self._in_flight = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"roq-locate-{self._name}", daemon=True
                )
                self._thread.start()
        self._wanted.set()
        return True

    def take(self) -> MonitorAddress | None:
        """The last answer, once (None: none came since the last take)."""
        with self._lock:
            found, self._answer = self._answer, None
        return found

    def _run(self) -> None:
        gcm, zk, namespace = self._where
        bounds: dict[str, Any] = {"timeout_ms": limits.monitor_locate_timeout_ms, "retries": 1}
        admin = AdminClient(gcm=gcm, zk=zk, namespace=namespace, **bounds)
        try:
            while self._next():
                self._answered(self._one(lambda queue: admin.get_host_by_qname(queue, self._need)))
        finally:
            admin.close()

    def _next(self) -> bool:
        self._wanted.wait()
        self._wanted.clear()
        return not self._stopping

    def _one(self, ask: Callable[[str], MonitorLocation]) -> MonitorAddress | None:
        try:
            found = ask(self.queue)
            return MonitorAddress(found.monitor_host, found.stat_monitor_host, found.epoch)
        except RoqError as error:
            log.info("%s: where is the monitor? %s", self._name, error)
            return None

    def _answered(self, found: MonitorAddress | None) -> None:
        with self._lock:
            if found is not None:
                self._answer = found
            self._in_flight = False

    def close(self) -> None:
        """Stop the thread; a question in flight ends within its own bound (the thread is a
        daemon: a process that exits does not wait for it)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wanted.set()
        if thread is not None:
            thread.join(timeout=limits.monitor_locate_timeout_ms / 1000 + 1)
