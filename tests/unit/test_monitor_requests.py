"""The monitor's placement socket without sockets: the group (20–26) and task (40–45) routes on
a dispatch table as the monitor builds it (monitor/service.py `_placement_table`), over
in-memory stores. Each request is decoded once into its message class; its typed reply is
stamped in one place (here a stand-in for the monitor's `Epoch`), and so is a held request's
reply sent later; `Written`, `Held` and `Woken` are fields of the typed replies."""

from __future__ import annotations

import time
from typing import Any

import pytest

from roq import config, limits
from roq.coordination.groupstore import Write
from roq.coordination.session import SharedSession
from roq.coordination.taskstore import Exists, Outcome, StaleWrite, TaskWrite
from roq.errors import CoordinationError
from roq.monitor.groups import GroupManager
from roq.monitor.tasks import TaskManager
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Encodable, Refused, Table
from roq.protocol.messages.groups import ConsumerRequest, GroupInfo, GroupJoin, Settle, Tail
from roq.protocol.messages.tasks import TaskConfig, TaskFinish, TaskRef, TaskStart, TaskSubmit
from roq.transport.rpc import Envelope

LOG = "tcp://127.0.0.1:18003"
PEER: Envelope = (b"peer-1", b"")
OTHER: Envelope = (b"peer-2", b"")


class _Commit:
    def __init__(self, writes: list[Write]):
        self.writes = writes

    def ready(self) -> bool:
        return True

    def wait(self, timeout_s: float) -> bool:
        return True

    def versions(self) -> list[int]:
        return [0 if w.record is not None and w.slot else -1 for w in self.writes]


class _GroupStore:
    """GroupStore's surface, in memory; every commit ends at once."""

    def __init__(self, reachable: bool = True):
        self.reachable = reachable
        self.commits: list[list[Write]] = []

    def load(self) -> list[Any]:
        if not self.reachable:
            raise CoordinationError("connection refused")
        return []

    def commit(self, writes: list[Write]) -> _Commit:
        self.commits.append(writes)
        return _Commit(writes)

    def delete_group(self, group: str) -> None:
        pass


class _TaskStore:
    """TaskStore's surface, in memory: records with versions, multis all or none."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[bytes, int]] = {}
        self.multis = 0

    def claim(self, task: str, record: bytes) -> bool:
        if task in self.records:
            return False
        self.records[task] = (record, 0)
        return True

    def get(self, task: str) -> tuple[bytes, int] | None:
        return self.records.get(task)

    def put(self, task: str, record: bytes, version: int) -> int:
        if self.records.get(task, (b"", -2))[1] != version:
            raise StaleWrite(task)
        self.records[task] = (record, version + 1)
        return version + 1

    def delete(self, task: str, version: int = -1) -> bool:
        found = self.records.get(task)
        if found is None or version not in (-1, found[1]):
            return False
        del self.records[task]
        return True

    def commit(self, writes: list[TaskWrite]) -> list[Outcome]:
        self.multis += 1
        out: list[Outcome] = []
        for write in writes:
            found = self.records.get(write.task)
            if write.record is None:
                out.append(-1 if self.delete(write.task, write.version) else StaleWrite("gone"))
            elif write.version < 0:
                out.append(Exists(write.task) if found else 0)
                self.records.setdefault(write.task, (write.record, 0))
            else:
                out.append(self.put(write.task, write.record, write.version))
        return out

    def tasks(self) -> list[str]:
        return list(self.records)

    def load_settings(self) -> dict[str, str]:
        return {}

    def save_settings(self, settings: dict[str, str]) -> None:
        pass


class _Placement:
    """The monitor's group and task routes on one table, stamped as the monitor stamps."""

    def __init__(self, reachable: bool = True):
        settings = config.MonitorSettings.from_settings(config.load_hcm(None))
        zk = SharedSession("127.0.0.1:1", 1000)  # never opened: the stores are replaced
        self.sent: list[tuple[Envelope, Document]] = []
        self.groups = GroupManager("q1", settings, zk, self._readable, self._reply_later)
        self.groups.store = _GroupStore(reachable)
        self.tasks = TaskManager("q1", settings, zk, lambda *_: 1, self._reply_later,
                                 self.groups.wake)  # fmt: skip
        self.tasks.store = _TaskStore()
        self.table: Table[Envelope | None] = Table(
            "monitor q1", {**self.groups.routes(), **self.tasks.routes()}, self._stamp
        )

    @staticmethod
    def _readable() -> dict[str, tuple[str, str, int]]:
        return {"x1": (LOG, "", 1 << 20)}

    @staticmethod
    def _stamp(reply: Document) -> Document:
        return {**reply, "Epoch": 5}

    def _reply_later(self, envelope: Envelope, reply: Encodable) -> None:
        self.sent.append((envelope, self._stamp(reply.encode())))

    def ask(self, request: Document, envelope: Envelope | None = None) -> Document | None:
        return self.table(request, envelope)

    def answer(self, request: Document, envelope: Envelope | None = None) -> Document:
        reply = self.ask(request, envelope)
        assert reply is not None, "answered at once"
        return reply


def _ok(reply: Document | None) -> Document:
    assert reply is not None and reply["RESULT"] == 0, reply
    return reply


def test_a_join_is_answered_once_written_with_its_written_seq_and_the_stamp():
    monitor = _Placement()
    reply = _ok(monitor.ask(GroupJoin("g1", "c1").encode()))
    assert (reply["Written"], reply["Epoch"], reply["DeadLetters"]) == (0, 5, "q1.g1.dlq")
    store = monitor.groups.store
    assert isinstance(store, _GroupStore) and store.commits[0][0].group == "g1"


def test_a_settle_is_answered_before_its_write_and_with_sync_once_written():
    monitor = _Placement()
    _ok(monitor.ask(GroupJoin("g1", "c1").encode()))
    monitor.groups.observe("x1", 2000, (1000,))
    lease = ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", "c1", give=10)
    leased = _ok(monitor.ask(lease.encode(), PEER))
    assert (leased["Slot"], leased["Start"], leased["End"]) == ("x1@0", 0, 1000)
    assert leased["Window"]["Given"] == list(range(10)) and leased["Epoch"] == 5
    first = Settle("g1", "c1", "x1@0", acks=(0, 1), seq=1)
    assert _ok(monitor.ask(first.encode()))["Written"] == 0  # not written yet: answered at once
    second = Settle("g1", "c1", "x1@0", acks=(2,), seq=2, sync=True)
    synced = _ok(monitor.ask(second.encode()))
    assert (synced["Written"], synced["Life"], synced["Epoch"]) == (2, monitor.groups.epoch, 5)
    assert "Held" not in synced


def test_a_held_lease_is_answered_once_with_held_and_woken_and_the_stamp():
    monitor = _Placement()
    _ok(monitor.ask(GroupJoin("g1", "c1").encode()))
    monitor.groups.observe("x1", 0, ())
    wait = ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", "c1", wait_ms=25)
    assert monitor.ask(wait.encode(), PEER) is None  # no slot: held
    at_once = _ok(monitor.ask(wait.encode()))  # without an envelope it cannot be held
    assert at_once["Slot"] == "" and "Held" not in at_once
    assert at_once["Tails"] == [Tail("x1", LOG, 0).fields()]
    monitor.groups.wake("g1")
    monitor.groups.wake("g1")  # nothing held any more: no second answer
    monitor.groups.expire_waits()
    assert len(monitor.sent) == 1
    envelope, reply = monitor.sent[0]
    assert envelope == PEER and _ok(reply)["Slot"] == ""
    assert (reply["Held"], reply["Woken"], reply["Epoch"]) == (True, True, 5)


def test_a_wake_with_no_lease_held_answers_the_next_waiting_lease_at_once_within_one_wait(
    monkeypatch: pytest.MonkeyPatch,
):
    """The worker was between two LEASEs when the requester's wait woke its group: its next
    LEASE is answered at once, as woken, not held a whole wait; once, and only while the wake is
    kept (`work_lease_wake_kept_ms`); a LEASE that finds a slot takes the wake too."""
    monitor = _Placement()
    _ok(monitor.ask(GroupJoin("g1", "c1").encode()))
    monitor.groups.observe("x1", 0, ())
    wait = ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", "c1", wait_ms=25)
    monitor.groups.wake("g1")
    monitor.groups.wake("nobody")  # no such group: nothing kept
    woken = _ok(monitor.ask(wait.encode(), PEER))
    assert (woken["Held"], woken["Woken"], woken["Slot"]) == (True, True, "")
    assert monitor.ask(wait.encode(), PEER) is None  # the wake was taken: held again
    monitor.groups.wake("g1")  # answers the held one
    assert [e for e, _ in monitor.sent] == [PEER]
    now = time.monotonic()
    monitor.groups.wake("g1")  # none held: kept
    monkeypatch.setattr(time, "monotonic", lambda: now + 2 * limits.work_lease_wake_kept_ms / 1000)
    assert monitor.ask(wait.encode(), OTHER) is None  # the kept wake ran out: held
    assert "nobody" not in monitor.groups._wake_due
    monkeypatch.undo()
    monitor.groups.wake("g1")  # one held (OTHER's): answered
    monitor.groups.wake("g1")  # none held: kept ...
    monitor.groups.observe("x1", 2000, (1000,))
    leased = _ok(monitor.ask(wait.encode(), PEER))  # ... taken by a LEASE that finds a slot
    assert leased["Slot"] == "x1@0" and "Woken" not in leased
    assert "g1" not in monitor.groups._wake_due


def test_held_leases_are_refused_once_each_when_the_monitor_is_fenced():
    monitor = _Placement()
    _ok(monitor.ask(GroupJoin("g1", "c1").encode()))
    _ok(monitor.ask(GroupJoin("g1", "c2").encode()))
    for consumer, envelope in (("c1", PEER), ("c2", OTHER)):
        wait = ConsumerRequest(MonitorCommand.GROUP_LEASE, "g1", consumer, wait_ms=25)
        assert monitor.ask(wait.encode(), envelope) is None
    monitor.groups.release_waits(Refused(Reason.FENCED, "monitor q1 is fenced"))
    monitor.groups.release_waits(Refused(Reason.FENCED, "again"))
    assert [e for e, _ in monitor.sent] == [PEER, OTHER]
    assert all(r["ERROR"] == str(Reason.FENCED) and r["Epoch"] == 5 for _, r in monitor.sent)


def test_a_bad_field_and_an_unknown_command_are_refused_by_name_and_stamped():
    monitor = _Placement()
    bad = monitor.answer({"CMD": int(MonitorCommand.GROUP_JOIN), "Consumer": "c1"})
    assert (bad["ERROR"], bad["Epoch"]) == (str(Reason.BAD_REQUEST), 5)
    assert "Group" in bad["COMMENT"]
    bad = monitor.answer({**Settle("g1", "c1", "x1@0").encode(), "Skip": [4, 2]})
    assert bad["ERROR"] == str(Reason.BAD_REQUEST) and "Skip" in bad["COMMENT"]
    unknown = monitor.answer({"CMD": 29})
    assert (unknown["ERROR"], unknown["Epoch"]) == (str(Reason.UNKNOWN_COMMAND), 5)


def test_group_commands_are_busy_until_the_groups_are_read_back():
    monitor = _Placement(reachable=False)
    for request in (GroupJoin("g1", "c1").encode(), GroupInfo().encode()):
        reply = monitor.answer(request)
        assert (reply["ERROR"], reply["Epoch"]) == (str(Reason.BUSY), 5)


def test_a_task_is_answered_once_its_write_is_in_zookeeper():
    monitor = _Placement()
    submit = TaskSubmit("t1", "svc").encode()
    assert monitor.ask(submit, PEER) is None  # staged: its reply waits for the multi
    assert monitor.sent == []
    monitor.tasks.flush()
    [(envelope, reply)] = monitor.sent
    assert envelope == PEER
    assert (_ok(reply)["State"], reply["Created"], reply["Epoch"]) == ("accepted", True, 5)
    # asked without an envelope (nothing can wait for a multi): written at once
    again = _ok(monitor.ask(submit))
    assert (again["State"], again["Created"]) == ("accepted", False)


def test_a_held_task_get_is_answered_once_when_its_result_is_written():
    monitor = _Placement()
    _ok(monitor.ask(TaskSubmit("t1", "svc").encode()))
    assert monitor.ask(TaskRef(MonitorCommand.TASK_GET, "t1", 5000).encode(), OTHER) is None
    run = _ok(monitor.ask(TaskStart("t1", 1, 1, "w1").encode()))
    assert (run["Run"], run["State"]) == (True, "in_progress")
    assert monitor.ask(TaskFinish("t1", 1, True, b"42").encode(), PEER) is None
    monitor.tasks.flush()
    monitor.tasks.expire_waits()
    answered = dict(monitor.sent)
    assert len(monitor.sent) == 2 and set(answered) == {PEER, OTHER}
    assert (answered[PEER]["State"], answered[PEER]["Epoch"]) == ("done", 5)
    assert (answered[OTHER]["Result"], answered[OTHER]["Epoch"]) == (b"42", 5)
    ack = TaskRef(MonitorCommand.TASK_ACK, "t1").encode()
    assert _ok(monitor.ask(ack))["COMMENT"] == "removed"
    assert _ok(monitor.ask(ack))["COMMENT"] == "already removed"


def test_task_settings_are_set_and_read_back_as_text():
    monitor = _Placement()
    reply = _ok(monitor.ask(TaskConfig({"request.send.probes": "7"}).encode()))
    assert reply["Settings"]["request.send.probes"] == "7" and reply["Epoch"] == 5
    refused = monitor.answer(TaskConfig({"request.send.probes": "x"}).encode())
    assert refused["ERROR"] == str(Reason.BAD_REQUEST)


@pytest.mark.parametrize("command", sorted(MonitorCommand.__members__.values()))
def test_every_group_and_task_command_has_a_route(command: MonitorCommand):
    monitor = _Placement()
    group = MonitorCommand.GROUP_JOIN <= command <= MonitorCommand.GROUP_DEAD_LETTERS
    task = MonitorCommand.TASK_SUBMIT <= command <= MonitorCommand.TASK_CONFIG
    assert (command in monitor.table.commands) == (group or task)


def test_single_active_and_priorities_decide_who_leases_and_the_view_shows_them():
    """monitor/selection.py through the placement table: in a single-active group only the
    first consumer leases; a join asking single active of a group made without is refused by
    name; in a group with priorities a lower consumer gets no slot while a higher has room."""
    monitor = _Placement()
    _ok(monitor.ask(GroupJoin("sac", "c1", single_active=True).encode()))
    _ok(monitor.ask(GroupJoin("sac", "c2", priority=5).encode()))  # joined later, but higher
    _ok(monitor.ask(GroupJoin("sac", "c3", priority=5).encode()))  # as high, joined later still
    monitor.groups.observe("x1", 2000, (1000,))
    for consumer in ("c1", "c3"):
        ask = ConsumerRequest(MonitorCommand.GROUP_LEASE, "sac", consumer, give=10)
        assert _ok(monitor.ask(ask.encode()))["Slot"] == ""
    active = ConsumerRequest(MonitorCommand.GROUP_LEASE, "sac", "c2", give=10)
    assert _ok(monitor.ask(active.encode()))["Slot"] == "x1@0"
    [view] = _ok(monitor.ask(GroupInfo("sac").encode()))["Groups"]
    assert view["SingleActive"] is True
    assert {c["Id"]: (c["Priority"], c["Active"]) for c in view["Consumers"]} == {
        "c1": (0, False),
        "c2": (5, True),
        "c3": (5, False),
    }
    _ok(monitor.ask(GroupJoin("plain", "c1").encode()))
    refused = monitor.ask(GroupJoin("plain", "c2", single_active=True).encode())
    assert refused is not None and refused["ERROR"] == str(Reason.BAD_REQUEST)
    assert "single active" in refused["COMMENT"]
    _ok(monitor.ask(GroupJoin("plain", "hi", priority=1, inflight=5).encode()))
    monitor.groups.observe("x1", 2000, (1000,))
    low = ConsumerRequest(MonitorCommand.GROUP_LEASE, "plain", "c1", give=10)
    assert _ok(monitor.ask(low.encode()))["Slot"] == ""
    high = ConsumerRequest(MonitorCommand.GROUP_LEASE, "plain", "hi", give=5)
    assert _ok(monitor.ask(high.encode()))["Window"]["Given"] == [0, 1, 2, 3, 4]
    assert _ok(monitor.ask(low.encode()))["Slot"] == ""  # a window of a slot not counted yet
    _ok(monitor.ask(Settle("plain", "hi", "x1@0", count=100, seq=1).encode()))  # full now
    assert _ok(monitor.ask(low.encode()))["Slot"] == "x1@1000"  # the overflow
