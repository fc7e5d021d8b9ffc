"""TTL and delay, pure (docs/guarantees.md, "TTL and delay"): the client's decisions
(client/timing.py), the fan-out gate's per-stream order and bound, the group's Defer and
TtlExpired settles (monitor/slots.py) and their wire form."""

from __future__ import annotations

from roq.client.timing import DelayGate, early_us, expired
from roq.log.format import Record, RecordMeta
from roq.monitor.slots import Group, Member, Rules, Slot, SlotState
from roq.protocol.messages.groups import Defer, Settle
from roq.protocol.messages.tasks import TaskStart

NOW = 1_800_000_000_000_000  # µs since the epoch
RULES = Rules(lease_s=2.0, inflight=100, backoff_s=1.0, max_deliveries=3)


def _record(seq: int, key: bytes = b"k", producer: bytes = b"p" * 16, *,
            expires: int | None = None, not_before: int | None = None) -> Record:  # fmt: skip
    meta = None
    if expires is not None or not_before is not None:
        meta = RecordMeta(expires_at_us=expires, not_before_us=not_before)
    return Record(0, producer, seq, NOW, key, b"m%d" % seq, meta)


def test_a_record_expires_at_its_time_and_not_before():
    assert not expired(None, NOW)
    assert not expired(RecordMeta(not_before_us=NOW - 1), NOW)
    assert not expired(RecordMeta(expires_at_us=NOW + 1), NOW)
    assert expired(RecordMeta(expires_at_us=NOW), NOW)  # at its expiry time: gone
    assert expired(RecordMeta(expires_at_us=-5), NOW)  # before 1970: simply past


def test_a_record_is_due_at_its_not_before_time():
    assert early_us(None, NOW) == 0
    assert early_us(RecordMeta(expires_at_us=NOW + 10), NOW) == 0
    assert early_us(RecordMeta(not_before_us=NOW), NOW) == 0
    assert early_us(RecordMeta(not_before_us=NOW + 1_500_000), NOW) == 1_500_000


def test_the_gate_holds_a_delayed_record_and_the_rest_of_its_stream_only():
    gate: DelayGate[str] = DelayGate(held_max=10)
    assert gate.offer("a1", _record(1), NOW)
    assert not gate.offer("a2", _record(2, not_before=NOW + 1_000), NOW)
    assert not gate.offer("a3", _record(3), NOW)  # behind a2 in its stream: held, in order
    assert gate.offer("b1", _record(1, key=b"other"), NOW)  # another key flows on
    assert gate.offer("c1", _record(1, producer=b"q" * 16), NOW)  # another producer too
    assert gate.held == 2 and gate.next_due() == NOW + 1_000
    assert gate.release(NOW + 999) == []
    assert gate.release(NOW + 1_000) == ["a2", "a3"]
    assert gate.held == 0 and gate.next_due() is None
    assert gate.offer("a4", _record(4), NOW)  # the stream is free again


def test_a_stream_waits_for_each_of_its_delayed_records_in_turn():
    gate: DelayGate[str] = DelayGate(held_max=10)
    gate.offer("x1", _record(1, not_before=NOW + 100), NOW)
    gate.offer("x2", _record(2, not_before=NOW + 50), NOW)  # due earlier, but after x1
    gate.offer("x3", _record(3, not_before=NOW + 300), NOW)
    gate.offer("x4", _record(4), NOW)
    assert gate.release(NOW + 60) == []  # order before time: x2 waits for x1
    assert gate.release(NOW + 100) == ["x1", "x2"]
    assert sorted(gate.items()) == ["x3", "x4"] and gate.next_due() == NOW + 300
    assert gate.release(NOW + 300) == ["x3", "x4"]


def test_the_gate_says_full_at_its_bound():
    gate: DelayGate[int] = DelayGate(held_max=3)
    for seq in range(3):
        gate.offer(seq, _record(seq, not_before=NOW + 1), NOW)
    assert gate.full
    gate.release(NOW + 1)
    assert not gate.full


def _leased(count: int) -> tuple[Group, Slot]:
    group = Group("g")
    group.members["c1"] = Member("c1", 0.0)
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = group.lease("c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None
    group.count(slot, count)
    return group, slot


def test_a_deferred_message_is_not_given_before_its_time_nor_counted_as_a_delivery():
    group, slot = _leased(3)
    given = group.give(slot, [0, 1, 2], 100, 10.0, RULES)  # a lease's window, before the read
    assert given.given == [0, 1, 2]
    group.defer(slot, 1, 12.0)  # the consumer read it: due at 12 s
    assert 1 not in slot.handed and 1 not in slot.deliveries
    assert group.give(slot, [1], 100, 11.9, RULES).given == []
    group.ack(slot, [0, 2], None)
    group.release(slot)
    assert slot.state is SlotState.RETURNED and slot.due == 12.0  # leased again at its time
    assert group.lease("c1", 1.0, 11.9, RULES, {"x1"}) is None
    assert group.lease("c1", 1.0, 12.0, RULES, {"x1"}) is slot
    again = group.give(slot, [1], 100, 12.0, RULES)
    assert again.given == [1] and again.deliveries == [1]  # its first real hand-out
    assert group.redelivered == 0


def test_in_an_ordered_group_a_deferred_message_holds_what_follows_it():
    group, slot = _leased(3)
    group.ordered = True
    group.defer(slot, 0, 12.0)
    assert group.give(slot, [1, 2], 100, 11.0, RULES).given == []
    assert group.give(slot, [0, 1, 2], 100, 12.0, RULES).given == [0, 1, 2]


def test_expired_messages_are_settled_and_counted_apart_from_acks():
    group, slot = _leased(3)
    group.give(slot, [0], 100, 0.0, RULES)
    group.drop_expired(slot, [0, 1])
    group.drop_expired(slot, [1, 7])  # settled already; outside the slot: ignored
    assert group.ttl_expired == 2 and group.acked == 0 and group.skipped == 0
    assert slot.settled == {0, 1} and not slot.handed
    group.defer(slot, 1, 99.0)  # a settled message is not put off again
    assert 1 not in slot.not_before


def test_a_settle_carries_its_defers_and_expired_only_when_it_has_some():
    plain = Settle("g", "c", "x1@0", acks=(1,))
    assert "Defer" not in plain.encode() and Settle.decode(plain.encode()) == plain
    timed = Settle("g", "c", "x1@0", defer=(Defer(2, 1_800_000_000_000),), ttl_expired=(3, 4))
    assert Settle.decode(timed.encode()) == timed


def test_a_task_start_says_expired_only_when_it_is():
    start = TaskStart("t1", 1, 1, "w")
    assert "Expired" not in start.encode() and TaskStart.decode(start.encode()) == start
    gone = TaskStart("t1", 1, 0, "w", expired=True)
    assert TaskStart.decode(gone.encode()) == gone
