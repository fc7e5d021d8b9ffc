"""The GCM's admin API on its dispatch table (gcm/management.py), without sockets: each request
is decoded once and its handler given the typed message; RoQ's wording of the unknown command
and the bad request is kept; a refusal raised deep in a handler is its FAIL reply; a request
that changes a queue the repair thread holds is `busy` and changes nothing."""

from __future__ import annotations

from typing import Any

from roq import config
from roq.coordination.registry import Fence, HostRecord, QueueRecord, QueueState
from roq.gcm.management import Management
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import AdminCommand, Reason, Result
from roq.protocol.messages.admin import (
    GetHostByQname,
    GetRules,
    GetTopology,
    MonitorLocation,
    QueueExists,
    StopQueue,
    StoredRules,
    Topology,
)
from roq.protocol.messages.groups import GroupInfo
from roq.protocol.rules import RuleSet

FENCE = Fence("/roq/gcm/epoch", 1)
MONITOR, STAT = "tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101"
RULES = RuleSet("r1", {"AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 60000.0}}, version=3)


class FakeRegistry:
    """What the read-only handlers and a refused stop read; a write is recorded."""

    def __init__(self) -> None:
        self.records = {
            "q1": QueueRecord("q1", QueueState.RUNNING, "h1", MONITOR, STAT, 17000, 17100, 4),
            "q2": QueueRecord("q2", QueueState.STOPPED, "h1"),
        }
        self.writes: list[str] = []

    def hosts(self) -> list[HostRecord]:
        return [HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 4, pid=1)]

    def host(self, name: str) -> HostRecord | None:
        return next((h for h in self.hosts() if h.name == name), None)

    def queues(self) -> list[QueueRecord]:
        return list(self.records.values())

    def queue(self, name: str) -> tuple[QueueRecord, int] | None:
        return (self.records[name], 1) if name in self.records else None

    def rules(self, queue: str) -> dict[str, Any] | None:
        return RULES.fields() if queue == "q1" else None

    def update_queue(self, fence: Fence, record: QueueRecord, version: int, **_: Any) -> None:
        self.writes.append(record.name)


def _management() -> tuple[Management, FakeRegistry]:
    registry = FakeRegistry()
    settings = config.GcmSettings.from_settings(config.load_gcm(None))
    return Management(registry, settings, context=None), registry  # type: ignore[arg-type]


def _ask(management: Management, request: Document) -> Document:
    return management.handle(management.table, request, FENCE)


def test_unknown_commands_and_bad_fields_keep_roqs_wording():
    management, _ = _management()
    unknown = _ask(management, {"CMD": 4242})
    assert unknown["ERROR"] == str(Reason.UNKNOWN_COMMAND)
    assert unknown["COMMENT"] == "INVALID CMD Value 4242"
    missing = _ask(management, {"CMD": int(AdminCommand.CREATE_QUEUE), "Host": "h1"})
    assert missing["ERROR"] == str(Reason.BAD_REQUEST)
    assert missing["COMMENT"] == "the QName field is not present, INVALID REQUEST"


def test_handlers_are_given_typed_messages_and_return_typed_replies():
    management, _ = _management()
    assert management.get_host_by_qname(GetHostByQname("q1")) == MonitorLocation(MONITOR, STAT, 4)
    topology = management.topology(GetTopology())
    assert isinstance(topology, Topology) and [q.name for q in topology.queues] == ["q1", "q2"]
    assert management.get_rule(GetRules("q1")) == StoredRules(RULES)
    assert _ask(management, QueueExists("q1").encode()) == {"RESULT": 0, "COMMENT": "YES"}
    no = _ask(management, QueueExists("q2").encode())
    assert no["ERROR"] == str(Reason.UNKNOWN_QUEUE) and no["COMMENT"] == "NO"


def test_a_refusal_raised_in_a_handler_is_its_fail_reply():
    management, registry = _management()
    stopped = _ask(management, GetHostByQname("q2").encode())
    assert stopped["RESULT"] == Result.FAIL and stopped["ERROR"] == str(Reason.UNKNOWN_QUEUE)
    assert stopped["COMMENT"] == "The Queue q2 is STOPPED."
    unknown = _ask(management, StopQueue("q9").encode())
    assert unknown["ERROR"] == str(Reason.UNKNOWN_QUEUE) and "q9" in unknown["COMMENT"]
    no_group = _ask(management, {"CMD": int(AdminCommand.GET_GROUP), "QName": "q1"})
    assert no_group["ERROR"] == str(Reason.BAD_REQUEST)
    assert no_group["COMMENT"] == "2021 needs a Group"
    assert GroupInfo.decode_admin({"QName": "q1", "Group": "g"}) == GroupInfo("g", "q1")
    assert registry.writes == []


def test_a_change_to_a_queue_the_repair_holds_is_busy_and_changes_nothing():
    management, registry = _management()
    assert management.claims.claim("q1")  # the repair thread re-places q1
    busy = _ask(management, StopQueue("q1").encode())
    assert busy["ERROR"] == str(Reason.BUSY) and "re-placed" in busy["COMMENT"]
    assert registry.writes == []
    management.claims.release("q1")
    stopping = _ask(management, StopQueue("q2").encode())  # not RUNNING: refused, released
    assert stopping["ERROR"] == str(Reason.BAD_REQUEST)
    assert management.claims.claim("q2")  # the refused request let its claim go
