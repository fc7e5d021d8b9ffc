"""The message schemas (roq.protocol.messages): every one round-trips through BSON; a missing
required field or a wrongly typed one raises ProtocolError naming it; integers out of range,
strings and lists past their bounds are refused; the field names on the wire are RoQ's."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import bson
import pytest

from roq import limits
from roq.errors import DecodeError, ProtocolError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import (
    AdminCommand,
    ChildCommand,
    HostCommand,
    MonitorCommand,
    Reason,
    Result,
    StatCommand,
)
from roq.protocol.messages import admin, control, groups, host, kpi, monitor, tasks
from roq.protocol.rules import RuleSet

FRONT, BACK = "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001"
IDENTITY = monitor.ExchangeIdentity("q1", "h1-18000-abcdef", FRONT, BACK, 0.2, 1.7e9, True, "h1")
LOAD = monitor.ReportedLoad(
    msgs_rate=10.0, bytes_rate=1000.0, producers=2,
    top=(monitor.ProducerRate("ab" * 16, 6.0, 600.0), monitor.ProducerRate("cd" * 16, 4.0, 400.0)),
    cpu=0.25, rss=40 << 20, load=1.5, bad=0, total_msgs=1000, total_bytes=100_000,
    copies=(monitor.CopyEnd("h2-18004-123456", 4096),), subscriptions=3,
)  # fmt: skip
LISTING = monitor.ExchangeList(
    (monitor.ExchangeEntry("x1", BACK, True),),
    (monitor.DeadLog("x0", (monitor.ReplicaCopy("x1", "tcp://127.0.0.1:18003", 99),)),),
    epoch=3,
)
EPOCH = frozenset({"Epoch"})  # optional everywhere: an older peer's message reads as epoch 0
RULES = RuleSet("r1", {"AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 60000.0}}, version=3)
EVENT = kpi.ScalingEvent("q1", "scale_out", "every exchange above 1 B/s", "default", 1.7e9, 2)
EXCHANGE = host.ExchangeInfo("h1-18000-abcdef", 18000, "tx-1", FRONT, BACK)
QUEUE = admin.QueueInfo(
    "q1", "h1", "RUNNING", "tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101", True
)
SCALING = control.ScalingStatus(
    "default", control.RulesInForce("implicit", 0.0, 0.0, 9e7, 0.0, 0.0, False, 0), 1, 0, "",
    0.0, 1.5, 1, 0, (dataclasses.replace(EVENT, queue=""),),
)  # fmt: skip
MONITOR_STATUS = control.MonitorStatus(
    "q1", 2, 0, SCALING,
    (control.MonitoredExchange("x1", FRONT, BACK, 10.0, -5.0, -1, 0.1, 1 << 20, False, 2, True,
                               ("x2",), (monitor.CopyEnd("x0", 7),), 3.5),),
    LISTING.copies,
    (control.ShortLog("x0", 4096, 1, 2, "x1", (control.CopyProgress("x2", 1024),)),), 3,
    publishers=(control.PublisherStat("ab12", 1000, 250.0, 0.5),), publishers_untracked=2,
)  # fmt: skip
GIVEN_UP = admin.ChildReport("q1", "x1", "exchange", "GIVEN_UP", 11, "exit code 73", 1.7e9)
HOST = admin.HostInfo("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 4, (GIVEN_UP,))
EXCHANGE_STATUS = control.ExchangeStatus(
    "q1", "x1", 10, 0, 2, False, 0, 4096, (control.ReplicaStatus("x2", -1, -1, False),), 4096,
    epoch=3, stale=1,
)  # fmt: skip

Encode = Callable[[Any], Mapping[str, Any]]
Decode = Callable[[Mapping[str, Any]], Any]


def _std(cls: Any) -> tuple[Encode, Decode]:
    return (lambda m: m.encode()), cls.decode


# (name, message, encode, decode, fields that may be left out)
CASES: list[tuple[str, Any, Encode, Decode, frozenset[str]]] = [
    ("report", monitor.ExchangeReport(IDENTITY, LOAD), *_std(monitor.ExchangeReport),
     frozenset({"End", "Cuts", "Keeper", "Follower"})),
    ("report with slot cuts",
     monitor.ExchangeReport(IDENTITY, dataclasses.replace(LOAD, end=9000, cuts=(4000, 8000))),
     *_std(monitor.ExchangeReport), frozenset({"End", "Cuts", "Keeper", "Follower"})),
    ("group join", groups.GroupJoin("g1", "c1", "now", True, b"eu."), *_std(groups.GroupJoin),
     frozenset({"From", "Ordered", "Prefix", "Priority", "Inflight", "SingleActive"})),
    ("group join with a priority, a prefetch, single active",
     groups.GroupJoin("g1", "c1", priority=-5, inflight=10, single_active=True),
     *_std(groups.GroupJoin),
     frozenset({"From", "Ordered", "Prefix", "Priority", "Inflight", "SingleActive"})),
    ("joined", groups.Joined(30000, 1000, 5, False, "q1.g1.dlq", b"eu.", written=3,
                             single_active=True),
     *_std(groups.Joined),
     frozenset({"RESULT", "COMMENT", "Prefix", "SlotMessages", "Written", "SingleActive"})),
    ("no slot", groups.NoSlot((groups.Tail("x1", "tcp://127.0.0.1:18003", 4096),)),
     *_std(groups.NoSlot), frozenset({"RESULT", "COMMENT", "Tails"})),
    ("released, written", groups.Synced("released", 7), *_std(groups.Synced),
     frozenset({"RESULT", "COMMENT"})),
    ("task settings", tasks.TaskSettings({"request.send.probes": "3"}), *_std(tasks.TaskSettings),
     frozenset({"RESULT", "COMMENT"})),
    ("group lease request", groups.ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", "c1"),
     *_std(groups.ConsumerRequest), frozenset({"Slot", "Give", "Seen"})),
    ("lease request with a window and what the consumer saw",
     groups.ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", "c1", give=1000,
                            seen=(groups.Tail("x1", offset=8192),)),
     *_std(groups.ConsumerRequest), frozenset({"Slot", "Give", "Seen"})),
    ("lease with its first window",
     groups.Lease("x1@0", "x1", "tcp://127.0.0.1:18003", "", 0, 4096, -1,
                  window=groups.Settled((0, 1), (1, 1), clipped=2)), *_std(groups.Lease),
     frozenset({"RESULT", "COMMENT", "Settled", "Counted", "Deliveries", "NotBefore",
                "Window"})),
    ("lease", groups.Lease("x1@0", "x1", "tcp://127.0.0.1:18003", "", 0, 4096, 10, (0, 3),
                           (4, 5), (1, 2)), *_std(groups.Lease),
     frozenset({"RESULT", "COMMENT", "Settled", "Counted", "Deliveries", "NotBefore"})),
    ("settle", groups.Settle("g1", "c1", "x1@0", 10, (0, 1), (groups.Nack(2, -1, "busy"),),
                             (3,), (4, 5), (6, 8, 9, 10)), *_std(groups.Settle),
     frozenset({"Count", "Acks", "Nacks", "Dead", "Give", "Skip", "Seq", "Sync", "Release",
                "Next"})),
    ("last settle with the next lease",
     groups.Settle("g1", "c1", "x1@0", acks=(0, 1), seq=7, sync=True, release=True,
                   next_give=1000), *_std(groups.Settle),
     frozenset({"Count", "Acks", "Nacks", "Dead", "Give", "Skip", "Seq", "Sync", "Release",
                "Next"})),
    ("settled", groups.Settled((4,), (1,), (5,), (5,), ("boom",), 1, False, False),
     *_std(groups.Settled), frozenset({"RESULT", "COMMENT", "Given", "Deliveries", "Expired",
                                        "ExpiredCounts", "Written", "Life", "Next"})),
    ("settled, written, with the next lease",
     groups.Settled(done=True, written=7, epoch="abc",
                    next={"RESULT": 0, "COMMENT": "no slot", "Slot": "",
                          "Tails": [groups.Tail("x1", "tcp://127.0.0.1:18003", 4096).fields()]}),
     *_std(groups.Settled), frozenset({"RESULT", "COMMENT", "Given", "Deliveries", "Expired",
                                        "ExpiredCounts", "Written", "Life", "Next"})),
    ("groups", groups.Groups((groups.GroupView("g1", False, 2, 1, 10, 0, 0, 3, 7, 1, "q1.g1.dlq",
                                               (groups.ConsumerView("c1", 1, 3, 7, 0.5),),
                                               b"eu."),)),
     *_std(groups.Groups), frozenset({"RESULT", "COMMENT"})),
    ("group info", groups.GroupInfo("g1", "q1"), *_std(groups.GroupInfo),
     frozenset({"QName", "Group"})),
    ("group delete", groups.GroupDelete("g1", "q1"), *_std(groups.GroupDelete),
     frozenset({"QName"})),
    ("report of an exchange that cannot append",
     monitor.ExchangeReport(IDENTITY, dataclasses.replace(LOAD, refusing="disk full")),
     *_std(monitor.ExchangeReport), frozenset({"End", "Cuts", "Refusing", "Keeper", "Follower"})),
    ("leaving", monitor.ExchangeReport(IDENTITY, None, leaving=True),
     *_std(monitor.ExchangeReport), frozenset({"Keeper", "Follower"})),
    ("leaving with load", monitor.ExchangeReport(IDENTITY, LOAD, leaving=True),
     *_std(monitor.ExchangeReport), frozenset({"End", "Cuts", "Keeper", "Follower"})),
    ("pulse", monitor.ExchangePulse("x1", FRONT, 1.7e9, 0.05), *_std(monitor.ExchangePulse),
     frozenset()),
    ("subscriptions", monitor.ExchangeSubscriptions(IDENTITY, 4),
     *_std(monitor.ExchangeSubscriptions), frozenset({"Keeper", "Follower"})),
    ("publisher init", monitor.PublisherInit("ab" * 16), *_std(monitor.PublisherInit),
     frozenset({"Lost"})),
    ("publisher panic", monitor.PublisherInit("ab" * 16, FRONT, panic=True),
     *_std(monitor.PublisherInit), frozenset()),
    ("placed", monitor.Placed("x1", FRONT, 2), *_std(monitor.Placed),
     frozenset({"RESULT", "COMMENT"}) | EPOCH),
    ("exchange list reply", LISTING, *_std(monitor.ExchangeList),
     frozenset({"RESULT", "COMMENT"}) | EPOCH),
    ("exchange list notice", LISTING, lambda m: m.notice(), monitor.ExchangeList.decode, EPOCH),
    ("relocate", monitor.Relocate("ab" * 16, "x2", FRONT, BACK, 2), *_std(monitor.Relocate),
     EPOCH),
    ("exchange lost", monitor.ExchangeLost(FRONT, dead=True, epoch=2),
     *_std(monitor.ExchangeLost), EPOCH),
    ("exchange to leave: it cannot append",
     monitor.ExchangeLost(FRONT, dead=False, epoch=2, why="disk full"),
     *_std(monitor.ExchangeLost), EPOCH | {"Why"}),
    ("new exchange", monitor.NewExchange(LISTING.exchanges[0], 2), *_std(monitor.NewExchange),
     EPOCH),
    ("rules update", monitor.RulesUpdate("q1", RULES), *_std(monitor.RulesUpdate),
     frozenset({"RESULT", "Version", "AUTOSCALING_XCHANGE"})),
    ("pong", control.Pong("monitor q1", MONITOR_STATUS.encode()), *_std(control.Pong),
     frozenset({"RESULT", "COMMENT"})),
    ("replicas", control.Replicas((control.ReplicaAssignment("x2", "tcp://127.0.0.1:18007"),),
                                  epoch=2),
     *_std(control.Replicas), EPOCH),
    ("replicas with leaders", control.Replicas((), ("x3",), epoch=2), *_std(control.Replicas),
     EPOCH | {"Leaders"}),
    ("replicas with sources",
     control.Replicas((), ("x0",), (control.CopySource("x0", "x3", "tcp://127.0.0.1:18011"),), 2),
     *_std(control.Replicas), EPOCH | {"Leaders", "Sources"}),
    ("monitor status", MONITOR_STATUS, *_std(control.MonitorStatus),
     EPOCH | {"ShortLogs", "Publishers", "PublishersUntracked"}),
    ("exchange status", EXCHANGE_STATUS, *_std(control.ExchangeStatus),
     frozenset({"LogStart", "LogEnd", "Committed", "StaleEpochs"}) | EPOCH),
    ("create queue on host", host.CreateQueueOnHost("q1", 4), *_std(host.CreateQueueOnHost),
     EPOCH),
    ("queue on host", host.QueueOnHost("tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101", 17000,
                                       17100, (EXCHANGE,), 4),
     *_std(host.QueueOnHost), frozenset({"RESULT", "COMMENT"}) | EPOCH),
    ("stop queue on host", host.StopQueueOnHost("q1", delete_logs=False),
     *_std(host.StopQueueOnHost), frozenset()),
    ("remove queue on host", host.StopQueueOnHost("q1", delete_logs=True),
     *_std(host.StopQueueOnHost), frozenset()),
    ("create exchange on host", host.CreateExchangeOnHost("q1", "tx-1", 17000, 17100, "127.0.0.1",
                                                          epoch=4),
     *_std(host.CreateExchangeOnHost), EPOCH),
    ("exchange on host", host.ExchangeOnHost(EXCHANGE, "created"), *_std(host.ExchangeOnHost),
     frozenset({"RESULT"})),
    ("remove exchange on host", host.RemoveExchangeOnHost("q1", "x1"),
     *_std(host.RemoveExchangeOnHost), frozenset()),
    ("exchange count", host.ExchangeCount(2, 4), *_std(host.ExchangeCount),
     frozenset({"RESULT", "COMMENT"})),
    ("host pong", host.HostPong("h1"), *_std(host.HostPong), frozenset({"RESULT", "COMMENT"})),
    ("get host by qname", admin.GetHostByQname("q1"), *_std(admin.GetHostByQname), frozenset()),
    ("remove queue", admin.RemoveQueue("q1"), *_std(admin.RemoveQueue), frozenset()),
    ("stop queue", admin.StopQueue("q1"), *_std(admin.StopQueue), frozenset()),
    ("get rules", admin.GetRules("q1"), *_std(admin.GetRules), frozenset()),
    ("create queue automatically", admin.CreateQueueAutomatically("q1"),
     *_std(admin.CreateQueueAutomatically), frozenset()),
    ("queue exists", admin.QueueExists("q1"), *_std(admin.QueueExists), frozenset()),
    ("create queue", admin.CreateQueue("q1", "h1"), *_std(admin.CreateQueue), frozenset()),
    ("start queue", admin.StartQueue("q1", "h2"), *_std(admin.StartQueue), frozenset({"Host"})),
    ("create exchange", admin.CreateExchange("q1", "tx-1", "h2"), *_std(admin.CreateExchange),
     frozenset({"Host"})),
    ("remove exchange", admin.RemoveExchange("q1", "x1"), *_std(admin.RemoveExchange),
     frozenset()),
    ("add rules", admin.AddRules("q1", RULES), *_std(admin.AddRules),
     frozenset({"Version", "AUTOSCALING_XCHANGE"})),
    ("register rules listener", admin.RegisterRulesListener("q1", "tcp://127.0.0.1:9"),
     *_std(admin.RegisterRulesListener), frozenset()),
    ("monitor location", admin.MonitorLocation("tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101",
                                               5),
     *_std(admin.MonitorLocation), frozenset({"RESULT", "COMMENT"}) | EPOCH),
    ("queue placed", admin.QueuePlaced("h1", "queue q1 created on h1"), *_std(admin.QueuePlaced),
     frozenset()),
    ("queue list", admin.QueueList((QUEUE,)), *_std(admin.QueueList),
     frozenset({"RESULT", "COMMENT"})),
    ("topology", admin.Topology(("127.0.0.1",), (QUEUE,)), *_std(admin.Topology),
     frozenset({"RESULT", "COMMENT"})),
    ("child report", GIVEN_UP, lambda m: m.fields(), admin.ChildReport.decode, frozenset()),
    ("host info", HOST, lambda m: m.fields(), admin.HostInfo.decode, frozenset({"Children"})),
    ("cluster status", admin.ClusterStatus(
        (HOST, admin.HostInfo("h2", "127.0.0.2", "tcp://127.0.0.2:5100", 4)),
        (admin.QueueStatus(QUEUE, (admin.RecordedExchange("x1", "h1", FRONT, BACK),)),)),
     *_std(admin.ClusterStatus), frozenset({"RESULT", "COMMENT", "GoneHosts", "Repairs"})),
    ("cluster status with a lost host", admin.ClusterStatus(
        (admin.HostInfo("h2", "127.0.0.1", "tcp://127.0.0.1:5101", 4),),
        (admin.QueueStatus(QUEUE, (admin.RecordedExchange("x1", "h1", FRONT, BACK, lost=True),)),),
        (admin.GoneHost("h1", 12.5, 1),), (admin.PendingRepair("q1", "no free slot"),)),
     *_std(admin.ClusterStatus), frozenset({"RESULT", "COMMENT", "GoneHosts", "Repairs"})),
    ("gone host", admin.GoneHost("h1", 12.5, 1), lambda m: m.fields(), admin.GoneHost.decode,
     frozenset()),
    ("pending repair", admin.PendingRepair("q1", "no free slot"), lambda m: m.fields(),
     admin.PendingRepair.decode,
     frozenset()),
    ("monitor moved on host", host.MonitorMovedOnHost("q1", 17000, 17300, "127.0.0.1", 6),
     *_std(host.MonitorMovedOnHost), EPOCH),
    ("monitor moved", control.MonitorMoved("tcp://127.0.0.1:17000", "tcp://127.0.0.1:17300", 6),
     *_std(control.MonitorMoved), EPOCH),
    ("cloud on", admin.CloudProperties(True, "u", "https://ec2.example", "gw"),
     *_std(admin.CloudProperties), frozenset({"RESULT", "COMMENT"})),
    ("cloud off", admin.CloudProperties(False), *_std(admin.CloudProperties),
     frozenset({"RESULT", "COMMENT"})),
    ("rule set", RULES, lambda m: m.fields(), RuleSet.decode,
     frozenset({"Version", "AUTOSCALING_XCHANGE"})),
    ("queue kpi", kpi.QueueKpi("q1:17000", 2, -1, 123.0, 4.5, 1.7e9), *_std(kpi.QueueKpi),
     frozenset()),
    ("scaling event", EVENT, *_std(kpi.ScalingEvent), frozenset({"Exchanges"})),
    ("scaling event outcome", kpi.ScalingEvent("q1", "scale_failed", "no", "default", 1.7e9,
                                               action="out", exchange="x9", producer="ab"),
     *_std(kpi.ScalingEvent), frozenset({"Exchange", "Action", "Producer"})),
    ("subscriber kpi", kpi.SubscriberKpi.of_samples("s1", "q1", (10, 0, 1), [-3.0, 5.0, 900.0],
                                                    1.7e9),
     *_std(kpi.SubscriberKpi),
     frozenset({"LatCount", "LatSumUs", "LatMinUs", "LatMaxUs", "LatIdx", "LatCnt"})),
    ("publisher total", kpi.PublisherKpi(StatCommand.PUBLISHER_TOTAL, "ab12", "q1", 5, 1.7e9),
     *_std(kpi.PublisherKpi), frozenset()),
    ("publisher minute", kpi.PublisherKpi(StatCommand.PUBLISHER_MINUTE, "ab12", "q1", 5, 1.7e9,
                                          1.0),
     *_std(kpi.PublisherKpi), frozenset()),
    ("reply ok", Reply(int(Result.OK), "SUCCESS"), *_std(Reply), frozenset()),
    ("reply fail", Reply(int(Result.FAIL), "NO", error=str(Reason.UNKNOWN_QUEUE)), *_std(Reply),
     frozenset()),
    ("reply lead lost", Reply(int(Result.LEAD_LOST), "not the leader", leader=""), *_std(Reply),
     frozenset()),
]  # fmt: skip
IDS = [case[0] for case in CASES]


def _wire(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Through BSON and back, as a receiver gets it."""
    decoded: dict[str, Any] = bson.decode(bson.encode(dict(doc)))
    return decoded


def _wrong(value: Any) -> Any:
    """A value of another type than `value`'s."""
    return 5 if isinstance(value, str) else "x"


@pytest.mark.parametrize(("name", "message", "encode", "decode", "optional"), CASES, ids=IDS)
def test_every_schema_round_trips(name, message, encode, decode, optional):
    assert decode(_wire(encode(message))) == message


@pytest.mark.parametrize(("name", "message", "encode", "decode", "optional"), CASES, ids=IDS)
def test_a_missing_required_field_is_named(name, message, encode, decode, optional):
    doc = _wire(encode(message))
    for field in [f for f in doc if f != "CMD" and f not in optional]:
        broken = {k: v for k, v in doc.items() if k != field}
        with pytest.raises(ProtocolError, match=f"the {field} field"):
            decode(broken)


@pytest.mark.parametrize(("name", "message", "encode", "decode", "optional"), CASES, ids=IDS)
def test_a_wrongly_typed_field_is_named(name, message, encode, decode, optional):
    doc = _wire(encode(message))
    envelope = optional & {"RESULT", "COMMENT"}  # read by bsonmsg.Reply, not by this schema
    for field in [f for f in doc if f != "CMD" and f not in envelope and doc[f] is not None]:
        with pytest.raises(ProtocolError, match=field):
            decode({**doc, field: _wrong(doc[field])})


def test_requests_without_fields_carry_their_command():
    bare = {
        monitor.SubscriberInit(): MonitorCommand.SUBSCRIBER_INIT,
        control.Ping(): ChildCommand.PING,
        control.Shutdown(): ChildCommand.SHUTDOWN,
        host.HostPing(): HostCommand.PING,
        host.InfoExchange(): HostCommand.INFO_EXCHANGE,
        host.HostShutdown(): HostCommand.SHUTDOWN,
        admin.GetTopology(): AdminCommand.INIT_REQ,
        admin.GetCloudProperties(): AdminCommand.GET_CLOUD_PROPERTIES,
        admin.ListQueues(): AdminCommand.LIST_QUEUES,
        admin.GetStatus(): AdminCommand.GET_STATUS,
    }
    for request, command in bare.items():
        assert bsonmsg.decode([bsonmsg.encode(request.encode())]) == {"CMD": int(command)}


def test_multi_frame_messages_round_trip():
    exchange_kpi = kpi.ExchangeKpi("x1", "q1", 1.7e9, 1.02, 1002, 0.0, 100010, 0.0, 0, 14.6, 0.0,
                                   38.9)  # fmt: skip
    frames = [_wire(frame) for frame in kpi.encode_kpi_message(exchange_kpi)]
    assert [f["CMD"] for f in frames] == [20, 21, 22]
    assert kpi.decode_kpi_message(frames) == exchange_kpi
    with pytest.raises(ProtocolError, match="ProcessCPU"):
        kpi.decode_kpi_message(
            [*frames[:2], {k: v for k, v in frames[2].items() if k != "ProcessCPU"}]
        )
    with pytest.raises(ProtocolError, match="frames"):
        kpi.decode_kpi_message([frames[1], frames[0], frames[2]])
    broadcast = admin.ConfigBroadcast((admin.BroadcastQueue("q1", "h1", True),), ("127.0.0.1",))
    frames = [_wire(frame) for frame in broadcast.frames()]
    assert frames[0] == {"CMD": 1500, "CMD_ID": 1500}
    assert frames[2] == {"hosts": ["127.0.0.1"], "Hosts": ["127.0.0.1"]}
    assert admin.ConfigBroadcast.decode(frames) == broadcast
    # an older GCM's broadcast, RoQ's code's shape: {CMD}, …, {Hosts}
    older = [{"CMD": 1500}, frames[1], {"Hosts": ["127.0.0.1"]}]
    assert admin.ConfigBroadcast.decode(older) == broadcast
    with pytest.raises(ProtocolError, match=r"Queues\[0\].State"):
        admin.ConfigBroadcast.decode([frames[0], {"Queues": [{"Name": "q1", "Host": "h1"}]},
                                      frames[2]])  # fmt: skip


@pytest.mark.parametrize(
    ("decode", "doc", "field"),
    [
        (monitor.ExchangeReport.decode, {**monitor.ExchangeReport(IDENTITY, LOAD).encode(),
                                         "Top": [{"ID": "ab", "Msgs": 1.0}]}, r"Top\[0\].Bytes"),
        (monitor.Placed.decode, bsonmsg.ok(Exchange={"Id": "x1"}), "Exchange.Front"),
        (monitor.ExchangeList.decode,
         {**LISTING.notice(), "Copies": [{"Id": "x0", "Replicas": [{"Id": "x1", "Log": FRONT,
                                                                    "End": "9"}]}]},
         r"Copies\[0\].Replicas\[0\].End"),
        (control.MonitorStatus.decode,
         {**MONITOR_STATUS.encode(), "Scaling": {**SCALING.fields(), "Rules": {"Name": "r"}}},
         "Scaling.Rules.HostCPU"),
        (host.ExchangeOnHost.decode, bsonmsg.ok(Exchange={**EXCHANGE.fields(), "Port": "18000"}),
         "Exchange.Port"),
        (admin.ClusterStatus.decode, bsonmsg.ok(Hosts=[], Queues=[{**QUEUE.fields()}]),
         r"Queues\[0\].Exchanges"),
        (admin.ClusterStatus.decode,
         bsonmsg.ok(Hosts=[{**HOST.fields(), "Children": [{**GIVEN_UP.fields(), "At": "now"}]}],
                    Queues=[]),
         r"Hosts\[0\].Children\[0\].At"),
    ],
)  # fmt: skip
def test_a_field_of_a_sub_document_is_named_by_its_path(decode, doc, field):
    with pytest.raises(ProtocolError, match=f"the {field} field"):
        decode(_wire(doc))


@pytest.mark.parametrize(
    ("decode", "doc", "field"),
    [
        # offsets and counts that go back into BSON or into a file position: 0 <= n < 2**63
        (monitor.CopyEnd.decode, {"Id": "x0", "End": -1}, "End"),
        (monitor.CopyEnd.decode, {"Id": "x0", "End": 2**63}, "End"),
        (monitor.ReplicaCopy.decode, {"Id": "x1", "Log": FRONT, "End": -5}, "End"),
        (monitor.ReportedLoad.decode, {**LOAD.fields(), "RSS": 2**63}, "RSS"),
        (monitor.ReportedLoad.decode, {**LOAD.fields(), "TotalBytes": -1}, "TotalBytes"),
        (control.ReplicaStatus.decode, {"Id": "x", "Acked": -2, "Sent": 0, "InSync": True},
         "Acked"),
        (control.ExchangeStatus.decode, {**EXCHANGE_STATUS.encode(), "LogEnd": -1}, "LogEnd"),
        (host.ExchangeInfo.decode, {**EXCHANGE.fields(), "Port": 0}, "Port"),
        (host.ExchangeInfo.decode, {**EXCHANGE.fields(), "Port": 65_536}, "Port"),
        (host.CreateExchangeOnHost.decode,
         {**host.CreateExchangeOnHost("q1", "t", 17000, 17100, "a").encode(), "Stat_port": -1},
         "Stat_port"),
        (kpi.SubscriberKpi.decode,
         {**kpi.SubscriberKpi.of_samples("s", "q1", (1, 0, 0), [5.0], 1.0).encode(),
          "LatIdx": [kpi.BUCKET_MAX + 1]}, r"LatIdx\[0\]"),
        (admin.AddRules.decode, {**admin.AddRules("q1", RULES).encode(), "Version": -1},
         "Version"),
        # numbers that must be finite (a NaN would never compare) and not negative
        (monitor.ExchangeIdentity.decode, {**IDENTITY.fields(), "Period": -0.5}, "Period"),
        (monitor.ExchangeIdentity.decode, {**IDENTITY.fields(), "Started": math.nan}, "Started"),
        (monitor.ExchangePulse.decode,
         {**monitor.ExchangePulse("x", FRONT, 1.0, 0.0).encode(), "LoopAge": math.inf},
         "LoopAge"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_are_refused(decode, doc, field):
    with pytest.raises(ProtocolError, match=field):
        decode(doc)


@pytest.mark.parametrize(
    ("decode", "doc", "field"),
    [
        (monitor.PublisherInit.decode,
         {"CMD": int(MonitorCommand.PUBLISHER_INIT), "ProducerID": "a" * 65}, "ProducerID"),
        (monitor.ReportedLoad.decode,
         {**LOAD.fields(), "Top": [LOAD.top[0].fields()] * 33}, "Top"),
        (monitor.ReportedLoad.decode,
         {**LOAD.fields(),
          "Copies": [LOAD.copies[0].fields()] * (limits.monitor_copies_announced_max + 1)},
         "Copies"),
        (admin.CreateExchange.decode, admin.CreateExchange("q1", "t" * 129).encode(),
         "TransactionID"),
        (admin.CreateQueue.decode, admin.CreateQueue("q/1", "h1").encode(), "queue name"),
        (host.RemoveExchangeOnHost.decode, host.RemoveExchangeOnHost("q1", "x" * 257).encode(),
         "ExchangeID"),
        (admin.QueueInfo.decode, {**QUEUE.fields(), "State": "GONE"}, "State"),
        (admin.ChildReport.decode, {**GIVEN_UP.fields(), "State": "STOPPED"}, "State"),
        (admin.ChildReport.decode, {**GIVEN_UP.fields(), "Role": "gcm"}, "Role"),
        (admin.HostInfo.decode,
         {**HOST.fields(), "Children": [GIVEN_UP.fields()] * (limits.host_children_reported_max
                                                              + 1)}, "Children"),
        (admin.CreateQueue.decode, admin.CreateQueue("q1", "").encode(), "Host"),
    ],
)  # fmt: skip
def test_strings_and_lists_past_their_bounds_are_refused(decode, doc, field):
    with pytest.raises(ProtocolError, match=field):
        decode(_wire(doc))


def test_dispatch_by_command():
    report = monitor.ExchangeReport(IDENTITY, LOAD)
    assert monitor.decode_exchange_message(_wire(report.encode())) == report
    pulse = monitor.ExchangePulse("x1", FRONT, 1.0, 0.5)
    assert monitor.decode_exchange_message(_wire(pulse.encode())) == pulse
    with pytest.raises(DecodeError, match=f"exchange at {FRONT}: the Bytes field"):
        doc = report.encode()
        del doc["Bytes"]
        monitor.decode_exchange_message(doc)
    with pytest.raises(DecodeError, match="unknown report command 4"):
        monitor.decode_exchange_message({**report.encode(), "CMD": 4})
    lost = monitor.ExchangeLost(FRONT, dead=False)
    assert monitor.decode_publisher_notice(_wire(lost.encode())) == lost
    assert monitor.decode_subscriber_notice(_wire(LISTING.notice())) == LISTING
    for decode in (monitor.decode_publisher_notice, monitor.decode_subscriber_notice):
        with pytest.raises(DecodeError, match="unknown"):
            decode({"CMD": 9})
    with pytest.raises(DecodeError, match="CMD 5"):
        kpi.decode_kpi_message([{"CMD": 5}])


def test_the_report_keeps_its_field_names_on_the_wire():
    """docs/protocol.md's table of an exchange report, as RoQ and earlier roq sent it."""
    assert set(monitor.ExchangeReport(IDENTITY, LOAD).encode()) == {
        "CMD", "QName", "Id", "Front", "Back", "Period", "Started", "Log", "Host", "Keeper",
        "Follower", "Msgs", "Bytes", "Producers", "Top", "CPU", "RSS", "Load", "Bad", "TotalMsgs",
        "TotalBytes", "Copies", "Subs", "End", "Cuts",
    }  # fmt: skip
    assert set(monitor.ExchangeReport(IDENTITY, None, leaving=True).encode()) == {
        "CMD", "QName", "Id", "Front", "Back", "Period", "Started", "Log", "Host", "Keeper",
        "Follower",
    }  # fmt: skip
    assert monitor.Relocate("p", "x2", FRONT, BACK, 7).encode() == {
        "CMD": 1, "ProducerID": "p", "Exchange": {"Id": "x2", "Front": FRONT}, "From": BACK,
        "Epoch": 7,
    }  # fmt: skip
    assert monitor.RulesUpdate("q1", RULES).encode() == {
        "CMD": 2006, "RESULT": 0, "QName": "q1", "AUTOSCALING_NAME": "r1",
        "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 60000.0}, "Version": 3,
    }  # fmt: skip


def test_numbers_take_ints_where_floats_are_declared_but_never_bools():
    doc = {**IDENTITY.fields(), "Period": 1, "Started": 2}
    assert monitor.ExchangeIdentity.decode(doc).period_s == 1.0
    with pytest.raises(DecodeError, match="the Period field must be a number"):
        monitor.ExchangeIdentity.decode({**doc, "Period": True})
    with pytest.raises(DecodeError, match="the Subs field must be an integer"):
        monitor.ExchangeSubscriptions.decode({**IDENTITY.fields(), "Subs": 1.0})


def test_a_subscriber_kpi_without_its_histogram_is_taken():
    """The KPI record's contract (docs/analytics.md) makes the histogram optional in a 31."""
    doc = {"CMD": 31, "SubscriberID": "s", "QName": "q1", "TotalReceived": 1, "Lost": 0,
           "Duplicates": 0, "MeanLat": 1.5, "P99Lat": 2.0, "Time": 1.0}  # fmt: skip
    decoded = kpi.decode_kpi_message([doc])
    assert isinstance(decoded, kpi.SubscriberKpi)
    assert (decoded.lat_count, decoded.lat_idx, decoded.lat_cnt) == (0, (), ())
    with pytest.raises(DecodeError, match="same length"):
        kpi.SubscriberKpi.decode({**doc, "LatIdx": [1]})


def test_a_host_info_without_children_is_read_as_none():
    """A GCM of an older version sends no `Children` (its hosts reported none)."""
    doc = {k: v for k, v in HOST.fields().items() if k != "Children"}
    assert admin.HostInfo.decode(_wire(doc)) == dataclasses.replace(HOST, children=())


EPOCH_CASES = [case for case in CASES if "Epoch" in case[4]]


@pytest.mark.parametrize(
    ("name", "message", "encode", "decode", "optional"),
    EPOCH_CASES,
    ids=[case[0] for case in EPOCH_CASES],
)
def test_an_epoch_left_out_by_an_older_peer_reads_as_0_and_a_bad_one_is_refused(
    name, message, encode, decode, optional
):
    """Every message that carries the assignment epoch: absent or null (a peer older than the
    field) decodes as epoch 0; a string, a bool, a float or a negative number is refused
    naming the field, and so is one past BSON's int64."""
    doc = _wire(encode(message))
    assert doc["Epoch"] > 0
    for absent in ({k: v for k, v in doc.items() if k != "Epoch"}, {**doc, "Epoch": None}):
        decoded = decode(absent)
        assert decoded.epoch == 0 and decoded == dataclasses.replace(message, epoch=0)
    for bad in ("3", True, 3.0, -1, 2**63):
        with pytest.raises(DecodeError, match="the Epoch field"):
            decode({**doc, "Epoch": bad})


def test_refusing_left_out_by_an_older_peer_reads_as_taking_appends():
    """`Refusing` (an exchange whose log refuses appends) is optional in a report and in the
    monitor's status: absent, the exchange takes appends; a non-string is refused."""
    report = monitor.ExchangeReport(IDENTITY, dataclasses.replace(LOAD, refusing="disk full"))
    doc = {k: v for k, v in report.encode().items() if k != "Refusing"}
    decoded = monitor.ExchangeReport.decode(_wire(doc))
    assert decoded.load is not None and decoded.load.refusing == ""
    entry = dataclasses.replace(MONITOR_STATUS.exchanges[0], placeable=False, refusing="full")
    assert control.MonitoredExchange.decode(_wire(entry.fields())) == entry
    older = {k: v for k, v in entry.fields().items() if k != "Refusing"}
    assert control.MonitoredExchange.decode(_wire(older)).refusing == ""
    with pytest.raises(DecodeError, match="the Refusing field"):
        control.MonitoredExchange.decode({**entry.fields(), "Refusing": 5})
    lost = monitor.ExchangeLost(FRONT, dead=False, why="full")
    assert "Why" not in monitor.ExchangeLost(FRONT, dead=False).encode()
    assert monitor.decode_publisher_notice(_wire(lost.encode())) == lost


@pytest.mark.parametrize(
    "skip",
    [[0], [5, 3], [0, 4, 2, 6], [0, 4, 4, 6], [0, 1_000_001]],
    ids=["odd", "empty range", "overlapping", "touching", "past a slot"],
)
def test_a_settle_whose_skip_ranges_are_not_ascending_and_disjoint_is_refused(skip):
    doc = groups.Settle("g1", "c1", "x1@0").encode() | {"Skip": skip}
    with pytest.raises(DecodeError, match="Skip"):
        groups.Settle.decode(doc)


@pytest.mark.parametrize("prefix", ["eu.", b"k" * (limits.key_bytes_max + 1), 3])
def test_a_key_prefix_must_be_binary_and_no_longer_than_a_key(prefix):
    with pytest.raises(DecodeError, match="Prefix"):
        groups.GroupJoin.decode(groups.GroupJoin("g1", "c1").encode() | {"Prefix": prefix})
