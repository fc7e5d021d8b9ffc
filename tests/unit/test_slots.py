"""The slot manager of a consumer group (monitor/slots.py), pure: cutting, leasing, counting
deliveries, suspects, ordered mode, and its durable record."""

from __future__ import annotations

import itertools
import time

from roq import limits
from roq.exchange.slotcuts import SlotCuts
from roq.monitor.slots import Group, Member, Rules, Slot, SlotState
from roq.protocol.messages.groups import expand, ranges

RULES = Rules(lease_s=2.0, inflight=100, backoff_s=1.0, max_deliveries=3)


def _group(ordered: bool = False) -> Group:
    group = Group("g", ordered)
    group.members["c1"] = Member("c1", 0.0)
    group.members["c2"] = Member("c2", 0.0)
    return group


def _lease(group: Group, consumer: str, now: float, wall: float, rules: Rules,
           readable: set[str], ends: dict[str, int] | None = None) -> Slot | None:  # fmt: skip
    """As the monitor does: a consumer that asks is a member, seen now."""
    group.members.setdefault(consumer, Member(consumer, now)).last_seen = now
    return group.lease(consumer, now, wall, rules, readable, ends)


def test_reported_cuts_and_the_time_limit_close_slots():
    group = _group()
    group.observe("x1", 3000, (1000, 2000), now=0.0, slot_s=0.5)
    assert [(s.start, s.end) for s in group.slots.values()] == [(0, 1000), (1000, 2000)]
    group.observe("x1", 3000, (1000, 2000), now=0.4, slot_s=0.5)  # open since 0.0: not yet
    assert len(group.slots) == 2
    group.observe("x1", 3000, (), now=0.6, slot_s=0.5)
    assert list(group.slots)[-1] == "x1@2000" and group.cursors["x1"] == 3000


def test_a_slot_is_leased_to_one_consumer_and_comes_back_when_its_lease_expires():
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None and slot.state is SlotState.ASSIGNED
    assert _lease(group, "c2", 0.0, 0.0, RULES, {"x1"}) is None
    slot.count = 10
    given = group.give(slot, range(10), 100, 0.0, RULES)
    assert given.given == list(range(10)) and given.deliveries == [1] * 10
    assert group.expire(RULES.lease_s + 0.1, RULES) == [slot]
    assert slot.state is SlotState.RETURNED and slot.suspects == set(range(10))
    assert _lease(group, "c2", 3.0, 0.0, RULES, {"x1"}) is slot


def test_suspects_go_out_alone_so_only_the_poison_message_reaches_max_deliveries():
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None
    slot.count = 3
    group.give(slot, [0, 1, 2], 100, 0.0, RULES)
    for crash in range(RULES.max_deliveries - 1):  # message 1 kills its consumer every time
        group.expire(10.0 * (crash + 1), RULES)
        slot = _lease(group, "c2", 10.0 * (crash + 1), 0.0, RULES, {"x1"})
        assert slot is not None
        for index in (0, 2):
            if index not in slot.settled:
                assert group.give(slot, [index], 100, 0.0, RULES).given == [index]
                group.ack(slot, [index], None)
        assert group.give(slot, [1], 100, 0.0, RULES).given == [1]
    assert slot.deliveries == {1: RULES.max_deliveries}
    group.expire(100.0, RULES)
    slot = _lease(group, "c1", 100.0, 0.0, RULES, {"x1"})
    assert slot is not None
    assert group.give(slot, [1], 100, 0.0, RULES).expired == [1]
    group.dead(slot, [1])
    assert slot.done and group.drop_if_done(slot) and not group.slots


def test_a_nack_delays_the_message_and_the_in_flight_limit_clips():
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None
    slot.count = 5
    assert group.give(slot, range(5), 2, 0.0, RULES).clipped == 3
    group.nack(slot, 0, 5000, "later", wall=0.0, rules=RULES)
    group.release(slot)
    assert slot.due == 5.0 and slot.reasons == {0: "later"}
    assert _lease(group, "c2", 0.0, 1.0, RULES, {"x1"}) is None  # not due yet
    assert _lease(group, "c2", 0.0, 5.0, RULES, {"x1"}) is slot


def test_ordered_mode_leases_one_slot_per_exchange_and_gives_in_order():
    group = _group(ordered=True)
    group.observe("x1", 200, (100, 200), 0.0, 0.5)
    first = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert first is not None and first.start == 0
    assert _lease(group, "c2", 0.0, 0.0, RULES, {"x1"}) is None  # the next slot waits
    first.count = 3
    group.nack(first, 0, 1000, "", 0.0, RULES)
    assert group.give(first, [0, 1, 2], 100, 0.0, RULES).given == []  # 0 blocks 1 and 2


def test_the_record_round_trips_and_settled_sets_are_ranges():
    slot = Slot("x1", 0, 100, count=10, settled={0, 1, 2, 5, 9}, deliveries={3: 2}, owner="c1")
    assert ranges(slot.settled) == [0, 3, 5, 6, 9, 10]
    assert set(expand(ranges(slot.settled))) == slot.settled
    back = Slot.from_record(slot.record(), version=4, lease_until=7.0)
    assert (back.settled, back.deliveries, back.owner, back.lease_until, back.version) == (
        slot.settled, slot.deliveries, "c1", 7.0, 4,
    )  # fmt: skip


def test_a_burst_between_two_reports_loses_no_cut_and_past_the_bound_thins_evenly():
    cuts = SlotCuts()
    for n in range(1, 201):
        cuts.add(n * 100)
    assert cuts.report() == tuple(n * 100 for n in range(1, 201))  # none dropped
    assert cuts.report() == tuple(n * 100 for n in range(201 - limits.work_cuts_repeated, 201))
    many = limits.work_cuts_reported_max + 1
    for n in range(1, many + 1):
        cuts.add(1_000_000 + n)
    reported = cuts.report()
    assert len(reported) <= limits.work_cuts_reported_max and reported[-1] == 1_000_000 + many
    gaps = {b - a for a, b in itertools.pairwise(reported)}
    assert gaps <= {1, 2}, gaps  # repeats dropped first, then every other new one: alike


def test_a_consumer_that_took_more_slots_lets_the_waiting_ones_go_first_unless_enough_are_free():
    group = _group()
    group.observe("x1", 400, (100, 200, 300, 400), 0.0, 0.5)
    assert _lease(group, "c1", 0.0, 0.0, RULES, {"x1"}) is not None
    assert _lease(group, "c1", 0.0, 0.0, RULES, {"x1"}) is not None  # c1 holds two
    group.members["c3"] = Member("c3", 0.0, waiting_since=0.01)
    group.members["c2"].waiting_since = 0.01
    assert group.lease("c1", 0.05, 0.0, RULES, {"x1"}) is None  # two free, two ahead of it
    assert _lease(group, "c2", 0.06, 0.0, RULES, {"x1"}) is not None
    assert _lease(group, "c1", 0.07, 0.0, RULES, {"x1"}) is None  # c3 still waits: one left
    assert _lease(group, "c3", 0.08, 0.0, RULES, {"x1"}) is not None
    group.members["c2"].last_seen = group.members["c3"].last_seen = -10.0  # gone quiet
    group.observe("x1", 500, (500,), 0.1, 0.5)
    assert _lease(group, "c1", 0.1, 0.0, RULES, {"x1"}) is not None  # a slow one holds no one


def test_waiting_consumers_get_the_open_range_cut_at_once():
    group = _group()
    group.observe("x1", 50, (), 0.0, slot_s=0.5)  # open, not yet due by time
    assert not group.slots
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"}, {"x1": 50})
    assert slot is not None and (slot.start, slot.end) == (0, 50)
    assert _lease(group, "c2", 0.05, 0.0, RULES, {"x1"}, {"x1": 50}) is None  # nothing new
    assert group.hungry(0.1) and not group.hungry(1.0)  # c2 waits; a second later, stale


def test_messages_outside_the_key_prefix_are_settled_without_counting_as_acked():
    group = Group("g", prefix=b"eu.")
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None
    slot.count = 4
    group.skip(slot, expand([0, 2, 3, 4]))
    group.ack(slot, [2], group.members["c1"])
    assert (group.skipped, group.acked, slot.done) == (3, 1, True)
    assert bytes.fromhex(group.record()["prefix"]) == b"eu."  # kept in its znode


def test_a_large_window_is_given_in_one_pass_in_both_modes():
    """Giving was O(n²) in the window (a suspect check and the ordered check per index): a
    1,000-message window cost the monitor 9 ms; 50,000 would take minutes."""
    for ordered in (False, True):
        group = _group(ordered)
        group.observe("x1", 100, (100,), 0.0, 0.5)
        slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
        assert slot is not None
        slot.count = 50_000
        started = time.monotonic()
        result = group.give(slot, range(50_000), 50_000, 0.0, RULES)
        assert len(result.given) == 50_000 and time.monotonic() - started < 2.0


def test_a_window_given_before_the_slot_was_read_is_trimmed_to_its_count():
    """A LEASE's window is handed out before any consumer read the slot: what lies past the
    count the consumer then sends never existed, and is neither in flight nor suspect."""
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None and slot.count == -1
    given = group.give(slot, range(50), 100, 0.0, RULES)
    assert len(given.given) == 50 and group.members["c1"].in_flight(group.slots) == 50
    group.count(slot, 20)
    assert slot.handed == set(range(20)) and max(slot.deliveries) == 19
    group.ack(slot, range(20), group.members["c1"])
    assert slot.done and group.drop_if_done(slot)


def test_no_consumer_runs_more_than_two_slots_ahead_of_one_that_just_asked():
    """Consumers that go through a slot in a few ms are not left to the CPU scheduler: one
    that asked within the lead window and took less holds back the one far ahead; one that
    has not asked for longer (slow, or gone) holds no one back."""
    group = _group()
    cuts = tuple(range(100, 1100, 100))
    group.observe("x1", 1000, cuts, 0.0, 0.5)
    taken = []
    for _ in range(3):
        slot = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
        assert slot is not None
        taken.append(slot)
    group.members["c2"].last_seen = 0.0  # c2 asked just now, and holds nothing yet
    assert group.lease("c1", 0.0, 0.0, RULES, {"x1"}) is None  # 300 bytes ahead of c2
    assert _lease(group, "c2", 0.0, 0.0, RULES, {"x1"}) is not None
    later = limits.work_share_lead_window_ms / 1000 + 0.01
    group.members["c1"].last_seen = later
    assert group.lease("c1", later, 0.0, RULES, {"x1"}) is not None  # c2 silent since


def test_a_slot_cut_on_demand_ends_after_a_slot_of_messages():
    from roq.client.consumer import Consumer
    from roq.log import format as batchfmt

    pid = b"p" * 16
    data = bytearray()
    for n in range(5):  # batches of 30 records
        batch = bytearray(batchfmt.encode_batch(pid, n * 30, b"k", [b"x"] * 30, [1] * 30))
        batchfmt.stamp_offset(batch, 4096 + len(data))
        data += batch
    sizes = len(data) // 5
    assert Consumer._slot_end(bytes(data), 100) == 4096 + 4 * sizes  # 120 records: 4 batches
    assert Consumer._slot_end(bytes(data), 1000) == 0  # fewer: the read's end is the cut
    assert Consumer._slot_end(b"junk" * 20, 10) == 0


def test_a_waiting_consumer_takes_the_second_half_of_what_another_has_not_handed_out():
    """c1 leased a slot of 40 and holds one message (its prefetch); c2 asks with nothing free:
    it gets messages 20..39 of the same bytes as a slot of its own, c1 keeps 0..19. Each part
    is settled and dropped on its own; neither hands out the other's messages."""
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    first = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert first is not None
    group.count(first, 40)
    assert group.give(first, [0], 1, 0.0, RULES).given == [0]
    part = _lease(group, "c2", 0.0, 0.0, RULES, {"x1"})
    assert part is not None and part is not first
    assert (part.slot_id, part.first, part.stop, first.stop) == ("x1@0#20", 20, 40, 20)
    assert part.outside() == [0, 20] and first.outside() == [20, 40]
    assert group.give(part, range(20, 40), 100, 0.0, RULES).given == list(range(20, 40))
    assert group.give(first, range(1, 40), 100, 0.0, RULES).given == list(range(1, 20))
    group.ack(first, range(40), None)  # its part's indices are not its to settle
    assert first.done and not part.done and part.unsettled() == 20
    group.ack(part, range(20, 40), None)
    assert group.drop_if_done(first) and group.drop_if_done(part) and not group.slots
    assert group.acked == 40


def test_a_split_part_round_trips_and_small_or_ordered_slots_are_not_split():
    group = _group()
    group.observe("x1", 100, (100,), 0.0, 0.5)
    first = _lease(group, "c1", 0.0, 0.0, RULES, {"x1"})
    assert first is not None
    group.count(first, 3)
    group.give(first, [0, 1], 100, 0.0, RULES)
    assert group.split("c2", {"x1"}) is None  # one message left: nothing to share
    group.count(first, 10)
    part = group.split("c2", {"x1"})
    assert part is not None and (part.first, part.stop) == (6, 10)
    again = Slot.from_record(part.record(), 3, 0.0)
    assert (again.slot_id, again.first, again.last, again.count) == ("x1@0#6", 6, -1, 10)
    ordered = _group(ordered=True)
    ordered.observe("x1", 100, (100,), 0.0, 0.5)
    slot = _lease(ordered, "c1", 0.0, 0.0, RULES, {"x1"})
    assert slot is not None
    ordered.count(slot, 40)
    assert ordered.split("c2", {"x1"}) is None
