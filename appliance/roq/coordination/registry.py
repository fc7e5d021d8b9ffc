"""Typed reads and writes of the cluster state in ZooKeeper (JSON in each znode).

Writers: a host writes its own ephemeral record (again when one of its children starts or stops
failing: `update_host`) and its own port claims, and one more thing: when
it re-adopts its assignments after a restart and a process could not have its recorded ports, it
moves that process's address in the queue or exchange record by a compare-and-set at the version
it read (`move_queue`, `move_exchange`), so any GCM write in between wins and the host's write
fails. Every other write comes from the leading GCM and goes through a `Fence`: a multi-op
transaction that also checks the version of the epoch znode the leader bumped when it was
elected. A deposed leader's writes fail with NotLeader instead of overwriting its successor's
state.

Every ZooKeeper failure (no answer within the bound, a lost or expired session) leaves here as
CoordinationError, which the GCM answers `busy`: no kazoo exception reaches a caller.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from roq.coordination.groupstore import delete_queue_groups
from roq.coordination.paths import Paths
from roq.coordination.watches import watch_children
from roq.errors import AdminError, CoordinationError, HostRegistered, NameTaken, NotLeader

log = logging.getLogger(__name__)


class QueueState(enum.StrEnum):
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    DELETING = "DELETING"


@dataclass(slots=True)
class QueueRecord:
    name: str
    state: QueueState
    host: str
    monitor: str = ""  # tcp://ip:B (the monitor's base port)
    stat: str = ""  # tcp://ip:S+1 (the KPI stream)
    monitor_port: int = 0
    stat_port: int = 0
    # the assignment epoch of the monitor (protocol/epoch.py): bumped by the leader each time
    # it places the monitor (create, start, re-placement), kept by the host's address move;
    # a record written before epochs existed reads as 0
    epoch: int = 0


@dataclass(slots=True)
class ExchangeRecord:
    id: str
    queue: str
    host: str
    front: str  # tcp://ip:F
    back: str  # tcp://ip:F+1
    port: int = 0
    txid: str = ""
    # its host was lost and the GCM started another exchange in its place: kept so its log's
    # copies stay listed, never started again (gcm/repair.py)
    lost: bool = False
    # a log follower (log.followers): holds copies of the queue's logs, takes no publishers
    follower: bool = False


@dataclass(slots=True)
class ChildState:
    """A monitor or exchange its host does not have running: RESTARTING (its next try at `at`)
    or GIVEN_UP (at `at`). `at` is wall-clock seconds (`time.time()`), for other machines."""

    queue: str
    id: str  # the exchange id, or monitor-<queue>
    role: str  # monitor | exchange
    state: str  # RESTARTING | GIVEN_UP
    failures: int  # in a row
    last_exit: str  # how its last run or start ended: "exit code 73", "killed by signal 9 …"
    at: float


@dataclass(slots=True)
class HostRecord:
    name: str
    address: str
    hcm: str  # tcp://ip:hcm.port
    max_exchanges: int
    pid: int = field(default_factory=os.getpid)
    children: list[ChildState] = field(default_factory=list)  # only those not running


def _host_record(data: dict[str, Any]) -> HostRecord:
    """A record written by an older host has no `children`."""
    children = [ChildState(**child) for child in data.pop("children", [])]
    return HostRecord(**data, children=children)


@dataclass(frozen=True, slots=True)
class GoneRecord:
    """When a leading GCM first saw a host's registration gone, so that the host.loss.grace
    clock survives a GCM fail-over (gcm/repair.py). `since` is wall-clock seconds
    (`time.time()`): the next leader may run on another machine."""

    since: float
    epoch: int  # the version of the epoch znode of the leader that saw it


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of leadership: the epoch znode's version when this GCM was elected."""

    epoch_path: str
    version: int


def _gone_record(data: dict[str, Any]) -> GoneRecord | None:
    since, epoch = data.get("since"), data.get("epoch", 0)
    if not isinstance(since, int | float) or isinstance(since, bool):
        return None
    return GoneRecord(float(since), epoch if isinstance(epoch, int) else 0)


def _dump(record: Any) -> bytes:
    return json.dumps(asdict(record) if not isinstance(record, dict) else record).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CoordinationError(f"unreadable znode data: {error}") from None
    if not isinstance(value, dict):
        raise CoordinationError("znode data is not a JSON object")
    return value


@contextmanager
def _zookeeper(what: str) -> Iterator[None]:
    """Kazoo's failures (`ZooKeeperTimeout` included) as CoordinationError naming `what`."""
    try:
        yield
    except KazooException as error:
        raise CoordinationError(f"{what}: ZooKeeper failed: {error!r}") from None


class Registry:
    """Typed access to one cluster's znodes. Thread-safe as far as kazoo is."""

    def __init__(self, client: Any, paths: Paths):
        self.zk = client
        self.paths = paths

    # --- set-up -----------------------------------------------------------------------
    def ensure_roots(self) -> None:
        with _zookeeper("creating the roots"):
            for path in (*self.paths.roots(), self.paths.election, self.epoch_path):
                self.zk.ensure_path(path)

    @property
    def epoch_path(self) -> str:
        return self.paths.epoch

    def bump_epoch(self) -> Fence:
        """Called by a newly elected leader: every older fence becomes invalid."""
        with _zookeeper("bumping the epoch"):
            self.zk.ensure_path(self.epoch_path)
            stat = self.zk.set(self.epoch_path, b"")
        return Fence(self.epoch_path, stat.version)

    # --- reads ------------------------------------------------------------------------
    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self.zk.get_children(path))
        except NoNodeError:
            return []
        except KazooException as error:  # suspended, expired, no answer within the bound
            raise CoordinationError(f"reading {path} from ZooKeeper: {error!r}") from None

    def _get(self, path: str) -> tuple[dict[str, Any], int] | None:
        try:
            data, stat = self.zk.get(path)
        except NoNodeError:
            return None
        except KazooException as error:
            raise CoordinationError(f"reading {path} from ZooKeeper: {error!r}") from None
        return _load(data), stat.version

    def hosts(self) -> list[HostRecord]:
        records = []
        for name in self._children(self.paths.hosts):
            got = self._get(self.paths.host(name))
            if got is not None:
                records.append(_host_record(got[0]))
        return records

    def host(self, name: str) -> HostRecord | None:
        got = self._get(self.paths.host(name))
        return None if got is None else _host_record(got[0])

    def queue_names(self) -> list[str]:
        return self._children(self.paths.queues)

    def queue(self, name: str) -> tuple[QueueRecord, int] | None:
        got = self._get(self.paths.queue(name))
        if got is None:
            return None
        data, version = got
        data["state"] = QueueState(data["state"])
        return QueueRecord(**data), version

    def queue_incarnation(self, name: str) -> str | None:
        """The queue's znode's creation zxid, hex: a queue deleted and created again under the
        same name has another (what was kept about the old one is not about it). None: no such
        queue."""
        try:
            stat = self.zk.exists(self.paths.queue(name))
        except KazooException as error:
            raise CoordinationError(f"reading {self.paths.queue(name)}: {error!r}") from None
        return None if stat is None else f"{stat.czxid:x}"

    def queues(self) -> list[QueueRecord]:
        found = (self.queue(name) for name in self.queue_names())
        return [item[0] for item in found if item is not None]

    def exchanges(self, queue: str) -> list[ExchangeRecord]:
        records = []
        for exchange_id in self._children(self.paths.exchanges(queue)):
            got = self._get(self.paths.exchange(queue, exchange_id))
            if got is not None:
                records.append(ExchangeRecord(**got[0]))
        return records

    def exchange(self, queue: str, exchange_id: str) -> tuple[ExchangeRecord, int] | None:
        got = self._get(self.paths.exchange(queue, exchange_id))
        return None if got is None else (ExchangeRecord(**got[0]), got[1])

    def leader(self) -> dict[str, Any] | None:
        got = self._get(self.paths.leader)
        return None if got is None else got[0]

    def port_claims(self, host: str) -> dict[int, dict[str, Any]]:
        claims = {}
        for child in self._children(self.paths.ports(host)):
            got = self._get(self.paths.port(host, int(child)))
            if got is not None:
                claims[int(child)] = got[0]
        return claims

    def rules(self, queue: str) -> dict[str, Any] | None:
        got = self._get(self.paths.scaling(queue))
        return None if got is None else got[0]

    def listeners(self, queue: str) -> list[str]:
        """The queue's rules listeners (admin 2008), oldest registration first."""
        got = self._get(self.paths.listeners(queue))
        addresses = [] if got is None else got[0].get("Addresses", [])
        return [a for a in addresses if isinstance(a, str)] if isinstance(addresses, list) else []

    def xchange_transaction(self, txid: str) -> dict[str, Any] | None:
        got = self._get(self.paths.xchange_transaction(txid))
        return None if got is None else got[0]

    def watch_hosts(self, changed: Callable[[], object]) -> None:
        """Call `changed()` (from kazoo's thread: it must only signal) each time a host registers
        or its registration vanishes, from now on; kazoo sets the watch again after a lost
        connection. Raises CoordinationError if ZooKeeper cannot be asked now."""

        def on_hosts(_names: list[str]) -> bool:
            changed()
            return True  # keep watching

        with _zookeeper("watching the hosts"):
            watch_children(self.zk, self.paths.hosts, on_hosts)

    def gone_hosts(self) -> dict[str, GoneRecord]:
        """The hosts a leader recorded gone. A record edited into nonsense is left out (the
        next leader then starts that host's clock again), never an error."""
        found = {}
        for name in self._children(self.paths.gone):
            path = self.paths.gone_host(name)
            with _zookeeper(f"reading {path}"):
                try:
                    data, _ = self.zk.get(path)
                except NoNodeError:
                    continue
            try:
                record = _gone_record(_load(data))
            except CoordinationError:
                record = None
            if record is None:
                log.warning("the gone record %s is unreadable; ignored", path)
            else:
                found[name] = record
        return found

    # --- host-owned writes --------------------------------------------------------------
    def register_host(self, record: HostRecord) -> None:
        """Ephemeral: the host vanishes from the cluster when its session ends. NameTaken if a
        live process holds the name (its record is left untouched)."""
        path = self.paths.host(record.name)
        try:
            self.zk.create(path, _dump(record), ephemeral=True, makepath=True)
        except NodeExistsError:
            raise NameTaken(self._name_taken(record.name)) from None
        except KazooException as error:
            raise CoordinationError(f"registering host {record.name}: {error!r}") from None

    def _session_id(self) -> int | None:
        """This client's ZooKeeper session, or None while it has none (disconnected): then it
        owns no ephemeral node, and no comparison with an owner matches."""
        client_id = self.zk.client_id
        return None if client_id is None else int(client_id[0])

    def update_host(self, record: HostRecord) -> bool:
        """Rewrite the host's record, only if this session created it (False otherwise: the
        session expired, and the host registers again with the record it then has)."""
        path = self.paths.host(record.name)
        try:
            _, stat = self.zk.get(path)
            if stat.ephemeralOwner != self._session_id():
                return False
            self.zk.set(path, _dump(record), version=stat.version)
        except (NoNodeError, BadVersionError):
            return False
        except KazooException as error:
            raise CoordinationError(f"updating host {record.name}: {error!r}") from None
        return True

    def _name_taken(self, name: str) -> str:
        other = self.host(name)
        holder = "a live process" if other is None else f"pid {other.pid} ({other.hcm})"
        return (
            f"host name {name!r} is already registered by {holder}; set another host.name "
            "or stop that host (a crashed one's name is free after zk.session.timeout)"
        )

    def remove_dead_registration(self, name: str, pid: int) -> bool:
        """Delete the record of `name` left by a dead process `pid` (its session not yet expired,
        e.g. restored with ZooKeeper's data): only if it still names that pid and belongs to
        another session. The caller has proved the process dead."""
        path = self.paths.host(name)
        try:
            data, stat = self.zk.get(path)
            if _load(data).get("pid") != pid or stat.ephemeralOwner == self._session_id():
                return False
            self.zk.delete(path, version=stat.version)
        except NoNodeError:
            return True
        except BadVersionError:
            return False
        except KazooException as error:
            raise CoordinationError(
                f"removing the dead registration of {name}: {error!r}"
            ) from None
        return True

    def unregister_host(self, name: str) -> None:
        """Delete the host's record only if this session created it: a process that failed to
        register must not remove the live owner of the name."""
        try:
            _, stat = self.zk.get(self.paths.host(name))
            if stat.ephemeralOwner == self._session_id():
                self.zk.delete(self.paths.host(name), version=stat.version)
        except (NoNodeError, BadVersionError):
            pass
        except KazooException as error:
            raise CoordinationError(f"unregistering host {name}: {error!r}") from None

    def claim_port(self, host: str, port: int, owner: dict[str, Any]) -> bool:
        try:
            self.zk.create(self.paths.port(host, port), _dump(owner), makepath=True)
        except NodeExistsError:
            return False
        except KazooException as error:
            raise CoordinationError(f"claiming port {port} of {host}: {error!r}") from None
        return True

    def release_port(self, host: str, port: int) -> None:
        try:
            self.zk.delete(self.paths.port(host, port))
        except NoNodeError:
            pass
        except KazooException as error:
            raise CoordinationError(f"releasing port {port} of {host}: {error!r}") from None

    def move_queue(self, record: QueueRecord, version: int) -> bool:
        """A re-adopted monitor's new address: written only if the record is still at `version`
        (False if the GCM changed or deleted it meanwhile: the GCM's write wins)."""
        return self._compare_and_set(self.paths.queue(record.name), record, version)

    def move_exchange(self, record: ExchangeRecord, version: int) -> bool:
        """A re-adopted exchange's new address, as `move_queue`."""
        return self._compare_and_set(self.paths.exchange(record.queue, record.id), record, version)

    def _compare_and_set(self, path: str, record: Any, version: int) -> bool:
        try:
            self.zk.set(path, _dump(record), version=version)
        except (BadVersionError, NoNodeError):
            return False
        except KazooException as error:
            raise CoordinationError(f"writing {path}: {error!r}") from None
        return True

    # --- leader-owned writes (fenced) ------------------------------------------------------
    def _commit(self, fence: Fence, ops: list[tuple[str, str, Any]], absent_host: str = "") -> None:
        """One transaction: the fence's check, `ops`, and with `absent_host` the condition
        that this host is not registered: a create of its registration's path, deleted again
        in the same transaction, fails (and with it the whole write) while its ephemeral
        record exists. ZooKeeper has no "check absent" operation; this is one."""
        if absent_host:
            path = self.paths.host(absent_host)
            ops = [*ops, ("create", path, b""), ("delete", path, None)]
        with _zookeeper("starting a transaction"):
            txn = self.zk.transaction()
        txn.check(fence.epoch_path, fence.version)
        for op, path, arg in ops:
            if op == "create":
                txn.create(path, arg)
            elif op == "set":
                txn.set_data(path, arg[0], version=arg[1])
            else:
                txn.delete(path)
        try:
            results = txn.commit()
        except KazooException as error:
            raise CoordinationError(f"ZooKeeper transaction failed: {error}") from None
        if absent_host and isinstance(results[-2], NodeExistsError):
            raise HostRegistered(f"host {absent_host} is registered (again): nothing written")
        self._raise_for(results, fence)

    def _raise_for(self, results: list[Any], fence: Fence) -> None:
        errors = [r for r in results if isinstance(r, Exception)]
        if not errors:
            return
        if isinstance(errors[0], BadVersionError) and isinstance(results[0], Exception):
            raise NotLeader("this GCM is no longer the leader (epoch moved on)")
        real = [e for e in errors if not isinstance(e, RolledBackError)]
        first = real[0] if real else errors[0]
        if isinstance(first, NodeExistsError):
            raise AdminError("already exists")
        if isinstance(first, BadVersionError):
            raise AdminError("changed concurrently; retry")
        if isinstance(first, NoNodeError):
            raise AdminError("does not exist")
        if isinstance(first, NotEmptyError):
            raise AdminError("still has children")
        raise CoordinationError(f"ZooKeeper transaction failed: {first!r}")

    def create_queue(self, fence: Fence, record: QueueRecord) -> None:
        path = self.paths.queue(record.name)
        self._commit(
            fence,
            [("create", path, _dump(record)), ("create", self.paths.exchanges(record.name), b"")],
        )

    def update_queue(
        self,
        fence: Fence,
        record: QueueRecord,
        version: int,
        *,
        absent_host: str = "",
        mark_lost: bool = True,
    ) -> None:
        """With `absent_host` (the gone host whose monitor is re-placed), only while that host
        has no registration, and (`mark_lost`) that host's exchanges of the queue are marked
        lost in the same transaction; HostRegistered otherwise. A host that registers again
        checks its assignments after registering (host/service.py), so either it sees this
        write, monitor and exchanges at once, or this write fails: the two cannot both go on
        for the queue."""
        ops: list[tuple[str, str, Any]] = [
            ("set", self.paths.queue(record.name), (_dump(record), version))
        ]
        if absent_host and mark_lost:
            ops += self._mark_lost_ops(record.name, absent_host)
        self._commit(fence, ops, absent_host)

    def _mark_lost_ops(self, queue: str, host: str) -> list[tuple[str, str, Any]]:
        """Set-ops marking `host`'s exchanges of `queue` lost, each on the version read."""
        ops: list[tuple[str, str, Any]] = []
        for exchange_id in self._children(self.paths.exchanges(queue)):
            got = self.exchange(queue, exchange_id)
            if got is None or got[0].host != host or got[0].lost:
                continue
            got[0].lost = True
            ops.append(("set", self.paths.exchange(queue, exchange_id), (_dump(got[0]), got[1])))
        return ops

    def delete_queue(self, fence: Fence, name: str) -> None:
        ops: list[tuple[str, str, Any]] = []
        for exchange in self._children(self.paths.exchanges(name)):
            ops.append(("delete", self.paths.exchange(name, exchange), None))
        ops.append(("delete", self.paths.exchanges(name), None))
        for extra in (self.paths.scaling(name), self.paths.listeners(name)):
            with _zookeeper(f"reading {extra}"):
                found = self.zk.exists(extra)
            if found:
                ops.append(("delete", extra, None))
        ops.append(("delete", self.paths.queue(name), None))
        self._commit(fence, ops)
        delete_queue_groups(self.zk, self.paths, name)  # its consumer groups' state

    def put_exchange(self, fence: Fence, record: ExchangeRecord) -> None:
        path = self.paths.exchange(record.queue, record.id)
        self._commit(fence, [("create", path, _dump(record))])

    def update_exchange(
        self, fence: Fence, record: ExchangeRecord, *, absent_host: str = ""
    ) -> None:
        """An exchange started again under its id (stop/start) may have new ports. With
        `absent_host` (marking a lost host's exchange lost), only while that host has no
        registration: HostRegistered otherwise (the host kept it; see update_queue)."""
        path = self.paths.exchange(record.queue, record.id)
        self._commit(fence, [("set", path, (_dump(record), -1))], absent_host)

    def delete_exchange(self, fence: Fence, queue: str, exchange_id: str) -> None:
        self._commit(fence, [("delete", self.paths.exchange(queue, exchange_id), None)])

    def put_rules(self, fence: Fence, queue: str, rules: dict[str, Any]) -> None:
        self._put(fence, self.paths.scaling(queue), rules)

    def put_listeners(self, fence: Fence, queue: str, addresses: list[str]) -> None:
        self._put(fence, self.paths.listeners(queue), {"Addresses": addresses})

    def _put(self, fence: Fence, path: str, data: dict[str, Any]) -> None:
        """Create or replace a znode under a queue (the queue's own znode must exist)."""
        with _zookeeper(f"reading {path}"):
            existing = self.zk.exists(path)
        if existing is None:
            self._commit(fence, [("create", path, _dump(data))])
        else:
            self._commit(fence, [("set", path, (_dump(data), existing.version))])

    def put_xchange_transaction(self, fence: Fence, txid: str, data: dict[str, Any]) -> None:
        self._commit(fence, [("create", self.paths.xchange_transaction(txid), _dump(data))])

    def note_gone(self, fence: Fence, host: str, record: GoneRecord) -> GoneRecord:
        """Record `host` gone unless a leader already did; the record that stands is returned
        (an earlier observation keeps its time)."""
        path = self.paths.gone_host(host)
        try:
            self._commit(fence, [("create", path, _dump(record))])
        except AdminError:  # it exists: an earlier term (or this one) saw it first
            got = self._get(path)
            stored = None if got is None else _gone_record(got[0])
            return record if stored is None else stored
        return record

    def forget_gone(self, fence: Fence, host: str) -> None:
        """The host is back, or its work is all re-placed: its clock is dropped."""
        with _zookeeper(f"reading {self.paths.gone_host(host)}"):
            found = self.zk.exists(self.paths.gone_host(host))
        if found is None:
            return
        try:
            self._commit(fence, [("delete", self.paths.gone_host(host), None)])
        except AdminError:
            pass  # deleted meanwhile

    def wipe(self, fence: Fence) -> None:
        """formatDB: delete every persistent root except the election; only a leader does it."""
        self._commit(fence, [])  # proves leadership before anything is deleted
        for root in self.paths.roots():
            for child in self._children(root):
                path = self.paths.child(root, child)
                with _zookeeper(f"deleting {path}"):
                    self.zk.delete(path, recursive=True)
