"""The HTTP gateway's topics as a monitor keeps them (monitor/topics.py), on a real state log:
the mq rules (owner, taken, limits, next message), heads and positions that survive a reopen
of the log, and refusals by reason (a rule broken: conflict; recovering: busy)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from roq.errors import CoordinationError
from roq.log import FlushPolicy, LogSettings
from roq.log.statelog import Change, StateLog
from roq.monitor.topics import TopicManager
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Table
from roq.protocol.messages.topics import NOBODY, Caller, TopicAsk, TopicState

PID = bytes(range(16))
SETTINGS = LogSettings(max_file_size=4096, flush=FlushPolicy("os"), memory_bytes=0)


class _Keeper:
    """The two calls a store makes of the monitor's StateKeeper, on a real state log; None:
    recovering (as the keeper refuses then)."""

    def __init__(self, state: StateLog | None):
        self.state = state

    def store_state(self) -> StateLog:
        if self.state is None:
            raise CoordinationError("queue http-0: the monitor is recovering its state log")
        return self.state

    def store_write(self, changes: Sequence[Change]) -> int:
        self.store_state().append(changes)
        return self.store_state().end_offset


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateLog]:
    with StateLog.open(tmp_path / "state", SETTINGS, PID) as opened:
        yield opened


def _table(keeper: _Keeper | None) -> Table[None]:
    manager = TopicManager("http-0", keeper)  # type: ignore[arg-type]
    return Table("monitor http-0", manager.routes())


def _ask(table: Table[None], command: MonitorCommand, topic: str = "", name: str = "",
         caller: Caller = NOBODY, **fields: int) -> dict:  # fmt: skip
    reply = table(TopicAsk(command, topic, name, caller=caller, **fields).encode(), None)
    assert reply is not None
    return reply


def _ok(reply: dict) -> TopicState:
    assert reply["RESULT"] == 0, reply
    return TopicState.decode(reply)


def _refused(reply: dict, reason: Reason, text: str) -> None:
    assert (reply["ERROR"], text in reply["COMMENT"]) == (str(reason), True), reply


def test_the_mq_rules_heads_and_positions(state: StateLog):
    table = _table(_Keeper(state))
    assert _ok(_ask(table, MonitorCommand.TOPIC_REGISTER, "news", "alice", limit=2)).topics == 1
    _refused(_ask(table, MonitorCommand.TOPIC_REGISTER, "news", "bob", limit=2),
             Reason.CONFLICT, "'news' is taken")  # fmt: skip
    _refused(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "bob", count=1),
             Reason.CONFLICT, "not the owner")  # fmt: skip
    _refused(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "nope", "carol", limit=5),
             Reason.CONFLICT, "unknown topic 'nope'")  # fmt: skip
    published = _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "alice", count=3))
    assert (published.first, published.head) == (1, 3)
    assert _ok(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "news", "carol", limit=1)).next == 4
    _refused(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "news", "dave", limit=1),
             Reason.CONFLICT, "1 subscribers: the limit")  # fmt: skip
    assert _ok(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "news", "carol", limit=1)).next == 4
    _refused(_ask(table, MonitorCommand.TOPIC_ACK, "news", "carol", index=4),
             Reason.CONFLICT, "not published yet")  # fmt: skip
    assert _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "alice", count=1)).first == 4
    _refused(_ask(table, MonitorCommand.TOPIC_ACK, "news", "carol", index=5),
             Reason.CONFLICT, "not the next of 'carol' (4)")  # fmt: skip
    assert _ok(_ask(table, MonitorCommand.TOPIC_ACK, "news", "carol", index=4)).next == 5
    position = _ok(_ask(table, MonitorCommand.TOPIC_POSITION, "news", "carol"))
    assert (position.next, position.head) == (5, 4)
    _refused(_ask(table, MonitorCommand.TOPIC_POSITION, "news", "erin"),
             Reason.CONFLICT, "'erin' is not subscribed")  # fmt: skip
    _ok(_ask(table, MonitorCommand.TOPIC_REGISTER, "sport", "alice", limit=2))
    _refused(_ask(table, MonitorCommand.TOPIC_REGISTER, "weather", "alice", limit=2),
             Reason.CONFLICT, "too many topics")  # fmt: skip
    assert _ok(_ask(table, MonitorCommand.TOPIC_COUNT)).topics == 2


def test_names_of_any_kind_and_length_are_kept_apart(state: StateLog):
    """Keys are hashes of the names: long names, '/' and unicode make no clash."""
    table = _table(_Keeper(state))
    names = ["a/b", "a", "b", "é" * 1000, "x" * 999 + "/"]
    for name in names:
        _ok(_ask(table, MonitorCommand.TOPIC_REGISTER, name, name, limit=10))
        _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, name, name, count=len(name) % 7 + 1))
    for name in names:
        assert _ok(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, name, name, limit=1)).next == (
            len(name) % 7 + 2
        )


def test_the_state_survives_a_reopen_of_the_log(tmp_path: Path):
    with StateLog.open(tmp_path / "state", SETTINGS, PID) as state:
        table = _table(_Keeper(state))
        _ok(_ask(table, MonitorCommand.TOPIC_REGISTER, "news", "alice", limit=5))
        _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "alice", count=7))
        _ok(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "news", "carol", limit=5))
        _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "alice", count=2))
        _ok(_ask(table, MonitorCommand.TOPIC_ACK, "news", "carol", index=8))
    with StateLog.open(tmp_path / "state", SETTINGS, PID) as state:
        table = _table(_Keeper(state))
        position = _ok(_ask(table, MonitorCommand.TOPIC_POSITION, "news", "carol"))
        assert (position.next, position.head) == (9, 9)
        assert _ok(_ask(table, MonitorCommand.TOPIC_COUNT)).topics == 1


def test_refused_busy_while_recovering_and_bad_requests_by_field():
    table = _table(_Keeper(None))
    _refused(_ask(table, MonitorCommand.TOPIC_COUNT), Reason.BUSY, "recovering")
    no_log = _table(None)
    _refused(_ask(no_log, MonitorCommand.TOPIC_COUNT), Reason.BAD_REQUEST, "delivery.state=log")
    bad = table({"CMD": int(MonitorCommand.TOPIC_PUBLISH), "Topic": "t", "Name": "o"}, None)
    assert bad is not None and bad["ERROR"] == str(Reason.BAD_REQUEST) and "Count" in bad["COMMENT"]
    long = {"CMD": int(MonitorCommand.TOPIC_ACK), "Topic": "t" * 1001, "Name": "o", "Index": 1}
    refused = table(long, None)
    assert refused is not None and "Topic" in refused["COMMENT"]


def test_an_import_writes_what_is_missing_and_keeps_what_is_here(state: StateLog):
    table = _table(_Keeper(state))
    imported = _ok(_ask(table, MonitorCommand.TOPIC_IMPORT, "news", "alice", index=7))
    assert (imported.head, imported.topics) == (7, 1)
    follower = TopicAsk(MonitorCommand.TOPIC_IMPORT, "news", "alice", index=5, subscriber="bob")
    assert _ok(table(follower.encode(), None)).next == 5  # type: ignore[arg-type]
    assert _ok(_ask(table, MonitorCommand.TOPIC_PUBLISH, "news", "alice", count=1)).first == 8
    assert _ok(_ask(table, MonitorCommand.TOPIC_ACK, "news", "bob", index=5)).next == 6
    # imported again (a gateway killed half way, or two at once): nothing changes
    assert _ok(_ask(table, MonitorCommand.TOPIC_IMPORT, "news", "alice", index=7)).head == 8
    assert _ok(table(follower.encode(), None)).next == 6  # type: ignore[arg-type]
    assert _ok(_ask(table, MonitorCommand.TOPIC_COUNT)).topics == 1
    _refused(_ask(table, MonitorCommand.TOPIC_SUBSCRIBE, "news", "carol", limit=1),
             Reason.CONFLICT, "1 subscribers: the limit")  # fmt: skip


def test_floors_keep_the_highest_any_gateway_told_and_forget_gone_exchanges(state: StateLog):
    """57: any one gateway's floor is safe (eviction is for good), so the monitor keeps the
    highest per exchange; a gone exchange's floor goes with it; a malformed one is refused."""
    manager = TopicManager("http-0", _Keeper(state))  # type: ignore[arg-type]
    table = Table("monitor http-0", manager.routes())
    end = state.end_offset

    def floor(**floors: int) -> dict:
        ask = TopicAsk(MonitorCommand.TOPIC_FLOOR, floors=tuple(floors.items()))
        reply = table(ask.encode(), None)
        assert reply is not None
        return reply

    _ok(floor(x1=4096, x2=100))
    _ok(floor(x1=1024, x2=300))  # a gateway behind the other: x1 keeps 4096
    assert (manager.consumed_before("x1"), manager.consumed_before("x2")) == (4096, 300)
    assert manager.consumed_before("x3") == 0
    manager.forget_exchanges({"x2"})
    assert manager.floors == {"x2": 300}
    for bad in ({"x1": -1}, {"x1": "12"}, {"x1": True}, [1, 2], {"x" * 300: 1}):
        reply = table({"CMD": int(MonitorCommand.TOPIC_FLOOR), "Floors": bad}, None)
        assert reply is not None and reply["RESULT"] != 0, bad
    assert state.end_offset == end  # nothing of it is written to the state log


A, B, ADMIN = Caller("a"), Caller("b"), Caller("ops", override=True)
FORBIDDEN = "belongs to another principal"


def test_owners_and_subscribers_are_their_principals(state: StateLog):
    """Issue 31, finding 3: another principal's publish as the owner, and its subscribe, get
    and ack of a subscriber, are refused forbidden and change nothing; an override acts."""
    table = _table(_Keeper(state))
    C = MonitorCommand
    _ok(_ask(table, C.TOPIC_REGISTER, "news", "alice", A, limit=9))
    _refused(_ask(table, C.TOPIC_PUBLISH, "news", "alice", B, count=1), Reason.FORBIDDEN,
             "owner 'alice' of topic 'news' belongs to another principal")  # fmt: skip
    assert _ok(_ask(table, C.TOPIC_PUBLISH, "news", "alice", A, count=2)).first == 1
    assert _ok(_ask(table, C.TOPIC_SUBSCRIBE, "news", "s", A, limit=9)).next == 3
    _ok(_ask(table, C.TOPIC_PUBLISH, "news", "alice", A, count=1))
    for command, fields in ((C.TOPIC_POSITION, {}), (C.TOPIC_ACK, {"index": 3}),
                            (C.TOPIC_SUBSCRIBE, {"limit": 9})):  # fmt: skip
        _refused(_ask(table, command, "news", "s", B, **fields), Reason.FORBIDDEN,
                 "subscriber 's' of topic 'news' belongs to another principal")  # fmt: skip
    assert _ok(_ask(table, C.TOPIC_POSITION, "news", "s", A)).next == 3  # unchanged
    assert _ok(_ask(table, C.TOPIC_ACK, "news", "s", ADMIN, index=3)).next == 4
    assert _ok(_ask(table, C.TOPIC_PUBLISH, "news", "alice", ADMIN, count=1)).first == 4
    assert _ok(_ask(table, C.TOPIC_POSITION, "news", "s", A)).next == 4  # still a's
    assert _ok(_ask(table, C.TOPIC_POSITION, "news", "s")).next == 4  # security off: no check


def test_a_record_of_nobody_is_claimed_by_its_first_user(state: StateLog):
    """Records made before (no principal) go to the first principal that uses them."""
    table = _table(_Keeper(state))
    C = MonitorCommand
    _ok(_ask(table, C.TOPIC_REGISTER, "old", "o", limit=9))  # a gateway from before
    _ok(_ask(table, C.TOPIC_SUBSCRIBE, "old", "s", limit=9))
    _ok(_ask(table, C.TOPIC_POSITION, "old", "s", ADMIN))  # an override claims nothing
    _ok(_ask(table, C.TOPIC_POSITION, "old", "s", B))  # b claims it
    _refused(_ask(table, C.TOPIC_POSITION, "old", "s", A), Reason.FORBIDDEN, FORBIDDEN)
    _ok(_ask(table, C.TOPIC_PUBLISH, "old", "o", A, count=1))  # a claims the owner
    _refused(_ask(table, C.TOPIC_PUBLISH, "old", "o", B, count=1), Reason.FORBIDDEN, FORBIDDEN)


def test_a_principal_at_its_topic_quota_registers_no_more_while_another_does(state: StateLog):
    """Issue 31, finding 7: the monitor counts each principal's topics in the same append as
    the topic, and refuses one past the quota it is told; counted as `Mine` by 55."""
    table = _table(_Keeper(state))
    C = MonitorCommand
    for n in range(2):
        _ok(_ask(table, C.TOPIC_REGISTER, f"a{n}", "o", A, limit=9, quota=2))
    _refused(_ask(table, C.TOPIC_REGISTER, "a2", "o", A, limit=9, quota=2), Reason.FORBIDDEN,
             "principal a holds its quota of topics")  # fmt: skip
    _ok(_ask(table, C.TOPIC_REGISTER, "b0", "o", B, limit=9, quota=2))
    assert _ok(_ask(table, C.TOPIC_COUNT, caller=A)) == TopicState(topics=3, mine=2)
    assert _ok(_ask(table, C.TOPIC_COUNT, caller=B)).mine == 1
    assert _ok(_ask(table, C.TOPIC_COUNT)).mine == 0
