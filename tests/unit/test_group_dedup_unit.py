"""A consumer group's de-duplication by message id (monitor/groupids.py, docs/guarantees.md,
"De-duplication by message id"): the window of ids and their places, and the group manager
settling duplicates named in a SETTLE's Ids, before anything is handed out, across a restart
on its state log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roq import config
from roq.coordination.session import SharedSession
from roq.errors import DecodeError
from roq.log import LogSettings
from roq.monitor import grouplog
from roq.monitor.groupids import GroupIds
from roq.monitor.grouplog import GroupLog
from roq.monitor.groups import GroupManager
from roq.monitor.state import StateKeeper
from roq.protocol.commands import MonitorCommand
from roq.protocol.messages.groups import (
    ConsumerRequest,
    GroupJoin,
    Joined,
    Lease,
    Settle,
    Settled,
    expand,
    field_ids,
    pack_ids,
    unpack_ids,
)
from roq.transport import new_context

A, B, C = (bytes([n]) * 16 for n in (1, 2, 3))
HERE, THERE = ("x1", 0, -1), ("x2", 0, -1)


def test_an_id_is_a_duplicate_at_another_place_only():
    window = GroupIds(1_000)
    assert window.check(HERE, [(0, A), (1, B)], 0) == []
    assert window.check(HERE, [(0, A), (1, B)], 10) == []  # its slot read again: same message
    assert window.check(THERE, [(4, C), (5, A)], 20) == [5]
    assert window.check(("x1", 0, 3), [(0, B)], 30) == [0]  # another key part is another place
    assert window.check(("x1", 100, -1), [(0, B)], 30) == [0]  # another range too
    assert len(window) == 3
    assert [entry[0] for entry in window.unsaved] == [A.hex(), B.hex(), C.hex()]


def test_an_id_expires_after_the_window_and_a_duplicate_does_not_extend_it():
    window = GroupIds(2_000, bucket_ms=100)
    window.check(HERE, [(0, A)], 0)
    assert window.check(THERE, [(0, A)], 1_500) == [0]  # not refreshed by the duplicate
    assert window.check(THERE, [(0, A)], 2_100) == []  # past the window: taken, there
    assert window.check(HERE, [(0, A)], 2_200) == [0]


def test_past_the_bound_the_oldest_ids_are_forgotten_and_counted():
    window = GroupIds(60_000, ids_max=4, bucket_ms=100)
    window.check(HERE, [(0, A), (1, B)], 0)
    window.check(HERE, [(i, bytes([9, i]) * 8) for i in range(2, 5)], 200)
    assert window.forgotten_early == 2 and len(window) == 3
    assert window.check(THERE, [(0, A)], 300) == []  # forgotten: handed out again


def test_a_restore_takes_the_entries_in_the_window_and_skips_what_is_not_one():
    window = GroupIds(1_000)
    entries: list[Any] = [
        [A.hex(), "x1", 0, -1, 0, 5_000],
        [B.hex(), "x1", 0, -1, 1, 3_000],  # past the window at 5,000
        ["zz" * 16, "x1", 0, -1, 2, 5_000],  # not hex
        [C.hex(), "x1", 0, -1, True, 5_000],  # not an index
        "junk",
    ]
    assert window.restore(entries, 5_100) == 1
    assert window.check(THERE, [(0, A), (1, B), (2, C)], 5_200) == [0]


# a state-log record of a window's ids as the code before log/dedup.py's `ExpiringIds` wrote it
SAVED = (
    b'{"ids":[["01010101010101010101010101010101","x1",0,-1,0,1000],'
    b'["02020202020202020202020202020202","x1",0,-1,1,1000],'
    b'["03030303030303030303030303030303","x2",200,3,7,1250]]}'
)


def test_the_saved_ids_encode_and_read_back_as_before():
    window = GroupIds(60_000, bucket_ms=100)
    window.check(HERE, [(0, A), (1, B)], 1_000)
    assert window.check(("x2", 200, 3), [(7, C), (8, A)], 1_250) == [8]
    assert grouplog._dump({"ids": [list(entry) for entry in window.unsaved]}) == SAVED
    restored = GroupIds(60_000, bucket_ms=100)
    assert restored.restore(grouplog._load((SAVED, 0))["ids"], 2_000) == 3
    assert restored.check(THERE, [(0, A), (1, B), (2, C)], 2_100) == [0, 1, 2]
    assert restored.check(("x2", 200, 3), [(7, C)], 2_100) == [] and not restored.unsaved


def test_ids_travel_packed_and_a_bad_ids_field_is_refused():
    entries = [(0, A), (70_000, B)]
    assert unpack_ids(pack_ids(entries)) == entries
    settle = Settle("g", "c", "x1@0", ids=pack_ids(entries))
    assert Settle.decode(settle.encode()).ids == settle.ids
    assert "Ids" not in Settle("g", "c", "x1@0").encode()
    with pytest.raises(DecodeError):
        field_ids({"Ids": b"\0" * 21})
    with pytest.raises(DecodeError):
        field_ids({"Ids": "text"})
    reply = Settled(duplicates=(3, 5))
    assert Settled.decode(reply.encode()).duplicates == (3, 5)
    assert Joined.decode(Joined(1, 1, 1, False, "q1.g.dlq", dedup=True).encode()).dedup


# --- the group manager on a real state log ----------------------------------------------------
@pytest.fixture
def context() -> Iterator[Any]:
    made = new_context()
    yield made
    made.term()


def _manager(keeper: StateKeeper) -> GroupManager:
    settings = config.MonitorSettings.from_settings(config.load_hcm(None))
    readable = dict.fromkeys(("x1", "x2", "x3"), ("tcp://127.0.0.1:18003", "", 1 << 20))
    zk = SharedSession("127.0.0.1:1", 1000)  # never opened: the state log is the store
    manager = GroupManager("q1", settings, zk, lambda: readable, store=GroupLog(keeper))
    assert isinstance(manager.join(GroupJoin("g", "c1")), Joined)
    for exchange in readable:
        manager.observe(exchange, 100, (100,))
    return manager


def _read(manager: GroupManager, ids: list[tuple[int, bytes]], count: int) -> tuple[str, Settled]:
    """Lease the next slot with a window of 4 given, and send its count and ids as a consumer
    that read it does."""
    lease = manager.lease(ConsumerRequest(MonitorCommand.GROUP_LEASE, "g", "c1", give=4), None)
    assert isinstance(lease, Lease) and lease.window is not None
    assert list(lease.window.given) == [0, 1, 2, 3]
    reply = manager.settle(Settle("g", "c1", lease.slot, count=count, ids=pack_ids(ids)))
    assert isinstance(reply, Settled)
    return lease.slot, reply


def test_a_copy_read_at_another_place_is_settled_not_handed_out_even_after_a_restart(
    tmp_path: Path, context: Any
):
    keeper = StateKeeper(context, "q1", 1, tmp_path, LogSettings(), 1, 0, "127.0.0.1",
                         deliver=lambda *_: None, refusal=lambda why: {"RESULT": 1})  # fmt: skip
    try:
        manager = _manager(keeper)
        slot, first = _read(manager, [(0, A), (1, B)], 3)  # index 2: no id
        assert first.duplicates == () and not first.done
        manager.settle(Settle("g", "c1", slot, acks=(0, 1, 2), sync=True))
        slot, again = _read(manager, [(0, C), (1, A), (3, B)], 4)  # a copy of A and of B
        assert list(expand(again.duplicates)) == [1, 3]
        group = manager.groups["g"]
        assert group.duplicates == 2 and manager.dedup_counts() == {"g": (2, 0)}
        assert group.slots[slot].handed == {0, 2}  # the window's 1 and 3 were taken back
        assert manager.sync()

        restarted = _manager(keeper)  # a successor reads the groups and the window back
        _, after = _read(restarted, [(0, B), (1, C), (2, bytes(16))], 3)
        assert list(expand(after.duplicates)) == [0, 1]
        assert restarted.groups["g"].duplicates == 2
    finally:
        keeper.close()


def test_without_a_window_ids_are_ignored(tmp_path: Path, context: Any):
    keeper = StateKeeper(context, "q1", 1, tmp_path, LogSettings(), 1, 0, "127.0.0.1",
                         deliver=lambda *_: None, refusal=lambda why: {"RESULT": 1})  # fmt: skip
    try:
        manager = _manager(keeper)
        manager.window_ms = 0
        _read(manager, [(0, A)], 1)
        _, again = _read(manager, [(0, A)], 1)
        assert again.duplicates == () and not manager.ids
    finally:
        keeper.close()
