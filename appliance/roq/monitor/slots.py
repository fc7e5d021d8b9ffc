"""The slot manager of one consumer group (WSO2 MB 3.0's slots, seed 001): pure, no sockets.

A slot is a range [start, end) of offsets of one exchange's log. Exchanges cut their logs every
`work.slot.messages` messages (the offsets come in their reports), and the monitor closes a slot
that stayed open for `work.slot.ms`; so every message of every exchange of the queue falls in
exactly one slot of each group. A slot is leased to one consumer at a time; the consumer reads
the slot's bytes from the exchange's log server (or a copy's, when the exchange is dead) and
names each message by its index in the slot. The manager keeps, per slot, what is settled and
how often each unsettled message was handed out: never a payload.

States (docs/architecture.md, "Work queues"): FREE (never leased), ASSIGNED (leased to a
consumer until `lease_until`), RETURNED (leased before and given back, by its consumer or by
the expiry of its lease, with messages left; due again at `due`), and DELETED: every message
settled, the slot is dropped (and its znode deleted). WSO2's four, with the lease's expiry as
the way a dead consumer's slots come back.

Delivery counts grow when a message is handed out (`give`), never when a lease expires. The
messages a consumer held when its lease expired are *suspects*: one of them may be what killed
it, so each is handed out alone, and only the poison message's count keeps growing (a window
of innocent neighbours does not reach the dead letters with it).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from roq import limits
from roq.backoff import backoff_s
from roq.monitor import keyed
from roq.protocol.messages.groups import expand, ranges


class SlotState(enum.StrEnum):
    FREE = "free"
    ASSIGNED = "assigned"
    RETURNED = "returned"


@dataclass
class Slot:
    exchange: str
    start: int
    end: int
    count: int = -1  # messages in the slot; -1 until a consumer read it
    settled: set[int] = field(default_factory=set)
    deliveries: dict[int, int] = field(default_factory=dict)  # unsettled index → times handed out
    reasons: dict[int, str] = field(default_factory=dict)  # the last nack reason
    not_before: dict[int, float] = field(default_factory=dict)  # epoch s: nacked until then
    due: float = 0.0  # epoch s: not leased again before this
    owner: str = ""
    lease_until: float = 0.0  # monotonic s
    handed: set[int] = field(default_factory=set)  # given in this lease, not settled
    suspects: set[int] = field(default_factory=set)
    returned: bool = False
    version: int = -1  # of its znode; -1: not stored yet
    dirty: bool = True
    # Its messages are those of [first, last) of the range's (last -1: to its end): a slot
    # whose consumer had more left than it holds shares the rest with a waiting consumer
    # (`Group.split`), which gets [first, last) of the same bytes as a slot of its own.
    first: int = 0
    last: int = -1
    part: int = -1  # a key-ordered group's key part (monitor/keyed.py): its records only
    letter: str = ""  # a redriven dead letter's id: its one message (monitor/deadletters.py)

    @property
    def slot_id(self) -> str:
        name = slot_id(self.exchange, self.start, self.first, self.part)
        return f"{name}{REDRIVEN}" if self.letter else name

    @property
    def stop(self) -> int:
        """Where its messages end: `last`, or the range's count (-1 while unknown)."""
        return self.last if self.last >= 0 else self.count

    def holds(self, index: int) -> bool:
        return self.first <= index and (self.stop < 0 or index < self.stop)

    def outside(self) -> list[int]:
        """The range's indices that are not this slot's, as flattened [lo, hi) ranges: a
        consumer counts them settled."""
        edges = [0, self.first] if self.first > 0 else []
        if 0 <= self.stop < self.count:
            edges += [self.stop, self.count]
        return edges

    def weight(self) -> int:
        """Its share of the range's bytes (the fair-share measure)."""
        size = max(1, self.end - self.start)
        if self.count <= 0 or (self.first == 0 and self.stop == self.count):
            return size
        return max(1, size * (self.stop - self.first) // self.count)

    @property
    def state(self) -> SlotState:
        if self.owner:
            return SlotState.ASSIGNED
        return SlotState.RETURNED if self.returned else SlotState.FREE

    @property
    def done(self) -> bool:
        return self.count >= 0 and len(self.settled) >= self.stop - self.first

    def unsettled(self) -> int:
        return self.stop - self.first - len(self.settled) if self.count >= 0 else 0

    # --- durable form (JSON in its znode) ------------------------------------------------------
    def record(self) -> dict[str, Any]:
        return {
            "exchange": self.exchange, "start": self.start, "end": self.end,
            "count": self.count, "settled": ranges(self.settled),
            "deliveries": {str(i): n for i, n in self.deliveries.items()},
            "reasons": {str(i): r for i, r in self.reasons.items()},
            "not_before": {str(i): t for i, t in self.not_before.items()},
            "due": self.due, "owner": self.owner, "returned": self.returned,
            "suspects": sorted(self.suspects | self.handed),
            "first": self.first, "last": self.last, "part": self.part,
        } | ({"letter": self.letter} if self.letter else {})  # fmt: skip

    @classmethod
    def from_record(cls, data: dict[str, Any], version: int, lease_until: float) -> Slot:
        """A slot read back after a restart. Its owner keeps it for one more lease: a consumer
        that is alive goes on, one that died lets it expire (what it held is then suspect)."""
        slot = cls(str(data["exchange"]), int(data["start"]), int(data["end"]))
        slot.count = int(data.get("count", -1))
        slot.settled = set(expand(data.get("settled", [])))
        slot.deliveries = {int(i): int(n) for i, n in data.get("deliveries", {}).items()}
        slot.reasons = {int(i): str(r) for i, r in data.get("reasons", {}).items()}
        slot.not_before = {int(i): float(t) for i, t in data.get("not_before", {}).items()}
        slot.due = float(data.get("due", 0.0))
        slot.owner = str(data.get("owner", ""))
        slot.lease_until = lease_until if slot.owner else 0.0
        slot.returned = bool(data.get("returned", False))
        slot.suspects = {int(i) for i in data.get("suspects", [])}
        slot.first, slot.last = int(data.get("first", 0)), int(data.get("last", -1))
        slot.part = int(data.get("part", -1))
        slot.letter = str(data.get("letter", ""))
        slot.version, slot.dirty = version, False
        return slot


def _untouched(slot: Slot) -> tuple[int, int]:
    """Where the run of messages its consumer was never given (nor settled, nor nacked)
    begins, and how many there are; (0, 0) while its count is unknown."""
    if slot.count < 0:
        return 0, 0
    begun = max([*slot.handed, *slot.settled, *slot.not_before], default=slot.first - 1) + 1
    return begun, max(0, slot.stop - begun)


REDRIVEN = "~r"  # a redriven letter's slot: never the id of a slot cut from the log


def slot_id(exchange: str, start: int, first: int = 0, part: int = -1) -> str:
    """`<exchange>@<offset>`, `%<key part>` in a key-ordered group, and `#<first index>` for
    a part split off a slot."""
    name = f"{exchange}@{start}%{part}" if part >= 0 else f"{exchange}@{start}"
    return f"{name}#{first}" if first else name


@dataclass
class Member:
    """A consumer of the group, as the manager sees it."""

    consumer: str
    last_seen: float
    slots: set[str] = field(default_factory=set)
    acked: int = 0
    # bytes of logs leased since it joined: the fair-share measure. Slots cut on demand (a
    # consumer read the open end) vary in size, so counting slots would not share messages.
    leases: int = 0
    waiting_since: float = 0.0  # monotonic: asked for a slot and got none (0: not waiting)
    applied: int = 0  # the highest SETTLE `Seq` of this consumer taken (in memory)
    written: int = 0  # ... and in ZooKeeper (a reply's `Written`)
    # held back by priorities or single active (monitor/selection.py): it asks but may take
    # nothing, so the fair shares do not wait for it
    standby: bool = False

    def in_flight(self, slots: dict[str, Slot]) -> int:
        return sum(len(slots[s].handed) for s in self.slots if s in slots)


@dataclass(frozen=True)
class Rules:
    lease_s: float
    inflight: int
    backoff_s: float
    max_deliveries: int


@dataclass
class GiveResult:
    given: list[int] = field(default_factory=list)
    deliveries: list[int] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)
    clipped: int = 0


@dataclass
class Group:
    name: str
    ordered: bool = False
    start: str = "beginning"
    prefix: bytes = b""  # routing-key prefix: consumers skip (settle) the other messages
    cursors: dict[str, int] = field(default_factory=dict)  # exchange → end of its last slot
    slots: dict[str, Slot] = field(default_factory=dict)  # by id, oldest first
    members: dict[str, Member] = field(default_factory=dict)
    open_since: dict[str, float] = field(default_factory=dict)  # exchange → open slot seen at
    deleted: list[str] = field(default_factory=list)  # slot ids whose znodes are to go
    dirty: bool = True  # the group's own record (cursors)
    acked: int = 0
    dead_letters: int = 0
    redelivered: int = 0  # messages handed out again (roq_group_redeliveries_total)
    skipped: int = 0  # outside the key prefix
    ttl_expired: int = 0  # past their expiry when a consumer would hand them out (dropped)
    duplicates: int = 0  # copies of an id the group had from another place (monitor/groupids.py)
    full_slots_logged: bool = False
    # who may take new work (monitor/selection.py): one consumer at a time, and each consumer's
    # [priority, prefetch] in join order (kept with the group: a restarted monitor keeps them)
    single_active: bool = False
    standings: dict[str, list[int]] = field(default_factory=dict)
    parts: int = 0  # key parts of a key-ordered group (monitor/keyed.py); 0: not key-ordered
    barriers: list[keyed.Barrier] = field(default_factory=list)  # after publishers' moves
    # dead letters redriven or purged (ids on the dead-letter queue), kept as records of their
    # own, one per step (`chunks` so far), and the step records not written yet
    removed: set[str] = field(default_factory=set)
    chunks: int = 0
    chunks_out: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "ordered": self.ordered, "from": self.start,
                "prefix": self.prefix.hex(), "cursors": self.cursors,
                "single_active": self.single_active, "standings": self.standings,
                "parts": self.parts}  # fmt: skip

    # --- cutting ------------------------------------------------------------------------------
    def observe(self, exchange: str, end: int, cuts: Iterable[int], now: float,
                slot_s: float, final: bool = False) -> None:  # fmt: skip
        """An exchange's log reached `end`, with slot boundaries at `cuts`: add the slots that
        closed. `final`: the exchange is gone and `end` is its copy's: close what is left."""
        cursor = self.cursors.setdefault(exchange, 0)
        if cursor == 0:
            self.dirty = True
        for cut in sorted(cuts):
            if cursor < cut <= end:
                cursor = self._cut(exchange, cursor, cut)
        if end <= cursor:
            self.open_since.pop(exchange, None)
            return
        opened = self.open_since.setdefault(exchange, now)
        if final or now - opened >= slot_s:
            self._cut(exchange, cursor, end)
            self.open_since.pop(exchange, None)

    def _cut(self, exchange: str, start: int, end: int) -> int:
        if len(self.slots) + max(1, self.parts) > limits.work_slots_max:
            if not self.full_slots_logged:
                self.full_slots_logged = True
            return start  # no slot: the range stays uncut until slots are deleted
        for part in range(self.parts) if self.parts else (-1,):  # key-ordered: one per part
            slot = Slot(exchange, start, end, part=part)
            self.slots[slot.slot_id] = slot
        self.cursors[exchange] = end
        self.dirty = True
        return end

    # --- leasing ------------------------------------------------------------------------------
    def lease(self, consumer: str, now: float, wall: float, rules: Rules,
              readable: set[str], ends: dict[str, int] | None = None) -> Slot | None:  # fmt: skip
        """The oldest slot that is due, not leased, and readable now (its exchange or a copy
        of its log answers); in ordered mode only the oldest live slot of each exchange.

        Fair shares among the consumers asking now: each consumer that asked within the last
        `work_share_window_ms`, got nothing, and has taken fewer slots than this one goes first;
        this one gets a slot only if enough are free for all of those too. Counting only the
        *asking* consumers keeps a slow one from holding the others back (it is not asking
        while it works). With none free, the open ranges known from the reports (`ends`) are
        cut at once: the slot size adapts to the demand, instead of idle consumers waiting
        for `work.slot.ms` while the messages sit in an open slot."""
        member = self.members[consumer]
        # key-ordered: the parts are the shares (keyed.py), and a consumer takes only its own
        gate = keyed.Gate(self, consumer, now) if self.parts else None
        ahead = 0 if gate else self._ahead_of(member, now)
        free = self._leasable(wall, readable, ahead + 1, gate)
        if not free and ends:
            self.cut_open(ends, readable)
            free = self._leasable(wall, readable, ahead + 1, gate)
        if not free and (part := self.split(consumer, readable)) is not None:
            free = [part]
        too_far = bool(free) and not gate and self._too_far_ahead(member, now, free[0])
        if len(free) <= ahead or too_far:
            if not member.waiting_since:
                member.waiting_since = now
            return None
        slot = free[0]
        slot.owner, slot.lease_until, slot.dirty = consumer, now + rules.lease_s, True
        member.slots.add(slot.slot_id)
        member.leases += slot.weight()
        member.waiting_since = 0.0
        return slot

    def split(self, consumer: str, readable: set[str]) -> Slot | None:
        """With no slot free: the second half of what another consumer's slot has not handed
        out yet, as a slot of its own (WSO2's slot delivery shares a slot's messages among the
        subscribers; here each part keeps a single owner). A burst cut as one slot is so
        shared among the consumers waiting for work, whatever the slot's size; a consumer
        bound to a few messages at once (its `inflight`, RabbitMQ's prefetch) leaves the rest.
        Not in ordered mode (a key's messages go in order, from one consumer at a time)."""
        if self.ordered or len(self.slots) >= limits.work_slots_max:
            return None
        best, best_tail, best_from = None, 1, 0
        for slot in self.slots.values():
            if not slot.owner or slot.owner == consumer or slot.exchange not in readable:
                continue
            begun, tail = _untouched(slot)
            if tail > best_tail:
                best, best_tail, best_from = slot, tail, begun
        if best is None:
            return None
        return self._split_at(best, best_from + best_tail // 2)

    def share(self, slot: Slot, now: float) -> Slot | None:
        """The slot's count just became known (its consumer read it): while another consumer
        waits for work, the second half of what is untouched goes at once, as a free slot,
        rather than at that consumer's next ask (by then a fast holder may be through it)."""
        if self.ordered or len(self.slots) >= limits.work_slots_max:
            return None
        recent = now - limits.work_share_window_ms / 1000
        if not any(m.waiting_since and m.last_seen >= recent and m.consumer != slot.owner
                   for m in self.members.values()):  # fmt: skip
            return None
        begun, tail = _untouched(slot)
        return self._split_at(slot, begun + tail // 2) if tail >= 2 else None

    def _split_at(self, slot: Slot, cut: int) -> Slot:
        part = Slot(slot.exchange, slot.start, slot.end, count=slot.count, first=cut,
                    last=slot.last)  # fmt: skip
        for index in [i for i in slot.deliveries if i >= cut]:
            part.deliveries[index] = slot.deliveries.pop(index)
        for index in [i for i in slot.reasons if i >= cut]:
            part.reasons[index] = slot.reasons.pop(index)
        part.settled = {i for i in slot.settled if i >= cut}
        part.suspects = {i for i in slot.suspects if i >= cut}
        slot.settled -= part.settled
        slot.suspects -= part.suspects
        slot.last, slot.dirty = cut, True
        self.slots[part.slot_id] = part
        return part

    def _leasable(self, wall: float, readable: set[str], wanted: int,
                  gate: keyed.Gate | None = None) -> list[Slot]:  # fmt: skip
        """Up to `wanted` slots that may be leased now, oldest first (in a key-ordered group,
        of the parts `gate` lets its consumer take)."""
        found: list[Slot] = []
        seen: set[tuple[str, int]] = set()
        for slot in self.slots.values():
            first_of_exchange = (slot.exchange, slot.part) not in seen  # of its part, keyed
            seen.add((slot.exchange, slot.part))
            if slot.owner or slot.due > wall or slot.exchange not in readable:
                continue
            if self.ordered and not first_of_exchange:
                continue
            if gate is not None and not gate.allows(slot):
                continue
            found.append(slot)
            if len(found) >= wanted:
                break
        return found

    def _ahead_of(self, member: Member, now: float) -> int:
        """Consumers waiting for a slot right now that took fewer than `member` did: without
        this, the consumer that finishes a slot first (and asks again at once) takes the next,
        and a burst goes to whoever happened to ask first."""
        recent = now - limits.work_share_window_ms / 1000
        return sum(
            1
            for other in self.members.values()
            if other is not member
            and not other.standby
            and other.waiting_since
            and other.last_seen >= recent
            and other.leases < member.leases
        )

    def _too_far_ahead(self, member: Member, now: float, slot: Slot) -> bool:
        """A consumer that took `work_share_lead_slots` slots more than another that asked
        within `work_share_lead_window_ms` waits for it. Consumers that go through a slot in a
        few ms (no I/O between them) are shared out by the CPU scheduler otherwise: one that
        ran while the others waited for a core took a burst's slots every 2 ms. A consumer
        slower than that window per slot is not asking then, and holds no one back."""
        recent = now - limits.work_share_lead_window_ms / 1000
        lead = member.leases - limits.work_share_lead_slots * max(1, slot.end - slot.start)
        return any(
            other is not member
            and not other.standby
            and other.last_seen >= recent
            and other.leases < lead
            for other in self.members.values()
        )

    def hungry(self, now: float) -> bool:
        """Some consumer asked for a slot within the share window and got none."""
        recent = now - limits.work_share_window_ms / 1000
        return any(m.waiting_since and m.last_seen >= recent for m in self.members.values())

    def cut_open(self, ends: dict[str, int], readable: set[str]) -> None:
        """Close the open slot of each readable exchange at its reported end (consumers are
        waiting: a smaller slot now beats a full one later)."""
        for exchange, end in ends.items():
            cursor = self.cursors.get(exchange)
            if exchange in readable and cursor is not None and end > cursor:
                self._cut(exchange, cursor, end)
                self.open_since.pop(exchange, None)

    def give(self, slot: Slot, wanted: Iterable[int], room: int, wall: float,
             rules: Rules) -> GiveResult:  # fmt: skip
        """Hand out what of `wanted` may go now, counting each delivery; messages handed out
        `max_deliveries` times already are `expired` (the consumer dead-letters them)."""
        result = GiveResult()
        # once per request, not per index (that made a 1000-message window O(n²): 9 ms)
        suspect_out = not slot.suspects.isdisjoint(slot.handed)
        frontier = self._frontier(slot, 0) if self.ordered else -1
        for index in wanted:
            if not self._may_give(slot, index, wall, frontier):
                continue
            count = slot.deliveries.get(index, 0)
            if count >= rules.max_deliveries:
                result.expired.append(index)
                continue
            if room <= 0 or not self._suspect_alone(slot, index, result, suspect_out):
                result.clipped += 1
                continue
            slot.deliveries[index] = count + 1
            self.redelivered += 1 if count else 0
            slot.handed.add(index)
            slot.not_before.pop(index, None)
            result.given.append(index)
            result.deliveries.append(count + 1)
            if self.ordered:
                frontier = self._frontier(slot, frontier)
            room -= 1
        if result.given:
            slot.dirty = True
        return result

    def _may_give(self, slot: Slot, index: int, wall: float, frontier: int) -> bool:
        if index in slot.settled or index in slot.handed or not slot.holds(index):
            return False
        if 0 <= slot.count <= index or slot.not_before.get(index, 0.0) > wall:
            return False
        if self.ordered:  # in order: every earlier message settled or held by this consumer
            return index == frontier
        return True

    @staticmethod
    def _frontier(slot: Slot, start: int) -> int:
        """The first index from `start` on that is neither settled nor handed out (ordered
        mode: only it may go next). Kept across a request: one pass, not one per index."""
        index = start
        while index in slot.settled or index in slot.handed:
            index += 1
        return index

    @staticmethod
    def _suspect_alone(slot: Slot, index: int, result: GiveResult, suspect_out: bool) -> bool:
        """A suspect goes out alone, and nothing goes out beside a suspect (`suspect_out`:
        one was handed out before this request)."""
        if suspect_out or (result.given and result.given[-1] in slot.suspects):
            return False
        if index in slot.suspects:
            return not slot.handed and not result.given
        return True

    # --- settling -----------------------------------------------------------------------------
    @staticmethod
    def count(slot: Slot, count: int) -> None:
        """A consumer read the slot: it holds `count` messages. What was handed out past it
        (a LEASE's window is given before the slot is read) never existed: forgotten."""
        slot.count, slot.dirty = count, True
        for held in (slot.handed, slot.suspects, slot.settled):
            held.difference_update([i for i in held if i >= count])
        for kept in (slot.deliveries, slot.reasons, slot.not_before):
            for index in [i for i in kept if i >= count]:
                del kept[index]

    def ack(self, slot: Slot, indices: Iterable[int], member: Member | None) -> None:
        for index in indices:
            if index in slot.settled or not slot.holds(index):
                continue
            self._settle(slot, index)
            self.acked += 1
            if member is not None:
                member.acked += 1

    def skip(self, slot: Slot, indices: Iterable[int]) -> None:
        """Messages outside the group's key prefix: settled, never handed out nor acked."""
        for index in indices:
            if index not in slot.settled and slot.holds(index):
                self._settle(slot, index)
                self.skipped += 1

    def drop_expired(self, slot: Slot, indices: Iterable[int]) -> None:
        """Messages past their expiry (TTL): settled, never handed to an application."""
        for index in indices:
            if index not in slot.settled and slot.holds(index):
                self._settle(slot, index)
                self.ttl_expired += 1

    def drop_duplicates(self, slot: Slot, indices: Iterable[int]) -> None:
        """Copies of a message id the group has from another place within its de-duplication
        window (monitor/groupids.py): settled, never handed to an application (one given by a
        lease's window before its slot was read is taken back: its consumer does not hand it
        out)."""
        for index in indices:
            if index not in slot.settled and slot.holds(index):
                self._settle(slot, index)
                self.duplicates += 1

    @staticmethod
    def defer(slot: Slot, index: int, until: float) -> None:
        """A message not due before `until` (epoch s, its not-before time): handed to no one
        before then, as a nacked one. If it was given in this lease, that hand-out did not
        happen (the consumer kept it): it is not counted as a delivery."""
        if index in slot.settled or not slot.holds(index):
            return
        if index in slot.handed:
            slot.handed.discard(index)
            count = slot.deliveries.pop(index, 0) - 1
            if count > 0:
                slot.deliveries[index] = count
        slot.not_before[index] = max(slot.not_before.get(index, 0.0), until)
        slot.dirty = True

    def dead(self, slot: Slot, indices: Iterable[int]) -> None:
        for index in indices:
            if index not in slot.settled and slot.holds(index):
                self._settle(slot, index)
                self.dead_letters += 1

    @staticmethod
    def _settle(slot: Slot, index: int) -> None:
        slot.settled.add(index)
        slot.handed.discard(index)
        slot.suspects.discard(index)
        slot.deliveries.pop(index, None)
        slot.reasons.pop(index, None)
        slot.not_before.pop(index, None)
        slot.dirty = True

    @staticmethod
    def nack(slot: Slot, index: int, delay_ms: int, reason: str, wall: float,
             rules: Rules) -> None:  # fmt: skip
        if index in slot.settled:
            return
        slot.handed.discard(index)
        if delay_ms < 0:  # the group's back-off, longer with each delivery
            deliveries = slot.deliveries.get(index, 1)
            delay_s = backoff_s(deliveries, rules.backoff_s, limits.work_backoff_max_s, linear=True)
        else:
            delay_s = min(delay_ms / 1000, limits.work_backoff_max_s)
        slot.not_before[index] = wall + delay_s
        if reason:
            slot.reasons[index] = reason[: limits.work_reason_chars_max]
        slot.dirty = True

    def release(self, slot: Slot) -> None:
        """Back to the group: RETURNED, due when its earliest nacked message is."""
        member = self.members.get(slot.owner)
        if member is not None:
            member.slots.discard(slot.slot_id)
        slot.suspects |= slot.handed  # held when given back unsettled: as good as a crash
        slot.handed.clear()
        slot.owner, slot.lease_until, slot.returned, slot.dirty = "", 0.0, True, True
        slot.due = min(slot.not_before.values(), default=0.0)

    def drop_if_done(self, slot: Slot) -> bool:
        if not slot.done:
            return False
        member = self.members.get(slot.owner)
        if member is not None:
            member.slots.discard(slot.slot_id)
        del self.slots[slot.slot_id]
        if slot.version >= 0:
            self.deleted.append(slot.slot_id)
        return True

    # --- time ---------------------------------------------------------------------------------
    def expire(self, now: float, rules: Rules) -> list[Slot]:
        """Leases past their end go back (their consumer died or hung); members silent for a
        lease are forgotten."""
        expired = [s for s in self.slots.values() if s.owner and s.lease_until < now]
        for slot in expired:
            self.release(slot)
        for consumer, member in list(self.members.items()):
            if now - member.last_seen > rules.lease_s and not member.slots:
                del self.members[consumer]
        return expired

    def leave(self, consumer: str) -> None:
        member = self.members.pop(consumer, None)
        if member is None:
            return
        for sid in list(member.slots):
            if sid in self.slots:
                self.release(self.slots[sid])
