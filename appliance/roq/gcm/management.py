"""The admin API's behaviour (RoQ's MngtController), run by the leading GCM.

Each handler validates its request, changes ZooKeeper through fenced writes and asks hosts to
start or stop processes. The queue state machine makes creation idempotent across a GCM crash:

    (none) --create--> CREATING --host started it--> RUNNING --stop--> STOPPED --start--> RUNNING
    any state --remove--> DELETING --host stopped it--> (none)

A create that finds CREATING continues on the recorded host (if it is still alive), because the
host's own create is idempotent; a create that finds RUNNING or STOPPED answers "already exists".
A create the host refuses (no free exchange slot, no free port) is rolled back: the host is asked
to drop whatever it holds of the queue, the record is deleted, and the admin gets the host's
reason. A host that does not answer leaves CREATING, which the next create resumes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from roq import limits
from roq.config import GcmSettings
from roq.coordination.registry import (
    ExchangeRecord,
    Fence,
    HostRecord,
    QueueRecord,
    QueueState,
    Registry,
)
from roq.errors import (
    AdminError,
    CoordinationError,
    DecodeError,
    HostRegistered,
    ProtocolError,
    RoqError,
    TransportError,
)
from roq.gcm import groups
from roq.gcm.provisioning import make_provisioner
from roq.protocol import bsonmsg, dispatch
from roq.protocol.bsonmsg import Document, Reply
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.dispatch import Done, Encodable, Route, Table, route
from roq.protocol.messages.admin import (
    AddRules,
    ChildReport,
    CloudProperties,
    ClusterStatus,
    CreateExchange,
    CreateQueue,
    CreateQueueAutomatically,
    ExchangeCreated,
    GetCloudProperties,
    GetHostByQname,
    GetRules,
    GetStatus,
    GetTopology,
    GoneHost,
    HostInfo,
    ListQueues,
    MonitorLocation,
    PendingRepair,
    QueueExists,
    QueueInfo,
    QueueList,
    QueuePlaced,
    QueueStatus,
    RecordedExchange,
    RegisterRulesListener,
    RemoveExchange,
    RemoveQueue,
    StartQueue,
    StopQueue,
    StoredRules,
    Topology,
)
from roq.protocol.messages.deadletters import DeadLetters
from roq.protocol.messages.groups import GroupDelete, GroupInfo
from roq.protocol.messages.host import (
    CreateExchangeOnHost,
    CreateQueueOnHost,
    ExchangeInfo,
    ExchangeOnHost,
    QueueOnHost,
    RemoveExchangeOnHost,
    StopMonitorOnHost,
    StopQueueOnHost,
)
from roq.protocol.messages.monitor import RulesUpdate
from roq.protocol.rules import RuleSet
from roq.transport import Kind, connect, open_socket, send_nowait
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)

R = TypeVar("R")
Q = TypeVar("Q", bound="_NamesQueue")
Losses = tuple[tuple[GoneHost, ...], tuple[PendingRepair, ...]]


class HostRequest(Protocol):
    def encode(self) -> Document: ...


class _NamesQueue(Protocol):
    """A request that changes one queue (its `QName`)."""

    @property
    def queue(self) -> str: ...


class Refused(RoqError):
    """A request the GCM turns down, raised from deep in a handler; `Management.handle`
    answers it as the FAIL reply `reply()` (dispatch.Refused) with this reason."""

    def __init__(self, reason: Reason, comment: str):
        super().__init__(comment)
        self.reason = reason

    def reply(self) -> dispatch.Refused:
        return dispatch.Refused(self.reason, str(self))


class HostSilent(Refused):
    """The host did not answer in time: it may still be carrying the request out."""


# RoQ's wording of the admin API's two refusals (docs/protocol.md, "GCM")
def _unknown(command: object) -> str:
    return f"INVALID CMD Value {command}"


def _bad(error: DecodeError) -> str:
    return f"{error}, INVALID REQUEST"


class QueueClaims:
    """The queues a thread is changing now. Neither the admin loop nor the repair thread waits
    for the other: the admin request that finds its queue claimed is answered `busy`, and the
    repair tries a claimed queue again at its next check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()

    def claim(self, queue: str) -> bool:
        with self._lock:
            if queue in self._held:
                return False
            self._held.add(queue)
            return True

    def release(self, queue: str) -> None:
        with self._lock:
            self._held.discard(queue)


class HostBack(Refused):
    """The monitor's re-placement found its lost host registered again: nothing was recorded,
    the old monitor stays the queue's (gcm/repair.py stops; the host adopts what it has).
    `unwithdrawn`: (host, epoch) of the monitor started for the move that its host did not
    stop when asked (the repair asks again)."""

    def __init__(self, reason: Reason, comment: str, unwithdrawn: tuple[str, int] | None = None):
        super().__init__(reason, comment)
        self.unwithdrawn = unwithdrawn


class Management:
    """Handlers of the admin API, called from the GCM's main thread; the repair thread
    (gcm/repair.py) calls the host-facing parts too, on the queues it claimed (`claims`).
    Shared state is ZooKeeper's (kazoo is thread-safe); a host request opens its own socket
    in the calling thread; the rules listeners' sockets are the main thread's alone."""

    def __init__(self, registry: Registry, settings: GcmSettings, context: Any):
        self.registry = registry
        self.settings = settings
        self.context = context
        self.host_timeout_ms = settings.host_timeout_ms
        # queue → {listener address → PUSH socket}, for the listeners stored in ZooKeeper
        self._listeners: dict[str, dict[str, Any]] = {}
        self.provisioner = make_provisioner(settings.provisioning)
        self._provision_lock = threading.Lock()  # both threads may ask the provisioner
        self.claims = QueueClaims()
        # per thread: what ends its waits on hosts early (the repair thread: the lead lost)
        self._local = threading.local()
        # the gone hosts and pending re-placements `roq status` shows (the GCM sets it to its
        # HostLossRepair's report)
        self.losses: Callable[[], Losses] = lambda: ((), ())
        # The admin API (ports.base+3, docs/protocol.md "GCM"): one typed entry per command,
        # under the leader's fence; the requests that change a queue claim it first.
        self.table: Table[Fence] = Table("gcm admin", self._routes(), unknown=_unknown, bad=_bad)

    def _routes(self) -> dict[int, Route[Any, Fence]]:
        claimed = self._claimed
        return {
            AdminCommand.INIT_REQ: route(GetTopology.decode, self.topology),
            AdminCommand.GET_HOST_BY_QNAME: route(GetHostByQname.decode, self.get_host_by_qname),
            AdminCommand.CREATE_QUEUE: Route(CreateQueue.decode, claimed(self.create_queue)),
            # not claimed, as before the table (its queue is new, or it is "already exists")
            AdminCommand.CREATE_QUEUE_AUTOMATICALLY: Route(
                CreateQueueAutomatically.decode, self.create_queue_automatically
            ),
            AdminCommand.CREATE_XCHANGE: Route(
                CreateExchange.decode, claimed(self.create_exchange)
            ),
            AdminCommand.REMOVE_XCHANGE: Route(
                RemoveExchange.decode, claimed(self.remove_exchange)
            ),
            AdminCommand.REMOVE_QUEUE: Route(RemoveQueue.decode, claimed(self.remove_queue)),
            AdminCommand.STOP_QUEUE: Route(StopQueue.decode, claimed(self.stop_queue)),
            AdminCommand.START_QUEUE: Route(StartQueue.decode, claimed(self.start_queue)),
            AdminCommand.QUEUE_EXISTS: route(QueueExists.decode, self.queue_exists),
            AdminCommand.LIST_QUEUES: route(ListQueues.decode, self.list_queues),
            AdminCommand.GET_STATUS: route(GetStatus.decode, self.status),
            AdminCommand.ADD_AUTOSCALING_RULE: Route(AddRules.decode, self.add_rule),
            AdminCommand.GET_AUTOSCALING_RULE: route(GetRules.decode, self.get_rule),
            AdminCommand.REGISTER_FOR_AUTOSCALING_RULE_UPDATE: Route(
                RegisterRulesListener.decode, self.register_listener
            ),
            AdminCommand.GET_CLOUD_PROPERTIES: route(
                GetCloudProperties.decode, self.cloud_properties
            ),
            AdminCommand.LIST_GROUPS: route(GroupInfo.decode_admin, self.list_groups),
            AdminCommand.GET_GROUP: route(GroupInfo.decode_admin, self.get_group),
            AdminCommand.DELETE_GROUP: route(GroupDelete.decode_admin, self.delete_group),
            AdminCommand.GROUP_DEAD_LETTERS: route(DeadLetters.decode_admin, self.dead_letters),
        }

    def handle(self, table: Table[Fence], request: Document, fence: Fence) -> Document:
        """The reply to `request` on a socket served by `table` (the admin API's, or the
        topology port's two of its routes): a Refused raised in a handler is its FAIL reply."""
        try:
            reply = table(request, fence)
        except Refused as refused:
            reply = table.stamp(refused.reply().encode())
        except DecodeError as error:  # a record the handler read, checked as a request is
            reply = table.stamp(dispatch.Refused(Reason.BAD_REQUEST, _bad(error)).encode())
        assert reply is not None  # a REP socket's handlers hold nothing
        return reply

    def _claimed(self, handler: Callable[[Q, Fence], Encodable]) -> Callable[[Q, Fence], Encodable]:
        """`handler`, run while its queue is claimed: the repair thread (gcm/repair.py) never
        changes the same queue at once, and an admin request that finds it claimed is `busy`."""

        def claimed(wanted: Q, fence: Fence) -> Encodable:
            if not self.claims.claim(wanted.queue):
                return dispatch.Refused(
                    Reason.BUSY, f"queue {wanted.queue} is being re-placed after a host loss; retry"
                )
            try:
                return handler(wanted, fence)
            finally:
                self.claims.release(wanted.queue)

        return claimed

    def cancel_host_calls_when(self, cancelled: Callable[[], bool] | None) -> None:
        """This thread's host requests end early once `cancelled()` is True."""
        self._local.cancelled = cancelled

    def provision(self, reason: str) -> str:
        with self._provision_lock:
            return self.provisioner.provision(reason)

    # --- lookups -------------------------------------------------------------------------
    def _queue(self, name: str) -> tuple[QueueRecord, int]:
        found = self.registry.queue(name)
        if found is None:
            raise Refused(Reason.UNKNOWN_QUEUE, f"The Queue {name} is not registered.")
        return found

    def _live_host(self, name: str) -> HostRecord:
        host = self.registry.host(name)
        if host is None:
            raise Refused(Reason.NO_SUCH_HOST, f"host {name} is not registered (no live roq host)")
        return host

    def _find_host(self, name_or_address: str) -> HostRecord:
        for host in self.registry.hosts():
            if name_or_address in (host.name, host.address):
                return host
        raise Refused(
            Reason.NO_SUCH_HOST, f"host {name_or_address} is not registered (no live roq host)"
        )

    def topology(self, _: GetTopology) -> Encodable:
        return Topology(
            hosts=tuple(h.address for h in self.registry.hosts()),
            queues=tuple(self._queue_doc(q) for q in self.registry.queues()),
        )

    def get_host_by_qname(self, wanted: GetHostByQname) -> Encodable:
        record = self._running(wanted.queue)
        return MonitorLocation(record.monitor, record.stat, record.epoch)

    def _running(self, name: str) -> QueueRecord:
        record, _ = self._queue(name)
        if record.state != QueueState.RUNNING:
            raise Refused(Reason.UNKNOWN_QUEUE, f"The Queue {record.name} is {record.state}.")
        return record

    # --- consumer groups: the queue's monitor answers (gcm/groups.py) ------------------------
    def list_groups(self, wanted: GroupInfo) -> Encodable:
        """2020 (with a `Group`, that one only, as 2021)."""
        return groups.forward(self.context, self._monitor_of(wanted.queue), GroupInfo(wanted.group))

    def get_group(self, wanted: GroupInfo) -> Encodable:
        monitor = self._monitor_of(wanted.queue)
        if not wanted.group:
            return dispatch.Refused(Reason.BAD_REQUEST, "2021 needs a Group")
        return groups.forward(self.context, monitor, GroupInfo(wanted.group))

    def delete_group(self, unwanted: GroupDelete) -> Encodable:
        monitor = self._monitor_of(unwanted.queue)
        return groups.forward(self.context, monitor, GroupDelete(unwanted.group))

    def dead_letters(self, step: DeadLetters) -> Encodable:
        """2023: one redrive or purge step (admin on the queue: gcm/access.py)."""
        monitor = self._monitor_of(step.queue)
        return groups.forward(self.context, monitor, dataclasses.replace(step, queue=""))

    def _monitor_of(self, name: str) -> str:
        record = self._running(name)
        if not record.monitor:
            raise Refused(Reason.UNKNOWN_QUEUE, f"The Queue {record.name} is {record.state}.")
        return record.monitor

    def queue_exists(self, wanted: QueueExists) -> Encodable:
        found = self.registry.queue(wanted.queue)
        if found is not None and found[0].state == QueueState.RUNNING:
            return Done("YES")
        return dispatch.Refused(Reason.UNKNOWN_QUEUE, "NO")

    def list_queues(self, _: ListQueues) -> Encodable:
        return QueueList(tuple(self._queue_doc(q) for q in self.registry.queues()))

    def status(self, _: GetStatus) -> Encodable:
        hosts = self.registry.hosts()
        queues = []
        for queue in self.registry.queues():
            exchanges = tuple(
                RecordedExchange(x.id, x.host, x.front, x.back, x.lost, x.follower)
                for x in self.registry.exchanges(queue.name)
            )
            queues.append(QueueStatus(self._queue_doc(queue), exchanges))
        gone, repairs = self.losses()
        return ClusterStatus(
            hosts=tuple(_host_info(h) for h in hosts),
            queues=tuple(queues),
            gone=gone,
            repairs=repairs,
        )

    def _queue_doc(self, queue: QueueRecord) -> QueueInfo:
        return QueueInfo(
            name=queue.name,
            host=queue.host,
            state=str(queue.state),
            monitor_host=queue.monitor,
            stat_monitor_host=queue.stat,
            host_alive=self.registry.host(queue.host) is not None,
        )

    # --- host calls ----------------------------------------------------------------------
    def _call_host(
        self, host: HostRecord, request: HostRequest, decode: Callable[[Document], R]
    ) -> R:
        """The host's reply, read by `decode` if it is OK; a refusal or a malformed reply
        raises Refused (never a bad-request error: the admin's request was fine)."""
        requester = Requester(self.context, host.hcm, self.host_timeout_ms)
        watch = _HostWatch(self.registry, host)
        outer = getattr(self._local, "cancelled", None)
        try:
            reply = requester.request(
                request.encode(), cancelled=lambda: bool(outer and outer()) or watch.changed()
            )
        except TransportError as error:
            why = watch.why or f"did not answer: {error}"
            raise HostSilent(Reason.HOST_FAILED, f"host {host.name} {why}") from None
        finally:
            requester.close()
        try:
            envelope = Reply.decode(reply)
            if envelope.ok:
                return decode(reply)
        except ProtocolError as error:
            raise Refused(
                Reason.HOST_FAILED, f"host {host.name} sent a bad reply: {error}"
            ) from None
        reason = envelope.error
        raise Refused(
            Reason(reason) if reason in set(Reason) else Reason.HOST_FAILED,
            f"host {host.name}: {envelope.comment}",
        )

    # --- queue lifecycle -------------------------------------------------------------------
    def create_queue(self, wanted: CreateQueue, fence: Fence) -> Encodable:
        host = self._find_host(wanted.host)
        return self._create(wanted.queue, host, fence)

    def create_queue_automatically(
        self, wanted: CreateQueueAutomatically, fence: Fence
    ) -> Encodable:
        return self._create(wanted.queue, self._least_loaded_host(), fence)

    def _least_loaded_host(self) -> HostRecord:
        hosts = self.registry.hosts()
        if not hosts:
            raise Refused(Reason.NO_SUCH_HOST, "no host is registered")
        load = {h.name: 0 for h in hosts}
        for queue in self.registry.queues():
            for exchange in self.registry.exchanges(queue.name):
                if exchange.host in load and not exchange.lost:
                    load[exchange.host] += 1
        return max(hosts, key=lambda h: (h.max_exchanges - load[h.name], h.name))

    def _create(self, name: str, host: HostRecord, fence: Fence) -> QueuePlaced:
        found = self.registry.queue(name)
        if found is None:
            self._write_new_queue(name, host, fence)
        elif found[0].state == QueueState.CREATING:
            host = self._resume_host(found[0], host, found[1], fence)
        else:
            raise Refused(Reason.ALREADY_EXISTS, f"The queue {name} already exists")
        try:
            self._start_on_host(name, host, fence)
        except HostSilent:
            raise  # CREATING stays: the host may finish, and the next create resumes it
        except Refused as refused:
            self._roll_back_create(name, host, fence)
            raise Refused(refused.reason, f"{refused}; queue {name} not created") from None
        log.info("queue %s created on host %s", name, host.name)
        return QueuePlaced(host.name, f"queue {name} created on {host.name}")

    def _roll_back_create(self, name: str, host: HostRecord, fence: Fence) -> None:
        """The host refused: it drops what it may hold of the queue (a monitor started by an
        earlier, interrupted create), then the record goes, so a fresh create starts over."""
        try:
            self._call_host(host, StopQueueOnHost(name, delete_logs=True), Reply.decode)
        except Refused as error:
            log.warning("queue %s: cleaning up the refused create: %s", name, error)
        self.registry.delete_queue(fence, name)
        log.warning("queue %s: create refused by host %s, rolled back", name, host.name)

    def _write_new_queue(self, name: str, host: HostRecord, fence: Fence) -> None:
        try:
            self.registry.create_queue(fence, QueueRecord(name, QueueState.CREATING, host.name))
        except AdminError:
            raise Refused(Reason.ALREADY_EXISTS, f"The queue {name} already exists") from None

    def _resume_host(
        self, record: QueueRecord, requested: HostRecord, version: int, fence: Fence
    ) -> HostRecord:
        """A create interrupted by a GCM crash resumes on the host it had chosen."""
        recorded = self.registry.host(record.host)
        if recorded is not None:
            log.info("queue %s: resuming an interrupted create on %s", record.name, record.host)
            return recorded
        record.host = requested.name
        self.registry.update_queue(fence, record, version)
        return requested

    def _start_on_host(
        self,
        name: str,
        host: HostRecord,
        fence: Fence,
        replacing: str = "",
        mark_lost: bool = True,
    ) -> None:
        """Place the queue's monitor on `host` under the next assignment epoch. `replacing`:
        the gone host whose monitor this replaces; the record is written only while that host
        has no registration (HostBack otherwise: docs/guarantees.md §8, the re-registration
        race), and with `mark_lost` (its grace is over) its exchanges of the queue are marked
        lost in the same write."""
        epoch = self._queue(name)[0].epoch + 1
        known = {x.id for x in self.registry.exchanges(name)} if replacing else set()
        reply = self._call_host(host, CreateQueueOnHost(name, epoch), QueueOnHost.decode)
        record, version = self._queue(name)
        if record.epoch >= epoch:  # placed meanwhile by another writer: its monitor is newer
            raise Refused(Reason.BUSY, f"queue {name} was placed concurrently; retry")
        record.epoch = epoch
        record.state = QueueState.RUNNING
        record.host = host.name
        record.monitor = reply.monitor_host
        record.stat = reply.stat_monitor_host
        record.monitor_port = reply.monitor_port
        record.stat_port = reply.stat_port
        self._record_exchanges(name, host, reply.exchanges, fence)
        try:
            self.registry.update_queue(
                fence, record, version, absent_host=replacing, mark_lost=mark_lost
            )
        except HostRegistered:
            stopped = self._withdraw(name, host, reply, known, fence, epoch)
            raise HostBack(
                Reason.BUSY,
                f"host {replacing} registered again: its monitor of {name} stays",
                None if stopped else (host.name, epoch),
            ) from None

    def _withdraw(
        self,
        name: str,
        host: HostRecord,
        reply: QueueOnHost,
        known: set[str],
        fence: Fence,
        epoch: int,
    ) -> bool:
        """A re-placement that lost the race with the returning host: when `host` ran nothing
        of the queue before, it stops what it just started (the logs stay) and the new
        exchanges' records go; otherwise it stops only the monitor it started under `epoch`
        (1014), and its exchanges of the queue go on. False if `host` did not answer: the
        repair asks it again to stop that monitor (1014; the new exchanges, recorded, stay)."""
        started = [x.exchange_id for x in reply.exchanges if x.exchange_id not in known]
        request: StopMonitorOnHost | StopQueueOnHost = StopQueueOnHost(name, delete_logs=False)
        if len(started) < len(reply.exchanges):
            request = StopMonitorOnHost(name, epoch)
        try:
            self._call_host(host, request, Reply.decode)
        except Refused as error:
            log.warning("queue %s: withdrawing from %s: %s", name, host.name, error)
            return False
        if isinstance(request, StopMonitorOnHost):
            log.warning("queue %s: the monitor started on %s for the called-off move stopped",
                        name, host.name)  # fmt: skip
            return True
        for exchange_id in started:
            self.registry.delete_exchange(fence, name, exchange_id)
        return True

    def _record_exchanges(
        self, queue: str, host: HostRecord, exchanges: Sequence[ExchangeInfo], fence: Fence
    ) -> None:
        known = {x.id: x for x in self.registry.exchanges(queue)}
        for info in exchanges:
            record = ExchangeRecord(
                id=info.exchange_id,
                queue=queue,
                host=host.name,
                front=info.front,
                back=info.back,
                port=info.port,
                txid=info.txid,
                follower=info.follower,
            )
            if info.exchange_id not in known:
                self.registry.put_exchange(fence, record)
            elif known[info.exchange_id] != record:  # started again (queue start), new ports
                self.registry.update_exchange(fence, record)

    def stop_queue(self, stop: StopQueue, fence: Fence) -> Encodable:
        record, version = self._queue(stop.queue)
        if record.state != QueueState.RUNNING:
            raise Refused(Reason.BAD_REQUEST, f"queue {record.name} is {record.state}, not RUNNING")
        self._stop_on_hosts(record)
        # The exchange records stay: they are the queue's logs, which `start` re-attaches.
        record.state, record.monitor, record.stat = QueueState.STOPPED, "", ""
        self.registry.update_queue(fence, record, version)
        log.info("queue %s stopped", record.name)
        return Done(f"queue {record.name} stopped")

    def _stop_on_hosts(self, record: QueueRecord) -> None:
        """Every live host stops the queue's processes (a dead host's processes died with it,
        and a host that restarts does not start a STOPPED queue again)."""
        self._on_every_host(record, delete_logs=False)

    def start_queue(self, wanted: StartQueue, fence: Fence) -> Encodable:
        record, _ = self._queue(wanted.queue)
        if record.state != QueueState.STOPPED:
            raise Refused(Reason.BAD_REQUEST, f"queue {record.name} is {record.state}, not STOPPED")
        host = self._find_host(wanted.host) if wanted.host else self._live_host(record.host)
        self._start_on_host(record.name, host, fence)
        self._reattach_exchanges(record.name, host, fence)
        log.info("queue %s started on %s", record.name, host.name)
        return QueuePlaced(host.name, f"queue {record.name} started on {host.name}")

    def _reattach_exchanges(self, queue: str, monitor_host: HostRecord, fence: Fence) -> None:
        """The exchanges recorded on other live hosts start again on their logs, reporting to
        the queue's (new) monitor. One on a dead host stays recorded: that host re-adopts it
        when it starts again; one marked lost (replaced after its host was lost) stays as it is."""
        record, _ = self._queue(queue)
        for exchange in self.registry.exchanges(queue):
            host = self.registry.host(exchange.host)
            if exchange.host == monitor_host.name or host is None or exchange.lost:
                continue
            request = CreateExchangeOnHost(
                queue=queue,
                txid=exchange.txid,
                monitor_port=record.monitor_port,
                stat_port=record.stat_port,
                monitor_address=_address_of(record.monitor),
                exchange_id=exchange.id,
                epoch=record.epoch,
                follower=exchange.follower,
            )
            try:
                reply = self._call_host(host, request, ExchangeOnHost.decode)
            except Refused as error:
                log.warning("queue %s: exchange %s not re-attached: %s", queue, exchange.id, error)
                continue
            self._record_exchanges(queue, host, [reply.exchange], fence)

    def remove_queue(self, unwanted: RemoveQueue, fence: Fence) -> Encodable:
        record, version = self._queue(unwanted.queue)
        if record.state != QueueState.DELETING:
            record.state = QueueState.DELETING
            self.registry.update_queue(fence, record, version)
        self._remove_from_hosts(record)
        self.registry.delete_queue(fence, record.name)
        self._drop_listener(record.name)
        log.info("queue %s removed", record.name)
        return Done(f"queue {record.name} removed")

    def _remove_from_hosts(self, record: QueueRecord) -> None:
        """Every live host stops the queue and deletes its logs and replica copies."""
        self._on_every_host(record, delete_logs=True)

    def _on_every_host(self, record: QueueRecord, *, delete_logs: bool) -> None:
        """Ask every live host to stop the queue. The hosts that run part of it must answer, else
        the request fails and can be retried; the others may still hold files of exchanges
        removed earlier, and are asked on a best-effort basis."""
        running = {record.host} | {x.host for x in self.registry.exchanges(record.name)}
        request = StopQueueOnHost(record.name, delete_logs=delete_logs)
        for host in self.registry.hosts():
            try:
                self._call_host(host, request, Reply.decode)
            except Refused as error:
                if host.name in running:
                    raise
                left = "its files there stay" if delete_logs else "its processes there may run"
                log.warning("queue %s on %s: %s (%s)", record.name, host.name, error, left)

    # --- exchanges -------------------------------------------------------------------------
    def create_exchange(self, wanted: CreateExchange, fence: Fence) -> Encodable:
        """2004; the repair thread calls it too, in place of a lost exchange."""
        record, _ = self._queue(wanted.queue)
        if record.state != QueueState.RUNNING:
            raise Refused(Reason.BAD_REQUEST, f"queue {record.name} is {record.state}")
        txid = wanted.txid
        if wanted.below:
            self._check_below(record.name, wanted.below)
        host = self._exchange_host(wanted, fence)
        reply = self._call_host(
            host,
            CreateExchangeOnHost(
                queue=record.name,
                txid=txid,
                monitor_port=record.monitor_port,
                stat_port=record.stat_port,
                monitor_address=_address_of(record.monitor),
                epoch=record.epoch,
                follower=wanted.follower,
            ),
            ExchangeOnHost.decode,
        )
        self._record_exchanges(record.name, host, [reply.exchange], fence)
        role = "log follower" if reply.exchange.follower else "exchange"
        comment = f"{role} {reply.exchange.exchange_id} on {host.name}"
        return ExchangeCreated(reply.exchange, comment)

    def _check_below(self, queue: str, below: int) -> None:
        """A monitor keeping replicationFactor exchanges asks for one while the queue has fewer
        than `below` recorded on registered hosts (one on a host whose registration is gone
        serves nobody: the repair replaces it after host.loss.grace)."""
        hosts = {h.name for h in self.registry.hosts()}
        live = [x for x in self.registry.exchanges(queue) if not x.lost and x.host in hosts]
        if len(live) >= below:
            raise Refused(
                Reason.BAD_REQUEST,
                f"queue {queue} has {len(live)} exchanges on live hosts, not fewer than {below}",
            )

    def _exchange_host(self, wanted: CreateExchange, fence: Fence) -> HostRecord:
        """RoQ's idempotent exchange create: a recorded transaction's host wins."""
        existing = self.registry.xchange_transaction(wanted.txid)
        if existing is not None:
            return self._live_host(existing["host"])
        host = (
            self._find_host(wanted.host) if wanted.host else self._host_with_free_slot(wanted.queue)
        )
        self.registry.put_xchange_transaction(fence, wanted.txid, {"host": host.name})
        return host

    def _host_with_free_slot(self, queue: str) -> HostRecord:
        """A host with a free exchange slot: first one that runs no exchange of `queue` (its
        exchanges hold each other's copies: on distinct hosts they survive a host's loss),
        then the one with the most free slots, then by name. None free → the provisioner is
        asked and the request refused with no_capacity (RoQ's SimpleScalingPolicy, 2–5)."""
        hosts = self.registry.hosts()
        used = {h.name: 0 for h in hosts}
        runs_queue: set[str] = set()
        for q in self.registry.queues():
            for x in self.registry.exchanges(q.name):
                if x.host in used and not x.lost:
                    used[x.host] += 1
                    if q.name == queue:
                        runs_queue.add(x.host)
        free = [h for h in hosts if used[h.name] < h.max_exchanges]
        if free:
            return min(
                free, key=lambda h: (h.name in runs_queue, used[h.name] - h.max_exchanges, h.name)
            )
        said = self.provision(
            f"queue {queue} needs an exchange and every host runs exchange.max.perhost exchanges"
        )
        raise Refused(Reason.NO_CAPACITY, f"no host has a free exchange slot: {said}")

    def remove_exchange(self, unwanted: RemoveExchange, fence: Fence) -> Encodable:
        queue, exchange_id = unwanted.queue, unwanted.exchange_id
        matches = [x for x in self.registry.exchanges(queue) if x.id == exchange_id]
        if not matches:
            raise Refused(Reason.BAD_REQUEST, f"queue {queue} has no exchange {exchange_id}")
        host = self.registry.host(matches[0].host)
        if host is not None:
            self._call_host(host, RemoveExchangeOnHost(queue, exchange_id), Reply.decode)
        self.registry.delete_exchange(fence, queue, exchange_id)
        return Done(f"exchange {exchange_id} removed")

    # --- autoscaling rules -----------------------------------------------------------------
    def add_rule(self, wanted: AddRules, fence: Fence) -> Encodable:
        name = wanted.queue
        self._queue(name)
        # a version orders a listener's reads and pushes (a stale read never undoes a push)
        previous = self.registry.rules(name) or {}
        version = previous.get("Version", 0)
        version = (version if isinstance(version, int) else 0) + 1
        rules = dataclasses.replace(wanted.rules, version=version)
        self.registry.put_rules(fence, name, rules.fields())
        self._push_rules(name, rules)
        return Done(f"The autoscaling config has been created for the Q {name}")

    def get_rule(self, wanted: GetRules) -> Encodable:
        name = wanted.queue
        stored = self.registry.rules(name)
        if stored is None:
            raise Refused(Reason.UNKNOWN_QUEUE, "ERROR NO auto scaling rule defined for this queue")
        try:
            rules = RuleSet.decode(stored)
        except DecodeError as error:  # checked when stored: ZooKeeper was edited by hand
            raise Refused(Reason.INTERNAL, f"the stored rules of {name}: {error}") from None
        return StoredRules(rules)

    def register_listener(self, wanted: RegisterRulesListener, fence: Fence) -> Encodable:
        """Listeners are stored in ZooKeeper with the queue, so a GCM that takes over after a
        fail-over pushes to them too (and they go with the queue's delete)."""
        name, address = wanted.queue, wanted.address
        if not address.startswith("tcp://"):
            raise Refused(Reason.BAD_REQUEST, "the Address field must be tcp://host:port")
        self._queue(name)
        sockets = self._listeners.setdefault(name, {})
        old = sockets.pop(address, None)
        if old is not None:
            old.close(0)  # the same listener again (a monitor re-registering): a fresh socket
        sockets[address] = self._open_listener(address)  # a bad address is refused here
        stored = self.registry.listeners(name)
        if address not in stored:
            # the oldest registration goes once the queue has the most listeners kept
            self.registry.put_listeners(
                fence, name, [*stored, address][-limits.rules_listeners_max :]
            )
        return Done(f"Registrated on {address}")

    def _open_listener(self, address: str) -> Any:
        sock = open_socket(self.context, Kind.PUSH, sndhwm=limits.listener_hwm, sndtimeo_ms=0)
        try:
            connect(sock, address)
        except TransportError as error:
            sock.close(0)
            raise Refused(Reason.BAD_REQUEST, str(error)) from None
        return sock

    def _listener_sockets(self, queue: str) -> dict[str, Any]:
        """A PUSH socket per stored listener: opened on first use (by a leader that took over,
        too), closed once the listener is no longer stored."""
        wanted = self.registry.listeners(queue)
        sockets = self._listeners.setdefault(queue, {})
        for address in [a for a in sockets if a not in wanted]:
            sockets.pop(address).close(0)
        for address in wanted:
            if address not in sockets:
                try:
                    sockets[address] = self._open_listener(address)
                except Refused as error:
                    log.warning("queue %s: rules listener unusable: %s", queue, error)
        return sockets

    def _push_rules(self, queue: str, rules: RuleSet) -> None:
        update = bsonmsg.encode(RulesUpdate(queue, rules).encode())
        for address, sock in self._listener_sockets(queue).items():
            try:
                if not send_nowait(sock, [update]):
                    raise TransportError("its queue is full")
            except Exception as error:  # a slow or gone listener must not fail the request
                log.warning(
                    "queue %s: rules listener %s did not take the update: %s", queue, address, error
                )

    def _drop_listener(self, queue: str) -> None:
        for sock in self._listeners.pop(queue, {}).values():
            sock.close(0)

    def close(self) -> None:
        """Close every rules listener socket (the context cannot end while one is open)."""
        for queue in list(self._listeners):
            self._drop_listener(queue)

    def cloud_properties(self, _: GetCloudProperties) -> Encodable:
        use = self.settings.cloud.use
        if not use:
            return CloudProperties(use=False)
        return CloudProperties(
            use=True,
            user=self.settings.cloud.user,
            endpoint=self.settings.cloud.endpoint,
            gateway=self.settings.cloud.gateway,
        )


def _address_of(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0]


def _host_info(host: HostRecord) -> HostInfo:
    """A host as 2013 shows it, with the children it reports not running."""
    children = tuple(
        ChildReport(c.queue, c.id, c.role, c.state, c.failures, c.last_exit, c.at)
        for c in host.children
    )
    return HostInfo(host.name, host.address, host.hcm, host.max_exchanges, children)


class _HostWatch:
    """Whether the host a call waits on was restarted or is gone (its registration changed):
    then the call ends at once rather than after hcmTIMEOUT. A host killed while it held the
    request never answers it, and the GCM's one admin loop served nothing else meanwhile: a
    `roq up` whose host was killed right after a queue's floor asked for an exchange answered
    its clients 10 s late (tests/integration/test_resume.py). Reads the registry at most every
    `limits.host_call_check_s`."""

    def __init__(self, registry: Registry, host: HostRecord):
        self.registry, self.host = registry, host
        self.why = ""
        self._next = time.monotonic() + limits.host_call_check_s

    def changed(self) -> bool:
        now = time.monotonic()
        if self.why or now < self._next:
            return bool(self.why)
        self._next = now + limits.host_call_check_s
        try:
            current = self.registry.host(self.host.name)
        except CoordinationError:
            return False  # ZooKeeper away: the call's own timeout decides
        if current is None:
            self.why = "is gone (its registration ended during the call)"
        elif current.pid != self.host.pid:
            self.why = f"was restarted during the call (pid {self.host.pid} → {current.pid})"
        return bool(self.why)
