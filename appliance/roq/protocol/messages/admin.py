"""The GCM's admin API (REP on ports.base+3; 2 and 2000 on ports.base too) and its config
broadcast (PUB on ports.base+5). RoQ's MngtController numbers and field names; 2012–2014 are
roq's. docs/protocol.md, "GCM".

A request names its queue by `QName` (checked as a queue name). A reply that carries only a
`COMMENT` (2001, 2002, 2006, 2008, 2011, 2014) is read as `bsonmsg.Reply`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self, TypeVar

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import (
    Document,
    field_bool,
    field_docs,
    field_endpoint,
    field_float,
    field_int,
    field_str,
    field_strs,
)
from roq.protocol.commands import AdminCommand, BroadcastCommand
from roq.protocol.epoch import field_epoch
from roq.protocol.messages.host import ExchangeOnHost, queue_field
from roq.protocol.messages.monitor import EXCHANGES_MAX
from roq.protocol.principals import ALL as ALL_PERMISSIONS
from roq.protocol.rules import RuleSet

QUEUE_STATES: Final = ("CREATING", "RUNNING", "STOPPED", "DELETING")
CHILD_STATES: Final = ("RESTARTING", "GIVEN_UP")
CHILD_ROLES: Final = ("monitor", "exchange")
T = TypeVar("T")
PERMISSION_NAMES: Final = frozenset(p.value for p in ALL_PERMISSIONS)


# --- requests ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Bare:
    """A request with no field but its `CMD`."""

    COMMAND: ClassVar[AdminCommand]

    def encode(self) -> Document:
        return {"CMD": int(self.COMMAND)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


class GetTopology(_Bare):
    """2 INIT_REQ: every host and queue (`Topology`)."""

    COMMAND = AdminCommand.INIT_REQ


class GetCloudProperties(_Bare):
    """2009 (`CloudProperties`)."""

    COMMAND = AdminCommand.GET_CLOUD_PROPERTIES


class ListQueues(_Bare):
    """2012 (`QueueList`)."""

    COMMAND = AdminCommand.LIST_QUEUES


class GetStatus(_Bare):
    """2013 (`ClusterStatus`)."""

    COMMAND = AdminCommand.GET_STATUS


@dataclass(frozen=True)
class _OfQueue:
    """A request with `QName` only."""

    COMMAND: ClassVar[AdminCommand]
    queue: str

    def encode(self) -> Document:
        return {"CMD": int(self.COMMAND), "QName": self.queue}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc))


@dataclass(frozen=True)
class GetHostByQname:
    """2000: where the RUNNING queue's monitor is (`MonitorLocation`). `Need`, optional: the
    permission the asker wants the monitor for (publish, subscribe, consume), so that a refusal
    names the one it lacks rather than `admin`; older clients omit it."""

    queue: str
    need: str = ""  # Need: a permission's name, or "" (any of those that locate a monitor)

    def encode(self) -> Document:
        doc: Document = {"CMD": int(AdminCommand.GET_HOST_BY_QNAME), "QName": self.queue}
        if self.need:
            doc["Need"] = self.need
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), need_field(doc))


def need_field(doc: Mapping[str, Any]) -> str:
    """`Need`: "" or the name of a permission (protocol/principals.py)."""
    need = field_str(doc, "Need", max_chars=16, empty_ok=True, default="")
    if need and need not in PERMISSION_NAMES:
        raise DecodeError(f"the Need field must be one of {', '.join(sorted(PERMISSION_NAMES))}")
    return need


class RemoveQueue(_OfQueue):
    """2001: from any state; its processes stop, its logs and records go."""

    COMMAND = AdminCommand.REMOVE_QUEUE


class StopQueue(_OfQueue):
    """2002: only from RUNNING; the processes stop, the logs stay."""

    COMMAND = AdminCommand.STOP_QUEUE


class GetRules(_OfQueue):
    """2007: the stored rules (a `RuleSet` reply)."""

    COMMAND = AdminCommand.GET_AUTOSCALING_RULE


class CreateQueueAutomatically(_OfQueue):
    """2010: on the host with the most free exchange slots (`QueuePlaced`)."""

    COMMAND = AdminCommand.CREATE_QUEUE_AUTOMATICALLY


class QueueExists(_OfQueue):
    """2011: OK "YES" if RUNNING, else FAIL unknown_queue "NO" (RoQ's semantics)."""

    COMMAND = AdminCommand.QUEUE_EXISTS


@dataclass(frozen=True)
class CreateQueue:
    """2003: on the host named (by name or address) in `Host` (`QueuePlaced`)."""

    queue: str
    host: str

    def encode(self) -> Document:
        return {"CMD": int(AdminCommand.CREATE_QUEUE), "QName": self.queue, "Host": self.host}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), field_str(doc, "Host"))


@dataclass(frozen=True)
class StartQueue:
    """2005: only from STOPPED; on the recorded host unless `Host` names one (`QueuePlaced`)."""

    queue: str
    host: str = ""  # Host, optional: "" = the recorded host

    def encode(self) -> Document:
        doc = {"CMD": int(AdminCommand.START_QUEUE), "QName": self.queue}
        if self.host:
            doc["Host"] = self.host
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), field_str(doc, "Host", empty_ok=True, default=""))


@dataclass(frozen=True)
class CreateExchange:
    """2004: one more exchange for a RUNNING queue, idempotent per `TransactionID`; on `Host`
    if given, else on the host with the most free slots (`ExchangeCreated`). With `Below` (a
    monitor keeping replicationFactor exchanges), only while the queue has fewer live exchanges
    recorded than that: a monitor that has not heard them all yet asks for no extra one. With
    `Follower`, a log follower (log.followers): it holds copies, takes no publishers."""

    queue: str
    txid: str  # TransactionID, 1–128 characters
    host: str = ""  # Host, optional
    below: int = 0  # Below, optional (0: whatever the queue has)
    follower: bool = False  # Follower, optional

    def encode(self) -> Document:
        doc = {"CMD": int(AdminCommand.CREATE_XCHANGE), "QName": self.queue,
               "TransactionID": self.txid}  # fmt: skip
        if self.host:
            doc["Host"] = self.host
        if self.below:
            doc["Below"] = self.below
        if self.follower:
            doc["Follower"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            queue_field(doc),
            field_str(doc, "TransactionID", max_chars=limits.transaction_id_chars_max),
            field_str(doc, "Host", empty_ok=True, default=""),
            field_int(doc, "Below", hi=EXCHANGES_MAX + 1, default=0),
            field_bool(doc, "Follower", default=False),
        )


@dataclass(frozen=True)
class RemoveExchange:
    """2014: stop one exchange of the queue and forget it."""

    queue: str
    exchange_id: str  # ExchangeID

    def encode(self) -> Document:
        return {"CMD": int(AdminCommand.REMOVE_XCHANGE), "QName": self.queue,
                "ExchangeID": self.exchange_id}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            queue_field(doc),
            field_str(doc, "ExchangeID", max_chars=limits.exchange_id_request_chars_max),
        )


@dataclass(frozen=True)
class AddRules:
    """2006: store the queue's autoscaling rules (`QName` beside the rule document's fields)
    and push them to the listeners registered with 2008."""

    queue: str
    rules: RuleSet

    def encode(self) -> Document:
        return self.request(self.queue, self.rules.fields())

    @staticmethod
    def request(queue: str, rules: Mapping[str, Any]) -> Document:
        """The request for a rule document as a user wrote it, unchecked: the GCM's `decode`
        judges it, so that the refusal names the user's field."""
        return {"CMD": int(AdminCommand.ADD_AUTOSCALING_RULE), "QName": queue, **rules}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), RuleSet.decode(doc))


@dataclass(frozen=True)
class RegisterRulesListener:
    """2008: push this queue's rules to the PULL socket at `Address` after each 2006."""

    queue: str
    address: str  # Address: tcp://host:port

    def encode(self) -> Document:
        return {
            "CMD": int(AdminCommand.REGISTER_FOR_AUTOSCALING_RULE_UPDATE),
            "QName": self.queue,
            "Address": self.address,
        }

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(queue_field(doc), field_endpoint(doc, "Address"))


# --- replies -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MonitorLocation:
    """The reply to 2000: `Monitor_host` tcp://ip:B, `Stat_Monitor_host` tcp://ip:S+1, and the
    `Epoch` that monitor acts under (clients refuse messages of older ones)."""

    monitor_host: str
    stat_monitor_host: str
    epoch: int = 0  # Epoch

    def encode(self) -> Document:
        return bsonmsg.ok(
            Monitor_host=self.monitor_host,
            Stat_Monitor_host=self.stat_monitor_host,
            Epoch=self.epoch,
        )

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_endpoint(doc, "Monitor_host"),
            field_endpoint(doc, "Stat_Monitor_host"),
            field_epoch(doc),
        )


@dataclass(frozen=True)
class QueuePlaced:
    """The reply to 2003, 2005 and 2010: the name of the host the queue runs on."""

    host: str
    comment: str = "SUCCESS"

    def encode(self) -> Document:
        return bsonmsg.ok(self.comment, Host=self.host)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_str(doc, "Host"), bsonmsg.Reply.decode(doc).comment)


@dataclass(frozen=True)
class StoredRules:
    """The reply to 2007: the queue's rule document, its fields beside `RESULT` and `COMMENT`."""

    rules: RuleSet

    def encode(self) -> Document:
        return bsonmsg.ok(**self.rules.fields())

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(RuleSet.decode(doc))


# The reply to 2004 is the host's reply to 1009, with the same `Exchange`.
ExchangeCreated = ExchangeOnHost


@dataclass(frozen=True)
class QueueInfo:
    """`Queue`: a queue's record. `Monitor_host` and `Stat_Monitor_host` are "" unless the
    queue is RUNNING; `HostAlive` says whether its recorded host is registered."""

    name: str
    host: str
    state: str  # CREATING, RUNNING, STOPPED or DELETING
    monitor_host: str
    stat_monitor_host: str
    host_alive: bool

    def fields(self) -> Document:
        return {
            "Name": self.name, "Host": self.host, "State": self.state,
            "Monitor_host": self.monitor_host, "Stat_Monitor_host": self.stat_monitor_host,
            "HostAlive": self.host_alive,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        state = field_str(doc, "State", prefix=prefix)
        if state not in QUEUE_STATES:
            raise DecodeError(f"the {prefix}State field must be one of {', '.join(QUEUE_STATES)}")
        return cls(
            field_str(doc, "Name", prefix=prefix),
            field_str(doc, "Host", prefix=prefix),
            state,
            field_endpoint(doc, "Monitor_host", empty_ok=True, prefix=prefix),
            field_endpoint(doc, "Stat_Monitor_host", empty_ok=True, prefix=prefix),
            field_bool(doc, "HostAlive", prefix=prefix),
        )


@dataclass(frozen=True)
class QueueList:
    """The reply to 2012: every queue."""

    queues: tuple[QueueInfo, ...]

    def encode(self) -> Document:
        return bsonmsg.ok(Queues=[q.fields() for q in self.queues])

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_docs(doc, "Queues", QueueInfo.decode, max_items=limits.cluster_queues_max))


@dataclass(frozen=True)
class Topology:
    """The reply to 2: the hosts' addresses and every queue (RoQ answered in Java
    serialization; roq answers BSON)."""

    hosts: tuple[str, ...]  # Hosts: addresses
    queues: tuple[QueueInfo, ...]

    def encode(self) -> Document:
        return bsonmsg.ok(Hosts=list(self.hosts), Queues=[q.fields() for q in self.queues])

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_strs(doc, "Hosts", max_items=limits.cluster_hosts_max),
            field_docs(doc, "Queues", QueueInfo.decode, max_items=limits.cluster_queues_max),
        )


def _one_of(doc: Mapping[str, Any], name: str, values: tuple[str, ...], prefix: str) -> str:
    value = field_str(doc, name, prefix=prefix)
    if value not in values:
        raise DecodeError(f"the {prefix}{name} field must be one of {', '.join(values)}")
    return value


@dataclass(frozen=True)
class ChildReport:
    """A monitor or exchange its host does not have running: `{Queue, Id, Role: "monitor" or
    "exchange", State: "RESTARTING" or "GIVEN_UP", Failures (in a row), LastExit (how its last
    run or start ended), At}`. `At` is wall-clock seconds since the epoch: the next try when
    RESTARTING, the moment the host gave up when GIVEN_UP."""

    queue: str
    child_id: str
    role: str
    state: str
    failures: int
    last_exit: str
    at: float

    def fields(self) -> Document:
        return {"Queue": self.queue, "Id": self.child_id, "Role": self.role, "State": self.state,
                "Failures": self.failures, "LastExit": self.last_exit, "At": self.at}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Queue", prefix=prefix),
            field_str(doc, "Id", prefix=prefix),
            _one_of(doc, "Role", CHILD_ROLES, prefix),
            _one_of(doc, "State", CHILD_STATES, prefix),
            field_int(doc, "Failures", prefix=prefix),
            field_str(doc, "LastExit", empty_ok=True, prefix=prefix),
            field_float(doc, "At", lo=0.0, prefix=prefix),
        )


@dataclass(frozen=True)
class HostInfo:
    """A registered host: `{Name, Address, HCM: tcp://ip:hcm.port, MaxExchanges, Children}`.
    `Children` lists its monitors and exchanges that are not running (`ChildReport`); an older
    GCM leaves it out, read as none."""

    name: str
    address: str
    hcm: str
    max_exchanges: int
    children: tuple[ChildReport, ...] = ()

    def fields(self) -> Document:
        return {"Name": self.name, "Address": self.address, "HCM": self.hcm,
                "MaxExchanges": self.max_exchanges,
                "Children": [c.fields() for c in self.children]}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        children: tuple[ChildReport, ...] = ()
        if doc.get("Children") is not None:
            children = field_docs(doc, "Children", ChildReport.decode, prefix=prefix,
                                  max_items=limits.host_children_reported_max)  # fmt: skip
        return cls(
            field_str(doc, "Name", prefix=prefix),
            field_str(doc, "Address", prefix=prefix),
            field_endpoint(doc, "HCM", prefix=prefix),
            field_int(doc, "MaxExchanges", prefix=prefix),
            children,
        )


@dataclass(frozen=True)
class RecordedExchange:
    """An exchange as the GCM recorded it: `{Id, Host, Front, Back, Lost, Follower}`; `Lost`
    (optional, false when absent): its host was lost and another exchange replaced it;
    `Follower` (optional): a log follower (log.followers), which holds copies only."""

    exchange_id: str
    host: str
    front: str
    back: str
    lost: bool = False
    follower: bool = False

    def fields(self) -> Document:
        doc: Document = {"Id": self.exchange_id, "Host": self.host, "Front": self.front,
                         "Back": self.back, "Lost": self.lost}  # fmt: skip
        if self.follower:
            doc["Follower"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        exchange_id, host, front, back = (
            field_str(doc, name, prefix=prefix) for name in ("Id", "Host", "Front", "Back")
        )
        lost = field_bool(doc, "Lost", default=False, prefix=prefix)
        follower = field_bool(doc, "Follower", default=False, prefix=prefix)
        return cls(exchange_id, host, front, back, lost, follower)


@dataclass(frozen=True)
class GoneHost:
    """A host with work assigned whose registration is gone: `{Name, GoneS, Queues}`; `Queues`
    counts the RUNNING queues that still have a monitor or exchange assigned to it."""

    name: str
    gone_s: float  # GoneS: seconds since the leading GCM saw its registration go
    queues: int

    def fields(self) -> Document:
        return {"Name": self.name, "GoneS": self.gone_s, "Queues": self.queues}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Name", prefix=prefix),
            field_float(doc, "GoneS", prefix=prefix),
            field_int(doc, "Queues", prefix=prefix),
        )


@dataclass(frozen=True)
class PendingRepair:
    """A queue whose re-placement after a host loss is in progress or stuck: `{QName, Comment}`
    (what it waits for, e.g. no host with a free slot)."""

    queue: str
    comment: str

    def fields(self) -> Document:
        return {"QName": self.queue, "Comment": self.comment}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(field_str(doc, "QName", prefix=prefix), field_str(doc, "Comment", prefix=prefix))


@dataclass(frozen=True)
class QueueStatus:
    """A `Queue` with its recorded `Exchanges`."""

    info: QueueInfo
    exchanges: tuple[RecordedExchange, ...]

    def fields(self) -> Document:
        return {**self.info.fields(), "Exchanges": [x.fields() for x in self.exchanges]}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        exchanges = field_docs(doc, "Exchanges", RecordedExchange.decode, prefix=prefix)
        return cls(QueueInfo.decode(doc, prefix), exchanges)


@dataclass(frozen=True)
class ClusterStatus:
    """The reply to 2013: hosts, and queues with their exchanges (what `roq status` shows)."""

    hosts: tuple[HostInfo, ...]
    queues: tuple[QueueStatus, ...]
    gone: tuple[GoneHost, ...] = ()  # GoneHosts (optional)
    repairs: tuple[PendingRepair, ...] = ()  # Repairs (optional)

    def encode(self) -> Document:
        return bsonmsg.ok(
            Hosts=[h.fields() for h in self.hosts],
            Queues=[q.fields() for q in self.queues],
            GoneHosts=[g.fields() for g in self.gone],
            Repairs=[r.fields() for r in self.repairs],
        )

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        hosts_max, queues_max = limits.cluster_hosts_max, limits.cluster_queues_max
        return cls(
            field_docs(doc, "Hosts", HostInfo.decode, max_items=hosts_max),
            field_docs(doc, "Queues", QueueStatus.decode, max_items=queues_max),
            _optional_docs(doc, "GoneHosts", GoneHost.decode, hosts_max),
            _optional_docs(doc, "Repairs", PendingRepair.decode, queues_max),
        )


def _optional_docs(
    doc: Mapping[str, Any], name: str, item: Callable[[Mapping[str, Any], str], T], most: int
) -> tuple[T, ...]:
    """A list of sub-documents that older GCMs do not send: empty when absent."""
    return () if doc.get(name) is None else field_docs(doc, name, item, max_items=most)


@dataclass(frozen=True)
class CloudProperties:
    """The reply to 2009: `cloud.use`, and when true `cloud.user`, `cloud.endpoint` and
    `cloud.gateway` (never `cloud.password`)."""

    use: bool
    user: str = ""
    endpoint: str = ""
    gateway: str = ""

    def encode(self) -> Document:
        if not self.use:
            return bsonmsg.ok("cloud disabled", **{"cloud.use": False})
        return bsonmsg.ok("cloud enabled", **{
            "cloud.use": True, "cloud.user": self.user, "cloud.endpoint": self.endpoint,
            "cloud.gateway": self.gateway,
        })  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        if not field_bool(doc, "cloud.use"):
            return cls(False)
        return cls(True, *(field_str(doc, f"cloud.{name}", empty_ok=True)
                           for name in ("user", "endpoint", "gateway")))  # fmt: skip


# --- ports.base+5: the config broadcast --------------------------------------------------------
@dataclass(frozen=True)
class BroadcastQueue:
    """A queue in the broadcast: `{Name, Host, State: true when RUNNING}`."""

    name: str
    host: str
    running: bool  # State

    def fields(self) -> Document:
        return {"Name": self.name, "Host": self.host, "State": self.running}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Name", prefix=prefix),
            field_str(doc, "Host", prefix=prefix),
            field_bool(doc, "State", prefix=prefix),
        )


@dataclass(frozen=True)
class ConfigBroadcast:
    """1500 MNGT_UPDATE_CONFIG, three frames: `{CMD: 1500, CMD_ID: 1500}`, `{Queues: […]}`,
    `{hosts: [address, …], Hosts: [the same]}`.

    The seed's wiki (seed 000, "The Broadcasted information") names the header `CMD_ID` and the
    host list `hosts`; RoQ's code sent `CMD` and `Hosts`. Both are sent, so a client written from
    either reads what it expects. `Hosts` (RoQ's code, and roq's until 27 Nov 2026) is kept for
    one release and then dropped (docs/protocol.md); `decode` reads `hosts`, or `Hosts` from an
    older GCM."""

    queues: tuple[BroadcastQueue, ...]
    hosts: tuple[str, ...]

    def frames(self) -> list[Document]:
        command = int(BroadcastCommand.MNGT_UPDATE_CONFIG)
        return [
            {"CMD": command, "CMD_ID": command},
            {"Queues": [q.fields() for q in self.queues]},
            {"hosts": list(self.hosts), "Hosts": list(self.hosts)},
        ]

    @classmethod
    def decode(cls, docs: list[Mapping[str, Any]]) -> Self:
        """From the three frames, each decoded by `bson.decode` (only the first has a CMD)."""
        if len(docs) != 3 or bsonmsg.command(docs[0]) != BroadcastCommand.MNGT_UPDATE_CONFIG:
            raise DecodeError("a config broadcast is three frames, the first {CMD: 1500}")
        hosts = "hosts" if docs[2].get("hosts") is not None else "Hosts"
        return cls(
            field_docs(
                docs[1], "Queues", BroadcastQueue.decode, max_items=limits.cluster_queues_max
            ),
            field_strs(docs[2], hosts, max_items=limits.cluster_hosts_max),
        )
