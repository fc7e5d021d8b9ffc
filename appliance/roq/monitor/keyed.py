"""Key-ordered consumer groups (Pulsar's Key_Shared): pure, no sockets. docs/architecture.md §11,
"Key-ordered groups"; docs/guarantees.md, "Consumer groups".

A key-ordered group has `parts` key parts (`protocol/keyparts.py`: crc32 of the routing key).
Each range of a log is cut into one slot per part, and the consumer that reads a part's slot
hands out only that part's records, in log order (the group is ordered: one live slot per log
and part, a slot's messages in order). Three rules make a key one consumer's at a time, across
every log of the queue:

* **One holder per part.** A part whose slot (of any log) is leased is its holder's: no other
  consumer leases a slot of it. So the records of one key, in however many logs, are held by
  one consumer at a time.
* **Spread by a consistent hash.** A part nobody holds goes to the member with the highest
  rendezvous hash of (member, part): every member gets about parts / members of them, and a
  member that joins or leaves moves only its own share. A holder the hash no longer names
  takes no new slot of the part; the part moves once its held slots are settled (or their
  lease expired: its holder died), never while records of it are in flight.
* **Move barriers.** A publisher moved off a log (relocation, the exchange leaving or dead)
  drains it before it sends to the next, so its key's records in the old log all precede
  those in the new one. The monitor that moves it notes a barrier: the other logs' slots cut
  from then on wait, part by part, until the old log's records up to its end are settled, the
  end as the old exchange reports it once the publisher's drain bound has passed (a dead one's:
  its copy's). Bounded by `limits.work_key_barrier_max_s` (two moves crossing each other).

What is assigned is derived from the slots' owners and the members, never stored: a monitor
that restarts reads the slots back (each owner keeps its own for one more lease) and so has the
same holders. Barriers are in memory: a monitor restarted while one is open drops it (logged
nowhere: the publisher's move is over by then in all but a slow drain).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from roq import limits

if TYPE_CHECKING:
    from roq.monitor.slots import Group, Slot

log = logging.getLogger(__name__)


@dataclass
class Barrier:
    """A publisher moved off `source`: the other logs' slots from `after` on wait."""

    source: str
    after: dict[str, int]  # other log → its cursor at the move (a log not named: from 0)
    due: float  # monotonic: the source's first report from then on says where it ended
    expires: float  # monotonic: dropped then whatever is left (logged)
    until: int = -1  # the source's end to settle first; -1 until known
    parts: set[int] = field(default_factory=set)  # parts with the source's slots before `until`
    gone: bool = False  # the source left or died: its copy's end, as it grows, is `until`


def rendezvous(part: int, members: list[str]) -> str:
    """The member with the highest hash of (member, part): "" with no member."""
    best, best_score = "", b""
    for member in members:
        score = hashlib.blake2b(f"{part}/{member}".encode(), digest_size=8).digest()
        if score > best_score:
            best, best_score = member, score
    return best


def shares(parts: int, members: list[str]) -> dict[str, list[int]]:
    """Which parts the hash gives each member (for the group's view and the tests)."""
    out: dict[str, list[int]] = {member: [] for member in members}
    for part in range(parts):
        owner = rendezvous(part, members)
        if owner:
            out[owner].append(part)
    return out


class Gate:
    """Which slots of a key-ordered group `consumer` may lease now; made once per LEASE."""

    def __init__(self, group: Group, consumer: str, now: float):
        if group.barriers:  # settles since the last report may have lifted one
            refresh(group, now)
        self.consumer = consumer
        self.members = sorted(group.members)
        self.held: dict[int, str] = {}  # part → the consumer holding a slot of it
        for slot in group.slots.values():
            if slot.owner:
                self.held.setdefault(slot.part, slot.owner)
        self.barriers = group.barriers
        self._owners: dict[int, str] = {}

    def allows(self, slot: Slot) -> bool:
        if self.held.get(slot.part, self.consumer) != self.consumer:
            return False  # another consumer holds the part (in this log or another)
        if self._owner(slot.part) != self.consumer:
            return False  # the hash names another: this part moves once its slots are settled
        return not blocked(self.barriers, slot)

    def _owner(self, part: int) -> str:
        owner = self._owners.get(part)
        if owner is None:
            owner = self._owners[part] = rendezvous(part, self.members)
        return owner


def blocked(barriers: list[Barrier], slot: Slot) -> bool:
    """The slot waits for a barrier: it is of another log than the one a publisher moved off,
    cut after the move, and that log's records of its part up to the barrier are unsettled (or
    where they end is not known yet)."""
    for barrier in barriers:
        if slot.exchange == barrier.source or slot.start < barrier.after.get(slot.exchange, 0):
            continue
        if barrier.until < 0 or slot.part in barrier.parts:
            return True
    return False


def moved_from(group: Group, source: str, now: float, drain_s: float) -> None:
    """A publisher is moved off `source` now; it drains it within `drain_s`."""
    after = {x: end for x, end in group.cursors.items() if x != source}
    due, expires = now + drain_s, now + limits.work_key_barrier_max_s
    group.barriers.append(Barrier(source, after, due, expires))


def gone(group: Group, source: str, end: int) -> None:
    """`source` left or died (it reports no more): its barriers take its last reported `end`
    now, and later its copy's end, as far as that goes (`observed`)."""
    for barrier in group.barriers:
        if barrier.source == source:
            barrier.gone, barrier.until = True, max(barrier.until, end)
            group.cut_open({source: end}, {source})


def observed(group: Group, exchange: str, end: int, now: float) -> None:
    """`exchange` reported its log's `end` (or its copy's, when gone): a barrier on it that is
    due takes `end` as its bound (a live log's once: its later records are other publishers'),
    and the range up to it is cut; then each barrier's parts still waiting are counted again,
    and barriers with none (or too old) go."""
    for barrier in group.barriers:
        if barrier.source != exchange or now < barrier.due:
            continue
        if barrier.until < 0 or (barrier.gone and end > barrier.until):
            barrier.until = end
            group.cut_open({exchange: end}, {exchange})
    refresh(group, now)


def refresh(group: Group, now: float) -> None:
    """Each known barrier's waiting parts: those with a slot of its log before its bound."""
    kept = []
    for barrier in group.barriers:
        if barrier.until >= 0:
            barrier.parts = {
                s.part
                for s in group.slots.values()
                if s.exchange == barrier.source and s.start < barrier.until
            }
            if not barrier.parts and group.cursors.get(barrier.source, 0) >= barrier.until:
                continue  # everything before it is settled: the other logs go on
        if now >= barrier.expires:
            log.warning("group %s: the barrier after a move off %s is dropped after %.0f s: "
                        "keys of a publisher moved then may be out of order", group.name,
                        barrier.source, limits.work_key_barrier_max_s)  # fmt: skip
            continue
        kept.append(barrier)
    group.barriers = kept
