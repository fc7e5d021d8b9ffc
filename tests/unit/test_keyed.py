"""Key-ordered consumer groups (monitor/keyed.py, protocol/keyparts.py), pure: one slot per key
part, one holder per part across every log, the parts spread by a consistent hash and moved
only once settled, and the barrier after a publisher's move."""

from __future__ import annotations

from roq.monitor import keyed
from roq.monitor.slots import Group, Member, Rules, Slot
from roq.protocol.keyparts import key_part
from roq.protocol.messages.groups import GroupJoin, Joined, Lease

RULES = Rules(lease_s=2.0, inflight=100, backoff_s=1.0, max_deliveries=3)


def _group(parts: int, *members: str) -> Group:
    group = Group("g", True, parts=parts)
    for member in members:
        group.members[member] = Member(member, 0.0)
    return group


def _lease(group: Group, consumer: str, now: float = 0.0) -> Slot | None:
    group.members.setdefault(consumer, Member(consumer, now)).last_seen = now
    return group.lease(consumer, now, 0.0, RULES, set(group.cursors))


def _settle(group: Group, slot: Slot) -> None:
    """Its consumer read it and acked everything in it (here: it held none of the part's)."""
    group.count(slot, 0)
    assert group.drop_if_done(slot)


def _owned_by(group: Group, consumer: str) -> int:
    """A part the hash gives `consumer` among the group's members."""
    return keyed.shares(group.parts, sorted(group.members))[consumer][0]


def test_a_key_is_always_in_the_same_part_and_parts_are_spread():
    keys = [f"key-{n}".encode() for n in range(1600)]
    parts = [key_part(key, 16) for key in keys]
    assert parts == [key_part(key, 16) for key in keys]
    counts = [parts.count(p) for p in range(16)]
    assert min(counts) >= 50, counts  # 100 each on average
    assert key_part(b"anything", 1) == 0 and key_part(b"", 16) in range(16)


def test_the_hash_spreads_parts_and_a_joiner_takes_only_from_the_others():
    members = [f"consumer-{n}" for n in range(4)]
    before = keyed.shares(64, members)
    assert all(8 <= len(parts) <= 24 for parts in before.values()), before
    after = keyed.shares(64, [*members, "joiner"])
    for member in members:  # nobody's parts go to anyone but the joiner
        assert set(after[member]) <= set(before[member])
    assert after["joiner"], "the joiner got no part"
    assert keyed.rendezvous(3, []) == ""


def test_each_range_is_cut_into_one_slot_per_part_and_its_record_keeps_the_part():
    group = _group(4, "c1")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    assert list(group.slots) == ["x1@0%0", "x1@0%1", "x1@0%2", "x1@0%3"]
    slot = group.slots["x1@0%2"]
    back = Slot.from_record(slot.record(), 0, 1.0)
    assert (back.part, back.slot_id) == (2, "x1@0%2")
    assert group.record()["parts"] == 4


def test_one_consumer_takes_every_part_and_its_slots_of_a_part_go_one_per_log():
    group = _group(2, "c1")
    group.observe("x1", 200, (100, 200), 0.0, 0.5)
    group.observe("x2", 100, (100,), 0.0, 0.5)
    taken = [_lease(group, "c1") for _ in range(5)]
    ids = sorted(s.slot_id for s in taken if s is not None)
    # the oldest of each (log, part): x1@100 waits for x1@0 of its part
    assert ids == ["x1@0%0", "x1@0%1", "x2@0%0", "x2@0%1"]


def test_a_part_held_on_one_log_is_nobody_elses_on_another_until_settled():
    group = _group(2, "c1")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    held = [_lease(group, "c1"), _lease(group, "c1")]
    assert all(held)
    group.members["c2"] = Member("c2", 0.0)  # joins: the hash names it for some part
    part = _owned_by(group, "c2")
    group.observe("x2", 100, (100,), 0.0, 0.5)
    other_log = group.slots[f"x2@0%{part}"]
    assert _lease(group, "c2") is None, "c1 holds the part on x1: c2 waits"
    assert _lease(group, "c1") is not other_log, "named for c2 now: c1 takes no new slot of it"
    _settle(group, next(s for s in held if s is not None and s.part == part))
    assert _lease(group, "c2") is other_log, "settled: the part moves to c2"


def test_a_dead_consumers_parts_go_to_the_others_once_its_lease_expired():
    group = _group(4, "c1", "c2")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    c1_parts = keyed.shares(4, ["c1", "c2"])["c1"]
    held = [_lease(group, "c1") for _ in c1_parts]
    assert sorted(s.part for s in held if s is not None) == c1_parts
    assert _lease(group, "c2", 1.0) is not None  # its own part
    expired = group.expire(RULES.lease_s + 0.5, RULES)  # c1 silent since 0.0: dead
    assert sorted(s.part for s in expired) == c1_parts and "c1" not in group.members
    again = {s.part for s in (_lease(group, "c2", 3.0) for _ in range(4)) if s is not None}
    assert again >= set(c1_parts)


def test_after_a_publisher_moved_the_other_logs_wait_for_the_old_logs_records():
    group = _group(1, "c1")
    group.observe("x1", 100, (100,), 0.0, 0.5)  # x1@0: before the move
    keyed.moved_from(group, "x1", now=1.0, drain_s=0.3)
    group.observe("x2", 50, (50,), 1.1, 0.5)  # x2@0: a new log, cut after the move
    first = _lease(group, "c1", 1.1)
    assert first is not None and first.slot_id == "x1@0%0"
    assert _lease(group, "c1", 1.1) is None, "x1's end after the drain is not known yet"
    keyed.observed(group, "x1", 120, 1.2)  # before the drain bound: not the end yet
    assert group.barriers[0].until == -1
    keyed.observed(group, "x1", 130, 1.4)  # its first report after it: where x1 ended
    assert group.barriers[0].until == 130 and "x1@100%0" in group.slots
    _settle(group, first)
    after = _lease(group, "c1", 1.5)
    assert after is not None and after.slot_id == "x1@100%0", "x1 to its end first"
    assert _lease(group, "c1", 1.5) is None, "x2 waits for x1 up to 130 settled"
    _settle(group, after)
    moved = _lease(group, "c1", 1.6)
    assert moved is not None and moved.slot_id == "x2@0%0"
    assert group.barriers == []


def test_a_barrier_blocks_only_slots_cut_after_the_move_and_ends_after_its_bound():
    group = _group(1, "c1")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    group.observe("x2", 100, (100,), 0.0, 0.5)
    keyed.moved_from(group, "x1", now=1.0, drain_s=0.3)
    group.observe("x2", 200, (200,), 1.1, 0.5)
    taken = {s.slot_id for s in (_lease(group, "c1", 1.1) for _ in range(3)) if s is not None}
    assert taken == {"x1@0%0", "x2@0%0"}  # x2@100 was cut after the move: it waits
    keyed.refresh(group, 1.0 + 61.0)  # x1 never reported again: dropped (logged)
    assert group.barriers == []


def test_the_join_joined_and_lease_messages_carry_the_parts():
    join = GroupJoin("g", "c1", key_parts=16)
    assert GroupJoin.decode(join.encode()).key_parts == 16
    assert GroupJoin.decode(GroupJoin("g", "c1").encode()).key_parts == 0
    joined = Joined(1000, 10, 3, True, "q1.g.dlq", key_parts=16)
    assert Joined.decode(joined.encode()).key_parts == 16
    lease = Lease("x1@0%3", "x1", "tcp://127.0.0.1:6003", "", 0, 100, -1, part=3)
    assert Lease.decode(lease.encode()).part == 3
    whole = Lease("x1@0", "x1", "tcp://127.0.0.1:6003", "", 0, 9, -1)
    assert Lease.decode(whole.encode()).part == -1


def test_a_dead_logs_barrier_ends_where_its_copy_ends():
    group = _group(1, "c1")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    group.observe("x2", 100, (100,), 0.0, 0.5)
    keyed.moved_from(group, "x1", now=1.0, drain_s=0.3)
    keyed.gone(group, "x1", 100)  # declared dead: its last report said 100
    assert group.barriers[0].until == 100
    keyed.observed(group, "x1", 140, 1.5)  # its copy holds 40 more: those first too
    assert group.barriers[0].until == 140 and "x1@100%0" in group.slots
    group.observe("x2", 200, (200,), 1.5, 0.5)
    taken = [_lease(group, "c1", 1.5) for _ in range(3)]
    assert {s.slot_id for s in taken if s is not None} == {"x1@0%0", "x2@0%0"}
    for slot in [*taken, group.slots["x1@100%0"]]:
        if slot is not None and slot.exchange == "x1":
            slot.owner = ""
            _settle(group, slot)
    later = _lease(group, "c1", 1.6)
    assert later is None, "x2@100 waits for x2@0 (its log's order), not for the barrier"
    _settle(group, group.slots["x2@0%0"])
    assert (moved := _lease(group, "c1", 1.7)) is not None and moved.slot_id == "x2@100%0"
