"""Who of a group may take new work (monitor/selection.py), pure: consumer priorities (a lower
one gets nothing new while a live higher one has room) and single active consumer (one at a
time; the next by priority, then join order, once it is gone)."""

from __future__ import annotations

import json

from roq.monitor import selection
from roq.monitor.slots import Group, Member, Rules, Slot

RULES = Rules(lease_s=2.0, inflight=100, backoff_s=1.0, max_deliveries=3)
LEASE_S = RULES.lease_s


def _group(*standings: tuple[str, int, int], single: bool = False, now: float = 0.0) -> Group:
    """Consumers (id, priority, prefetch) joined in this order, each heard from at `now`."""
    group = Group("g")
    group.single_active = single
    for consumer, priority, prefetch in standings:
        group.members[consumer] = Member(consumer, now)
        selection.join(group, consumer, priority, prefetch)
    return group


def _hand_out(group: Group, consumer: str, messages: int) -> Slot:
    """`consumer` holds a slot with `messages` handed out and unsettled."""
    slot = Slot("x1", 1000 * len(group.slots), 1000 * len(group.slots) + 1000, count=messages)
    group.slots[slot.slot_id] = slot
    slot.owner, slot.lease_until = consumer, LEASE_S
    slot.handed = set(range(messages))
    group.members[consumer].slots.add(slot.slot_id)
    return slot


def _may(group: Group, consumer: str, now: float = 0.0) -> bool:
    return selection.may_take(group, consumer, now, LEASE_S, RULES.inflight)


def test_equal_priorities_hold_no_one_back():
    group = _group(("a", 0, 0), ("b", 0, 0))
    assert _may(group, "a") and _may(group, "b")


def test_a_lower_priority_gets_nothing_new_while_a_higher_one_has_room():
    group = _group(("high", 10, 5), ("low", 0, 5))
    assert _may(group, "high") and not _may(group, "low")
    _hand_out(group, "high", 4)  # one message of room left
    assert not _may(group, "low")
    _hand_out(group, "high", 1)  # at its prefetch: the overflow goes to the lower one
    assert _may(group, "low")


def test_a_window_handed_out_before_the_slot_was_counted_does_not_fill_a_consumer():
    """A LEASE's window hands out indices 0..prefetch of a slot never read (its count -1):
    most may lie past its end; the higher consumer is not full for them."""
    group = _group(("high", 10, 5), ("low", 0, 5))
    slot = _hand_out(group, "high", 5)
    slot.count = -1
    assert not _may(group, "low")
    slot.count = 5
    assert _may(group, "low")


def test_a_consumers_prefetch_is_bounded_by_the_groups_inflight():
    group = _group(("high", 1, 0), ("low", 0, 0))  # 0: the group's work.inflight (100)
    _hand_out(group, "high", 99)
    assert not _may(group, "low")
    _hand_out(group, "high", 1)
    assert _may(group, "low")


def test_a_silent_higher_consumer_holds_no_one_back_after_a_lease():
    group = _group(("high", 10, 5), ("low", 0, 5))
    group.members["low"].last_seen = LEASE_S + 1
    assert not _may(group, "low", now=LEASE_S - 0.1)
    assert _may(group, "low", now=LEASE_S + 0.1)  # heard from more than a lease ago: gone


def test_a_higher_consumer_that_left_holds_no_one_back():
    group = _group(("high", 10, 5), ("low", 0, 5))
    group.leave("high")
    selection.forget(group, {"high"})
    assert _may(group, "low") and "high" not in group.standings


def test_single_active_hands_out_to_the_first_by_priority_then_join_order():
    group = _group(("first", 0, 0), ("second", 0, 0), ("third", 0, 0), single=True)
    assert [c for c in group.members if _may(group, c)] == ["first"]
    selection.join(group, "third", 5, 0)  # joins again with a higher priority
    assert selection.active(group, 0.0, LEASE_S) == "third"


def test_the_single_active_consumer_keeps_its_place_while_it_holds_slots():
    group = _group(("first", 0, 0), ("second", 0, 0), single=True)
    _hand_out(group, "first", 3)
    group.members["later"] = Member("later", 0.0)
    selection.join(group, "later", 9, 0)  # a higher priority does not take over mid-slot
    assert selection.active(group, 0.0, LEASE_S) == "first"
    assert not _may(group, "later") and not _may(group, "second")


def test_when_the_single_active_consumer_dies_the_next_takes_over_after_its_lease():
    group = _group(("first", 0, 0), ("second", 0, 0), single=True)
    slot = _hand_out(group, "first", 3)
    later = LEASE_S + 0.5
    group.members["second"].last_seen = later  # still asking; "first" went silent at 0
    assert group.expire(later, RULES) == [slot]  # its lease expired: the slot comes back
    assert slot.suspects == {0, 1, 2}  # its unsettled messages go again, one at a time
    forgotten = {"first"} - set(group.members)
    selection.forget(group, forgotten)
    assert selection.active(group, later, LEASE_S) == "second"
    assert _may(group, "second", now=later)


def test_standings_survive_the_groups_record_and_bad_ones_are_dropped():
    group = _group(("a", 3, 7), ("b", -2, 0), single=True)
    record = json.loads(json.dumps(group.record()))
    assert selection.read_standings(record["standings"]) == {"a": [3, 7], "b": [-2, 0]}
    assert list(selection.read_standings(record["standings"])) == ["a", "b"]  # join order
    assert record["single_active"] is True
    bad = {"a": [1], "b": "x", "c": [1, 2], "d": [True, 0]}
    assert selection.read_standings(bad) == {"c": [1, 2]}
    assert selection.read_standings(["not", "a", "dict"]) == {}


def test_restored_standings_make_members_that_a_silent_one_loses_after_a_lease():
    group = Group("g")
    group.standings = {"a": [1, 0], "b": [0, 0]}
    selection.restore(group, now=10.0)
    assert set(group.members) == {"a", "b"}
    group.members["b"].last_seen = 10.0 + LEASE_S + 1
    group.expire(10.0 + LEASE_S + 1, RULES)
    assert set(group.members) == {"b"}


def test_a_consumer_held_back_does_not_make_the_one_taking_the_work_wait_for_its_share():
    """The fair shares (slots.py `_too_far_ahead`) make a consumer far ahead wait for one that
    asked recently; one held back by priority or single active asks but never takes, so the
    active one would wait for ever: a held-back member (`standby`) is left out of them."""
    group = _group(("a", 0, 0), ("b", 0, 0), single=True)
    for n in range(10):
        group.observe("x1", 100 * (n + 1), (100 * (n + 1),), 0.0, 0.5)
    taken = 0
    for _ in range(10):
        group.members["b"].last_seen = 0.0  # it keeps asking
        group.members["b"].standby = not _may(group, "b")
        slot = group.lease("a", 0.0, 0.0, RULES, {"x1"})
        assert slot is not None, f"the active consumer waited after {taken} slots"
        group.release(slot)
        slot.owner, taken = "", taken + 1
        del group.slots[slot.slot_id]
    assert group.members["b"].standby
