"""Redrive and purge of dead letters in the monitor (monitor/deadletters.py through the group
manager's route 27) over an in-memory store whose commits are all-or-nothing and which a new
manager reads back (a restart): a step's new slots and the letters' removal are one commit, a
step run again changes nothing, a redriven letter is leased as a one-message slot with its
delivery count reset, one whose message retention deleted goes back to the dead letters; and
the CLI's planning and the admin API's refusal (cli/deadletters.py, gcm/access.py)."""

from __future__ import annotations

from typing import Any

import pytest

from roq import config, limits
from roq.cli.deadletters import Summary, plan, source
from roq.coordination.groupstore import Write
from roq.coordination.session import SharedSession
from roq.errors import CoordinationError, DecodeError
from roq.gcm.access import authorize
from roq.monitor.groups import GroupManager
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Table
from roq.protocol.messages.deadletters import Action, DeadLetters, DeadLettersDone, Letter
from roq.protocol.messages.groups import ConsumerRequest, GroupJoin, Settle
from roq.protocol.principals import Permission, Principal

LOG = "tcp://127.0.0.1:18003"


class _Commit:
    def __init__(self, versions: list[int]):
        self._versions = versions

    def ready(self) -> bool:
        return True

    def wait(self, timeout_s: float) -> bool:
        return True

    def versions(self) -> list[int]:
        return self._versions


class _Store:
    """The group store's surface in memory: a commit applies all its writes or none (`fail`)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}
        self.commits: list[list[Write]] = []
        self.fail = False

    def load(self) -> list[Any]:
        return [(g, list(self.slots.get(n, {}).values())) for n, g in self.groups.items()]

    def commit(self, writes: list[Write]) -> _Commit:
        if self.fail:
            raise CoordinationError("the state log's copies did not answer")
        self.commits.append(writes)
        versions = []
        for w in writes:
            slots = self.slots.setdefault(w.group, {})
            if not w.slot:
                self.groups[w.group] = dict(w.record or {})
                versions.append(-1)
            elif w.record is None:
                slots.pop(w.slot, None)
                versions.append(-1)
            else:
                version = slots[w.slot][1] + 1 if w.slot in slots else 0
                slots[w.slot] = (dict(w.record), version)
                versions.append(version)
        return _Commit(versions)

    def delete_group(self, group: str) -> None:
        self.groups.pop(group, None)
        self.slots.pop(group, None)


class _Monitor:
    def __init__(self, store: _Store):
        settings = config.MonitorSettings.from_settings(config.load_hcm(None))
        zk = SharedSession("127.0.0.1:1", 1000)  # never opened: the store is replaced
        self.groups = GroupManager("q1", settings, zk, lambda: {"x1": (LOG, "", 1 << 20)})
        self.groups.store = store  # type: ignore[assignment]
        self.table: Table[Any] = Table("monitor q1", self.groups.routes(), lambda r: r)

    def ask(self, request: Document) -> Document:
        reply = self.table(request, None)
        assert reply is not None
        return reply


def _letters(n: int, first: int = 0) -> tuple[Letter, ...]:
    """Letters of messages 0..n-1 of a batch at offset 1000 of x1, ids `p:<i>`."""
    return tuple(Letter(f"p:{i}", "x1", 1000, i) for i in range(first, first + n))


def _step(monitor: _Monitor, action: Action, letters: tuple[Letter, ...]) -> Document:
    return monitor.ask(DeadLetters("g", action, letters).encode())


def _joined(store: _Store | None = None) -> _Monitor:
    monitor = _Monitor(store or _Store())
    assert monitor.ask(GroupJoin("g", "c1").encode())["RESULT"] == 0
    return monitor


def test_a_redrive_step_is_one_commit_of_its_slots_and_the_letters_removal():
    monitor = _joined()
    store = monitor.groups.store
    assert isinstance(store, _Store)
    before = len(store.commits)
    reply = DeadLettersDone.decode(_step(monitor, Action.REDRIVE, _letters(3)))
    assert (reply.done, reply.already, reply.merged) == (3, 0, 0)
    assert len(store.commits) == before + 1  # one commit, with everything of the step
    written = [w.slot for w in store.commits[-1]]
    assert sorted(written) == ["dlq~1", "x1@1000#1~r", "x1@1000#2~r", "x1@1000~r"]
    chunk = store.slots["g"]["dlq~1"][0]
    assert chunk["dlq"] == {"removed": ["p:0", "p:1", "p:2"], "restored": []}
    checked = DeadLettersDone.decode(_step(monitor, Action.CHECK, _letters(5)))
    assert checked.removed == ("p:0", "p:1", "p:2")


def test_a_step_run_again_after_a_restart_changes_nothing():
    store = _Store()
    monitor = _joined(store)
    _step(monitor, Action.REDRIVE, _letters(3))
    commits = len(store.commits)
    restarted = _Monitor(store)  # a new monitor process reads the group back
    again = DeadLettersDone.decode(_step(restarted, Action.REDRIVE, _letters(4)))
    assert (again.done, again.already) == (1, 3)
    group = restarted.groups.groups["g"]
    assert sorted(s for s in group.slots if s.endswith("~r")) == [
        "x1@1000#1~r", "x1@1000#2~r", "x1@1000#3~r", "x1@1000~r"
    ]  # fmt: skip
    assert len(store.commits) == commits + 1
    assert group.removed == {"p:0", "p:1", "p:2", "p:3"} and group.chunks == 2


def test_a_step_whose_commit_fails_is_stored_whole_by_the_next_commit_or_not_at_all():
    store = _Store()
    monitor = _joined(store)
    store.fail = True
    busy = _step(monitor, Action.REDRIVE, _letters(2))
    assert busy["ERROR"] == str(Reason.BUSY)
    assert "dlq~1" not in store.slots.get("g", {})  # nothing of it stored
    assert (
        _Monitor(store).ask(DeadLetters("g", Action.CHECK, _letters(2)).encode())["Removed"] == []
    )  # a restart now: the letters are still dead letters, no slot was made
    store.fail = False
    monitor.groups._failed_at = 0.0  # past work_write_retry_ms: the next commit may start
    monitor.groups.sync()
    stored = {w.slot for w in store.commits[-1]}
    assert {"dlq~1", "x1@1000~r", "x1@1000#1~r"} <= stored  # the retry: one commit again
    again = DeadLettersDone.decode(_step(monitor, Action.REDRIVE, _letters(2)))
    assert (again.done, again.already) == (0, 2)


def test_a_redriven_letter_is_leased_alone_with_its_delivery_count_reset():
    monitor = _joined()
    _step(monitor, Action.REDRIVE, (Letter("p:9", "x1", 1000, 4),))
    lease = monitor.ask(ConsumerRequest(MonitorCommand.GROUP_LEASE, "g", "c1").encode())
    assert (lease["Slot"], lease["Start"], lease["End"]) == ("x1@1000#4~r", 1000, 1001)
    settled = monitor.ask(Settle("g", "c1", "x1@1000#4~r", count=6, give=(4,)).encode())
    assert (settled["Given"], settled["Deliveries"]) == ([4], [1])
    done = monitor.ask(Settle("g", "c1", "x1@1000#4~r", acks=(4,)).encode())
    assert done["Done"] is True and "x1@1000#4~r" not in monitor.groups.groups["g"].slots


def test_a_letter_whose_message_retention_deleted_goes_back_to_the_dead_letters():
    monitor = _joined()
    _step(monitor, Action.REDRIVE, (Letter("p:9", "x1", 1000, 4),))
    monitor.ask(ConsumerRequest(MonitorCommand.GROUP_LEASE, "g", "c1").encode())
    settled = monitor.ask(Settle("g", "c1", "x1@1000#4~r", count=0).encode())  # read: evicted
    assert settled["Done"] is True
    group = monitor.groups.groups["g"]
    assert "p:9" not in group.removed and not any(s.endswith("~r") for s in group.slots)
    monitor.groups.sync()
    restarted = _Monitor(monitor.groups.store)  # type: ignore[arg-type]
    checked = restarted.ask(DeadLetters("g", Action.CHECK, (Letter("p:9"),)).encode())
    assert checked["Removed"] == []  # the restore step is stored
    assert "p:9" not in restarted.groups.groups["g"].removed


def test_purge_removes_and_two_letters_of_one_message_are_redriven_once():
    monitor = _joined()
    purged = DeadLettersDone.decode(_step(monitor, Action.PURGE, _letters(2)))
    assert purged.done == 2 and not any(s.endswith("~r") for s in monitor.groups.groups["g"].slots)
    twice = (Letter("a:1", "x1", 50, 0), Letter("b:1", "x1", 50, 0))
    merged = DeadLettersDone.decode(_step(monitor, Action.REDRIVE, twice))
    assert (merged.done, merged.merged) == (1, 1)


def test_a_key_ordered_group_is_not_redriven_and_a_bad_step_is_refused_by_name():
    monitor = _joined()
    monitor.groups.groups["g"].parts = 16
    refused = _step(monitor, Action.REDRIVE, _letters(1))
    assert refused["ERROR"] == str(Reason.CONFLICT) and "key-ordered" in refused["COMMENT"]
    assert _step(monitor, Action.PURGE, _letters(1))["RESULT"] == 0
    unknown = monitor.ask(DeadLetters("nope", Action.PURGE, _letters(1)).encode())
    assert unknown["ERROR"] == str(Reason.UNKNOWN_QUEUE) and "nope" in unknown["COMMENT"]
    big = DeadLetters("g", Action.PURGE, _letters(limits.work_dlq_step_max + 1)).encode()
    with pytest.raises(DecodeError, match="Letters"):
        DeadLetters.decode(big)
    with pytest.raises(DecodeError, match="Action"):
        DeadLetters.decode({**big, "Action": "shred"})


def test_the_cli_plans_what_it_can_redrive_and_says_why_it_skips_the_rest():
    good = {"Id": "p:1", "Exchange": "x1", "Offset": 10, "Record": 2}
    assert source(good) == Letter("p:1", "x1", 10, 2)
    assert source({"Id": "p:2", "Error": "not a dead letter (bad)"}) == "not a dead letter"
    assert source({"Id": "p:3", "Offset": 1, "Record": 0}) == "no source exchange"
    chosen = [good, {"Id": "p:2", "Error": "x"}, {"Id": "p:3", "Exchange": "x1"}]
    letters, summary = plan(chosen, Action.REDRIVE)
    assert letters == [Letter("p:1", "x1", 10, 2)]
    assert summary.line(Action.REDRIVE) == (
        "redriven 0, already removed 0, merged 0, skipped 2 "
        "(1 no source position, 1 not a dead letter)"
    )
    purged, _ = plan(chosen, Action.PURGE)
    assert [x.id for x in purged] == ["p:1", "p:2", "p:3"]  # a purge takes any letter
    assert Summary(done=3).line(Action.PURGE).startswith("purged 3,")


def test_a_principal_without_admin_is_refused_naming_the_permission_queue_and_group():
    reader = Principal("reader", b"k" * 32, {"q1": frozenset({Permission.SUBSCRIBE})})
    step = DeadLetters("g", Action.REDRIVE, _letters(1), "q1").encode()
    refused = authorize(reader, step)
    assert refused is not None and refused["ERROR"] == str(Reason.FORBIDDEN)
    assert "'admin'" in refused["COMMENT"] and "'q1'" in refused["COMMENT"]
    assert "group 'g'" in refused["COMMENT"]
    owner = Principal("ops", b"k" * 32, {"q1": frozenset({Permission.ADMIN})})
    assert authorize(owner, step) is None
