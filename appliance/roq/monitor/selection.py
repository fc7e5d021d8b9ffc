"""Which consumers of a group may take new work: consumer priorities and single active consumer
(issue 33, item 6). Pure, no sockets: the group manager asks `may_take` before it leases a slot
(monitor/groups.py, `_lease_for`); the slot manager (slots.py) then chooses which slot.

Priorities follow RabbitMQ's consumer priorities: while a live consumer of a higher priority
has room (fewer messages handed out and unsettled than its prefetch), a consumer of a lower
priority gets no new slot; it keeps the slots it holds. A group created `single_active` hands
out to one consumer at a time: the one holding slots, else the live one first by priority,
then by join order. Its death frees its slots when their lease expires (the other consumers
then get its unsettled messages again, as suspects), and its membership after one more lease of
silence, so the next one takes over within about a lease.

"Live" is heard from within the group's lease (as a slot's holder is): a consumer idle for work
asks every `work_poll_ms`, one working on a slot holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roq import limits
from roq.monitor.slots import Group, Member


def join(group: Group, consumer: str, priority: int, prefetch: int) -> None:
    """Note a consumer's priority and prefetch; one that joins again keeps its join order."""
    if group.standings.get(consumer) != [priority, prefetch]:
        group.standings[consumer] = [priority, prefetch]
        group.dirty = True


def forget(group: Group, consumers: set[str]) -> None:
    """Consumers gone from the group (left, or silent for a lease): their standing goes."""
    for consumer in consumers & group.standings.keys():
        del group.standings[consumer]
        group.dirty = True


def restore(group: Group, now: float) -> None:
    """After a restart: each consumer with a standing is a member again, heard from now, so a
    live one keeps its place and a dead one is forgotten after a lease (`Group.expire`)."""
    for consumer in list(group.standings)[: limits.work_consumers_max]:
        group.members.setdefault(consumer, Member(consumer, now))


def priority(group: Group, consumer: str) -> int:
    return _standing(group, consumer)[0]


def _standing(group: Group, consumer: str) -> tuple[int, int]:
    found = group.standings.get(consumer)
    return (int(found[0]), int(found[1])) if found else (0, 0)


def live_members(group: Group, since: float) -> int:
    """Consumers of `group` heard from since `since` (monotonic) or holding a slot: a request
    service's available workers (request.delegator.check.ms, monitor/tasks.py)."""
    return sum(1 for m in group.members.values() if m.last_seen >= since or m.slots)


def _live(member: Member, slots: Mapping[str, Any], now: float, lease_s: float) -> bool:
    holds = any(s in slots for s in member.slots)
    return holds or member.last_seen >= now - lease_s


def _room(member: Member, group: Group, inflight: int) -> bool:
    """Fewer messages handed out and unsettled than its prefetch. A slot no consumer counted
    yet is left out: a LEASE's window hands out its first `inflight` indices before the slot is
    read, most of them past its end (forgotten once its count comes, a few ms later), and a
    consumer looked full for that while (the lower one took a slot each time)."""
    prefetch = _standing(group, member.consumer)[1]
    most = min(prefetch or inflight, inflight)
    counted = [group.slots[s] for s in member.slots if s in group.slots]
    return sum(len(slot.handed) for slot in counted if slot.count >= 0) < most


def active(group: Group, now: float, lease_s: float) -> str:
    """The single active consumer of `group`: the live one holding slots (the first by
    priority and join order if several: a monitor restart restores every slot's owner), else
    the first live one by priority, then join order; "" with none live."""
    live = [m for m in group.members.values() if _live(m, group.slots, now, lease_s)]
    holding = [m for m in live if any(s in group.slots for s in m.slots)]
    pool = holding or live
    if not pool:
        return ""
    order = {consumer: n for n, consumer in enumerate(group.standings)}
    last = len(order)  # a consumer the group did not see join (a restored slot's owner)
    best = min(pool, key=lambda m: (-priority(group, m.consumer), order.get(m.consumer, last)))
    return best.consumer


def may_take(group: Group, consumer: str, now: float, lease_s: float, inflight: int) -> bool:
    """Whether `consumer` may lease a new slot now (the module's docstring); `inflight` is the
    group's `work.inflight`, a consumer's prefetch its own bound below it."""
    if group.single_active:
        return active(group, now, lease_s) == consumer
    mine = priority(group, consumer)
    for other in group.members.values():
        if other.consumer == consumer or priority(group, other.consumer) <= mine:
            continue
        if _live(other, group.slots, now, lease_s) and _room(other, group, inflight):
            return False  # a higher one has room: the work is its
    return True


def read_standings(raw: Any) -> dict[str, list[int]]:
    """A group record's `standings` as written by `join`; anything else is dropped (a
    consumer then counts as priority 0 until it joins again), never a crash."""
    if not isinstance(raw, dict):
        return {}
    kept: dict[str, list[int]] = {}
    for consumer, value in list(raw.items())[: limits.work_consumers_max]:
        if isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
            kept[str(consumer)] = [value[0], value[1]]
    return kept
