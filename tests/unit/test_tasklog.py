"""The task store on the monitor's state log (monitor/tasklog.py) against a real state log in a
temporary directory: the ZooKeeper store's semantics (claims, versions, multis' outcomes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roq.coordination.taskstore import Exists, StaleWrite, TaskWrite
from roq.errors import CoordinationError
from roq.log import LogSettings
from roq.log.statelog import Change, StateLog
from roq.monitor.recovery import ORIGIN_KEY, is_complete, origin_record
from roq.monitor.state import StateKeeper
from roq.monitor.tasklog import TaskLog
from roq.testing.cluster import wait_for
from roq.transport import new_context

Sent = list[tuple[Any, Any]]


def _keeper(root: Path, context: Any, sent: Sent, copies: int = 1, epoch: int = 1) -> StateKeeper:
    return StateKeeper(
        context, "q1", epoch, root, LogSettings(), copies, 0, "127.0.0.1",
        deliver=lambda envelope, doc: sent.append((envelope, doc)),
        refusal=lambda why: {"RESULT": 1, "COMMENT": why},
    )  # fmt: skip


@pytest.fixture
def context() -> Iterator[Any]:
    made = new_context()
    yield made
    made.term()


def test_a_claim_is_made_once_and_versions_count_from_zero(tmp_path: Path, context: Any):
    keeper = _keeper(tmp_path, context, [])
    tasks = TaskLog(keeper)
    try:
        assert tasks.claim("t1", b"a") and not tasks.claim("t1", b"b")
        assert tasks.get("t1") == (b"a", 0)
        assert tasks.put("t1", b"c", 0) == 1
        with pytest.raises(StaleWrite):
            tasks.put("t1", b"d", 0)
        assert not tasks.delete("t1", 0) and tasks.delete("t1", 1)
        assert tasks.get("t1") is None and tasks.tasks() == []
    finally:
        keeper.close()


def test_a_commit_tells_each_write_its_outcome_and_makes_the_rest(tmp_path: Path, context: Any):
    keeper = _keeper(tmp_path, context, [])
    tasks = TaskLog(keeper)
    try:
        tasks.claim("old", b"x")
        outcomes = tasks.commit([
            TaskWrite("new", b"1", -1),  # a claim: made
            TaskWrite("old", b"2", -1),  # a claim of an existing id: Exists
            TaskWrite("old", b"3", 5),  # a stale version: StaleWrite
            TaskWrite("old", b"4", 0),  # the version read: made
            TaskWrite("new", None, 0),  # a deletion after its claim in the same turn: made
        ])  # fmt: skip
        assert outcomes[0] == 0 and outcomes[3] == 1 and outcomes[4] == -1
        assert isinstance(outcomes[1], Exists) and isinstance(outcomes[2], StaleWrite)
        assert tasks.get("old") == (b"4", 1) and tasks.get("new") is None
    finally:
        keeper.close()


def _replayed(keeper: StateKeeper) -> StateKeeper:
    """The keeper once the replay of its own log has ended (its loop's pumps take it)."""

    def taken() -> bool:
        keeper.pump(set())
        return keeper.ready

    wait_for(taken, 10, "the replay of its own state log taken", interval_s=0.01)
    return keeper


def test_the_records_and_settings_outlive_the_monitor(tmp_path: Path, context: Any):
    """A monitor restarted in place (same epoch) reopens its state log: the same records,
    the same versions, the settings. It replays the log in a thread of its own: until its loop
    takes the replayed log, a store's read is refused busy (CoordinationError) and its status
    says what it replays."""
    keeper = _keeper(tmp_path, context, [])
    tasks = TaskLog(keeper)
    tasks.claim("t1", b"a")
    tasks.put("t1", b"b", 0)
    tasks.save_settings({"request.retry.max": "5"})
    keeper.close()
    again = _keeper(tmp_path, context, [])
    try:
        assert not again.ready and again.status().recovering == "state.1 on this host"
        with pytest.raises(CoordinationError, match="recovering its state log"):
            TaskLog(again).get("t1")
        tasks = TaskLog(_replayed(again))
        assert again.status().recovering == ""
        assert tasks.get("t1") == (b"b", 1) and tasks.tasks() == ["t1"]
        assert tasks.load_settings() == {"request.retry.max": "5"}
    finally:
        again.close()


def test_a_reply_waits_for_the_copies_and_is_refused_when_they_do_not_come(
    tmp_path: Path, context: Any, monkeypatch: pytest.MonkeyPatch
):
    """With replicationFactor 2 and no exchange to copy to, a reply after a write is held,
    then refused naming the copies missing; a reply with nothing uncommitted goes at once."""
    from roq import limits

    sent: Sent = []
    monkeypatch.setattr(limits, "state_reply_wait_s", 0.0)
    keeper = _keeper(tmp_path, context, sent, copies=2)
    try:
        TaskLog(keeper).claim("t1", b"a")
        keeper.answer(("peer",), {"RESULT": 0})
        assert sent == [] and keeper.pending() == 1
        keeper.pump(set())
        assert keeper.pending() == 0 and keeper.refused_replies == 1
        [(envelope, doc)] = sent
        assert (
            envelope == ("peer",) and "state not copied: 1 of min.insync.copies=2" in doc["COMMENT"]
        )
    finally:
        keeper.close()


def test_a_monitor_under_a_new_epoch_reads_its_predecessors_log_before_it_serves(
    tmp_path: Path, context: Any
):
    """Re-placed on the same host under epoch 2, the monitor refuses (busy) until it has read
    epoch 1's log, then serves the same records and versions from a log of its own."""
    first = _keeper(tmp_path, context, [])
    tasks = TaskLog(first)
    tasks.claim("t1", b"a")
    tasks.put("t1", b"b", 0)
    first.close()
    second = _keeper(tmp_path, context, [], epoch=2)
    try:
        assert not second.ready and second.status().recovering
        with pytest.raises(CoordinationError, match="recovering"):
            TaskLog(second).get("t1")
        wait_for(lambda: second.pump(set()) or second.ready, 10, "recovered")
        assert TaskLog(second).get("t1") == (b"b", 1)
        assert second.status().recovering == "" and (tmp_path / "_state/q1/state.2").is_dir()
    finally:
        second.close()


def test_a_copy_without_its_own_origin_is_not_taken_for_the_state(tmp_path: Path, context: Any):
    """Epoch 2 died while restoring (its log holds epoch 1's snapshot but not its own origin):
    epoch 3 reads epoch 1 instead, whose records are the whole state."""
    first = _keeper(tmp_path, context, [])
    TaskLog(first).claim("t1", b"a")
    first.close()
    partial = StateLog.open(tmp_path / "_state/q1/state.2", LogSettings(), b"x" * 16)
    partial.append([Change(ORIGIN_KEY, origin_record("state.1", ""))])  # the snapshot's
    partial.log.close()
    third = _keeper(tmp_path, context, [], epoch=3)
    try:
        wait_for(lambda: third.pump(set()) or third.ready, 20, "recovered")
        assert TaskLog(third).get("t1") == (b"a", 0)
        assert is_complete(third.state, "state.3")
    finally:
        third.close()
