"""Work queues in the monitor: the consumer groups of its queue, their slot managers (`slots.py`)
and their durable state (`coordination/groupstore.py`).

Why the monitor: it is the one process that already knows every exchange of its queue from their
reports (those added by scale-out within a heartbeat, those leaving, those dead) and which live
exchanges hold copies of a dead one's log, so it can cut every log into slots and say where each
slot is read, without a new process or a new membership protocol. It never reads a log: the
consumers do, from the exchanges' log servers (F+3).

The monitor hooks in at three points (`service.py`): its placement socket's table serves the
group commands (20–26) with the `routes` below (each handler gets the typed request and returns
the typed reply), every report's `End`/`Cuts` go to `observe`, and `tick` runs on its timer.
A JOIN, RELEASE, LEAVE or DELETE is answered once its changes are in ZooKeeper. A LEASE or SETTLE
is applied in memory and answered at once, and one group commit at a time then writes every
change since the previous one (`pump`); each answer's `Written` tells the consumer which of its
settles are stored (a SETTLE with `Sync` waits for its own: `_synced`). So what a consumer was
told is written (a confirmed ack) survives the monitor's restart or move; what it was not told
may not.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from roq import limits
from roq.config import MonitorSettings
from roq.coordination.groupstore import Commit, GroupStore, StaleWrite, Write
from roq.coordination.paths import Paths
from roq.coordination.session import SharedSession
from roq.errors import CoordinationError
from roq.monitor import deadletters, keyed, selection
from roq.monitor.groupids import GroupIds
from roq.monitor.grouplog import GroupLog, LogCommit
from roq.monitor.slots import GiveResult, Group, Member, Rules, Slot
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Answer, Done, Encodable, Refused, Route, route
from roq.protocol.messages.deadletters import Action, DeadLetters
from roq.protocol.messages.groups import (
    ConsumerRequest,
    ConsumerView,
    GroupDelete,
    GroupInfo,
    GroupJoin,
    Groups,
    GroupView,
    HeldAnswer,
    Joined,
    Lease,
    NoSlot,
    Settle,
    Settled,
    Synced,
    Tail,
    dead_letter_queue,
    expand,
    ranges,
    unpack_ids,
)
from roq.transport.rpc import Envelope

log = logging.getLogger(__name__)

GROUP_COMMANDS = frozenset(range(MonitorCommand.GROUP_JOIN, MonitorCommand.GROUP_DEAD_LETTERS + 1))
# exchange id → (log endpoint, leader id to name for a copy ("" for its own log), readable end)
Readable = Mapping[str, tuple[str, str, int]]
Reply = Callable[[Envelope, Encodable], None]  # answers a held request (service.py)
W = TypeVar("W", Joined, Settled, Synced)  # a reply that says `Written`
E = TypeVar("E", bound=Encodable)
_NOT_LOADED = Refused(Reason.BUSY, "consumer groups: ZooKeeper is not reachable yet")


@dataclass
class _Held:
    """A LEASE held (its `Wait`): answered at `deadline` or when woken, as any LEASE."""

    ask: ConsumerRequest
    envelope: Envelope
    deadline: float


class GroupManager:
    def __init__(
        self,
        queue: str,
        settings: MonitorSettings,
        zk: SharedSession,  # the monitor's one ZooKeeper session, which it closes
        readable: Callable[[], Readable],
        reply: Reply | None = None,
        store: GroupLog | None = None,  # the state log's (delivery.state=log), else ZooKeeper's
    ):
        work = settings.work
        self.queue, self.name = queue, f"monitor {queue}"
        self.rules = Rules(work.lease_s, work.inflight, work.backoff_s, work.max_deliveries)
        self.slot_s = work.slot_s
        self.slot_messages = work.slot_messages
        zk_store = GroupStore(zk, Paths(settings.zk.namespace), queue) if store is None else None
        self.store: GroupStore | GroupLog = store or zk_store  # type: ignore[assignment]
        self.groups: dict[str, Group] = {}
        self.ends: dict[str, int] = {}  # exchange → its log's end, as last reported
        self.seen: dict[str, int] = {}  # exchange → where a consumer read its log to end, if later
        self._readable = readable
        self._loaded = False
        self._next_try = 0.0
        self.failed_writes = 0
        self.epoch = uuid.uuid4().hex[:16]  # this monitor's life: a consumer that sees it change
        # sends again what it was not told is written (the previous life may not have written it)
        self._commit: Commit | LogCommit | None = None
        self._in_commit: list[tuple[Write, Group, Slot | None]] = []
        self._seqs: list[tuple[Member, int]] = []
        self._failed_at = 0.0
        self._reply = reply  # None: no LEASE is held
        self._held: dict[str, list[_Held]] = {}  # group → its held LEASEs, oldest first
        self._wake_due: dict[str, float] = {}  # group → until when its next LEASE is woken
        self.holding = 0
        self.window_ms = settings.work.dedup_window_ms  # the groups' id windows (0: none)
        self.ids: dict[str, GroupIds] = {}  # group → its de-duplication window, once it has one
        self._ids_saved_at = 0.0

    # --- durable state ------------------------------------------------------------------------
    def _ensure_loaded(self) -> bool:
        """Read the groups back from their store once (retried at most every second)."""
        now = time.monotonic()
        if self._loaded or now < self._next_try:
            return self._loaded
        self._next_try = now + 1.0
        try:
            found = self.store.load()
        except CoordinationError as error:
            log.warning("%s: consumer groups not readable yet: %s", self.name, error)
            return False
        for record, slots in found:
            self.groups[str(record["name"])] = self._restore(record, slots, now)
            self._restore_ids(str(record["name"]))
        self._loaded = True
        if found:
            log.info("%s: %d consumer group(s) read back (%d slots)", self.name,
                     len(found), sum(len(s) for _, s in found))  # fmt: skip
        return True

    def _restore(self, record: dict[str, Any], slots: list[tuple[dict[str, Any], int]],
                 now: float) -> Group:  # fmt: skip
        group = Group(str(record["name"]), bool(record.get("ordered")), str(record.get("from")),
                      bytes.fromhex(str(record.get("prefix", ""))))  # fmt: skip
        group.cursors = {str(k): int(v) for k, v in record.get("cursors", {}).items()}
        group.single_active = record.get("single_active") is True
        group.standings = selection.read_standings(record.get("standings"))
        group.parts = int(record.get("parts", 0))
        group.dirty = False
        deadletters.restore(group, [data for data, _ in slots if deadletters.is_chunk(data)])
        restored = [
            Slot.from_record(data, version, now + self.rules.lease_s)
            for data, version in slots
            if not deadletters.is_chunk(data)
        ]
        for slot in sorted(restored, key=lambda s: (s.exchange, s.start)):
            group.slots[slot.slot_id] = slot
            # a slot written before its group's cursor moved still counts as cut
            group.cursors[slot.exchange] = max(group.cursors.get(slot.exchange, 0), slot.end)
            if slot.owner:
                group.members.setdefault(slot.owner, Member(slot.owner, now)).slots.add(
                    slot.slot_id
                )
        selection.restore(group, now)
        return group

    def _restore_ids(self, name: str) -> None:
        """A group's de-duplication window, rebuilt from its records in the state log (with
        delivery.state=zookeeper it starts empty: docs/guarantees.md)."""
        if not self.window_ms or not isinstance(self.store, GroupLog):
            return
        window = self.ids[name] = GroupIds(self.window_ms)
        now_ms, taken = int(time.time() * 1000), 0
        for number, entries in self.store.load_ids(name):
            taken += window.restore(entries, now_ms)
            window.records.append((number, max((_ms(e) for e in entries), default=0)))
            window.next_record = number + 1
        if taken:
            log.info("%s: group %s: %d message id(s) of its window read back", self.name, name,
                     taken)  # fmt: skip

    def _save_ids(self, now_too: bool = False) -> None:
        """Append what the groups' windows took since the last save to the state log (at most
        every `work_dedup_save_ms` unless `now_too`, a sync: a record a request would fill the
        log with small keys), and delete the records the window is past."""
        now = time.monotonic()
        due = now_too or now >= self._ids_saved_at + limits.work_dedup_save_ms / 1000
        if not self.ids or not due:
            return
        self._ids_saved_at, now_ms = now, int(time.time() * 1000)
        for name, window in self.ids.items():
            unsaved, window.unsaved = window.unsaved, []
            if not isinstance(self.store, GroupLog):
                continue  # ZooKeeper keeps no window: a znode per id would be its load
            most, records = limits.work_dedup_ids_per_record_max, []
            for at in range(0, len(unsaved), most):
                chunk = unsaved[at : at + most]
                records.append((window.next_record, [list(entry) for entry in chunk]))
                window.records.append((window.next_record, chunk[-1][-1]))
                window.next_record += 1
            cutoff, dropped = now_ms - window.window_ms - window.bucket_ms, []
            while window.records and window.records[0][1] < cutoff:
                dropped.append(window.records.popleft()[0])
            try:
                self.store.write_ids(name, records, dropped)
            except CoordinationError as error:  # the window holds them: only a restart misses
                log.warning("%s: group %s: message ids not saved: %s", self.name, name, error)

    def dedup_counts(self) -> dict[str, tuple[int, int]]:
        """Group name → (duplicates not handed out, ids its window forgot before their time)."""
        return {
            name: (group.duplicates, w.forgotten_early if (w := self.ids.get(name)) else 0)
            for name, group in self.groups.items()
        }

    # Writes are group commits, off the reply path: a request's changes are applied in memory
    # and answered at once; one ZooKeeper multi at a time then carries every change since the
    # last one (started at the next request or timer turn). A reply's `Written` tells a
    # consumer which of its settles are in ZooKeeper: only those are confirmed, and `flush()`
    # (a SETTLE with `Sync`) waits for its own. What a monitor crash can lose is only what no
    # consumer was told is written: architecture.md §11, "Durable state".
    def pump(self) -> None:
        """End the commit in flight if it is done; start the next if something changed."""
        if self._commit is not None:
            if not self._commit.ready():
                return
            self._finish()
        if self._commit is None:
            self._start()

    def sync(self) -> bool:
        """Everything applied so far in ZooKeeper, waiting at most `work_sync_wait_ms` (the
        commit in flight, then one more); False if it did not get there."""
        deadline = time.monotonic() + limits.work_sync_wait_ms / 1000
        self._save_ids(now_too=True)  # appended before the commit that makes it wait
        for _ in range(2 + bool(self._commit)):
            if self._commit is not None and not self._commit.wait(
                max(0.0, deadline - time.monotonic())
            ):
                return False
            if self._commit is not None:
                self._finish()
            if self._commit is None and not self._start():
                return self._failed_at == 0.0
        return False

    def flush(self) -> bool:
        return self.sync()

    def _start(self) -> bool:
        """Start a commit of what changed; False if there was nothing to write."""
        self._save_ids()
        if time.monotonic() < self._failed_at + limits.work_write_retry_ms / 1000:
            return False
        writes: list[tuple[Write, Group, Slot | None]] = []
        for group in list(self.groups.values()):  # a dead-letter step first, whole (atomic)
            self._collect_letters(group, writes)
        for group in list(self.groups.values()):
            self._collect(group, writes, limits.work_state_writes_per_turn_max)
        seqs = [] if len(writes) >= limits.work_state_writes_per_turn_max else [
            (m, m.applied) for g in self.groups.values() for m in g.members.values()
        ]  # fmt: skip
        if not writes:
            for member, applied in seqs:
                member.written = applied  # nothing unwritten: all it was told is stored
            return False
        try:
            self._commit = self.store.commit([w for w, _, _ in writes])
        except CoordinationError as error:
            self._failed(writes, error)
            return False
        self._in_commit, self._seqs = writes, seqs
        return True

    @staticmethod
    def _collect(group: Group, out: list[tuple[Write, Group, Slot | None]], budget: int) -> None:
        if group.dirty:
            out.append((Write(group.name, record=group.record()), group, None))
            group.dirty = False
        while group.deleted and len(out) < budget:
            out.append((Write(group.name, group.deleted.pop()), group, None))
        for slot in group.slots.values():
            if slot.dirty and len(out) < budget:
                write = Write(group.name, slot.slot_id, slot.record(), slot.version)
                out.append((write, group, slot))
                slot.dirty = False

    @staticmethod
    def _collect_letters(group: Group, out: list[tuple[Write, Group, Slot | None]]) -> None:
        """The group's dead-letter steps not written yet, with its redriven letters' new slots,
        all in this commit (a step is at most work_dlq_step_max letters: within the budget)."""
        if not group.chunks_out:
            return
        for chunk, record in group.chunks_out:
            out.append((Write(group.name, chunk, record, -1), group, None))
        group.chunks_out = []
        for slot in group.slots.values():
            if slot.letter and slot.dirty and slot.version < 0:
                out.append((Write(group.name, slot.slot_id, slot.record(), -1), group, slot))
                slot.dirty = False

    def _finish(self) -> None:
        commit, writes, seqs = self._commit, self._in_commit, self._seqs
        self._commit, self._in_commit, self._seqs = None, [], []
        assert commit is not None
        try:
            versions = commit.versions()
        except StaleWrite as error:
            log.error("%s: %s: another monitor writes this queue's groups; reading them again",
                      self.name, error)  # fmt: skip
            self.groups.clear()
            self.ids.clear()
            self._loaded, self._next_try = False, 0.0
            return
        except CoordinationError as error:
            self._failed(writes, error)
            return
        self._failed_at = 0.0
        for (write, group, slot), version in zip(writes, versions, strict=True):
            if slot is None:
                continue
            created, slot.version = write.version < 0, version
            if created and slot.slot_id not in group.slots:  # done while being created
                group.deleted.append(slot.slot_id)
        for member, applied in seqs:
            member.written = max(member.written, applied)

    def _failed(self, writes: list[tuple[Write, Group, Slot | None]], error: Exception) -> None:
        """Kept for the next commit: what was in this one is dirty again."""
        self.failed_writes += 1
        self._failed_at = time.monotonic()
        log.warning("%s: consumer group state not written yet: %s", self.name, error)
        for write, group, slot in writes:
            if slot is not None:
                slot.dirty = True
            elif write.slot and write.record is not None:  # a dead-letter step (none else)
                group.chunks_out.append((write.slot, write.record))
            elif write.slot:
                group.deleted.append(write.slot)
            else:
                group.dirty = True

    # --- requests: their routes in the placement socket's table (service.py) ------------------
    def routes(self) -> dict[int, Route[Any, Envelope | None]]:
        """Each group command's message class and handler: a handler is given the typed
        request (a LEASE its envelope too: None when it may not be held) and returns the typed
        reply. Every one is BUSY until the groups are read back from ZooKeeper."""
        return {
            MonitorCommand.GROUP_JOIN: route(GroupJoin.decode, self.join),
            MonitorCommand.GROUP_LEASE: Route(ConsumerRequest.decode, self.lease),
            MonitorCommand.GROUP_SETTLE: route(Settle.decode, self.settle),
            MonitorCommand.GROUP_RELEASE: route(ConsumerRequest.decode, self.release),
            MonitorCommand.GROUP_LEAVE: route(ConsumerRequest.decode, self.leave),
            MonitorCommand.GROUP_INFO: route(GroupInfo.decode, self.info),
            MonitorCommand.GROUP_DELETE: route(GroupDelete.decode, self.delete),
            MonitorCommand.GROUP_DEAD_LETTERS: route(DeadLetters.decode, self.dead_letters),
        }

    def _synced(self, ask: GroupJoin | Settle | ConsumerRequest, reply: W) -> W | Refused:
        """`reply` once everything applied so far is stored (ZooKeeper, or the state log's
        copies), with `Written`: up to which `Seq` the asking consumer's settles are (JOIN,
        RELEASE, LEAVE, a SETTLE with `Sync`)."""
        if not self.sync():
            return Refused(
                Reason.BUSY,
                "consumer groups: not stored yet (its store did not take "
                "it in time: ZooKeeper, or the state log's copies; retriable)",
            )
        group = self.groups.get(ask.group)
        member = group.members.get(ask.consumer) if group else None
        return replace(reply, written=member.written if member else 0)

    def _answered(self, reply: E) -> E:
        """A reply sent before its changes are written: they go with the next commit."""
        self.pump()
        return reply

    # --- held LEASEs (request/response workers, docs/requests.md) -----------------------------
    # An idle Worker's consumer asks with a LEASE it lets the monitor hold for work_poll_ms
    # (its idle poll): a requester's first TASK_GET, right after its request was published,
    # wakes one held consumer of the service's group, which reads the log's end at once,
    # instead of at its next poll.
    def _hold(self, ask: ConsumerRequest, reply: Encodable, envelope: Envelope | None) -> bool:
        if ask.wait_ms <= 0 or not isinstance(reply, NoSlot) or self._reply is None:
            return False
        if envelope is None or self.holding >= limits.work_lease_waiters_max:
            return False  # answered at once: its consumer sleeps instead
        deadline = time.monotonic() + ask.wait_ms / 1000
        self._held.setdefault(ask.group, []).append(_Held(ask, envelope, deadline))
        self.holding += 1
        return True

    def wake(self, group_name: str) -> None:
        """A request of the group's service was published: answer its oldest held LEASE. With
        none held (its worker is between two LEASEs, reading the logs: often on a loaded
        machine), the wake is kept (`work_lease_wake_kept_ms`) for the group's next waiting
        LEASE: answered at once, as woken, if it finds no slot, rather than held a whole wait
        past the request it would have found; one that finds a slot took what woke it."""
        held = self._held.get(group_name)
        if held:
            self._answer_held(group_name, held.pop(0), woken=True)
        elif group_name in self.groups:  # bounded: one entry per existing group
            self._wake_due[group_name] = time.monotonic() + limits.work_lease_wake_kept_ms / 1000

    def _woken_on_arrival(self, ask: ConsumerRequest, reply: Encodable) -> bool:
        """A waiting LEASE takes the wake kept for its group (`wake`): woken if it found no
        slot (it reads the logs' ends at once)."""
        if ask.wait_ms <= 0:
            return False
        kept = self._wake_due.pop(ask.group, 0.0) > time.monotonic()
        return kept and isinstance(reply, NoSlot)

    def next_deadline(self) -> float | None:
        """When the first held LEASE's wait ends (monotonic), if one is held."""
        if not self.holding:
            return None
        return min(held[0].deadline for held in self._held.values() if held)

    def expire_waits(self) -> None:
        """Answer the held LEASEs whose wait ended (as any LEASE: a slot cut meanwhile, or
        where the logs may have grown)."""
        if not self.holding:
            return
        now = time.monotonic()
        for group_name, held in list(self._held.items()):
            while held and held[0].deadline <= now:
                self._answer_held(group_name, held.pop(0))

    def release_waits(self, reply: Encodable) -> None:
        """Answer every held LEASE with `reply` (the monitor is fenced)."""
        held = [h for waiting in self._held.values() for h in waiting]
        self._held.clear()
        self.holding = 0
        if self._reply is not None:
            for item in held:
                self._reply(item.envelope, reply)

    def _answer_held(self, group_name: str, item: _Held, woken: bool = False) -> None:
        self.holding -= 1
        if not self._held.get(group_name):
            self._held.pop(group_name, None)
        answer: Encodable
        try:
            answer = self._lease(item.ask)
        except Exception as error:  # the request decoded when it came; answer it whatever
            log.exception("%s: a held LEASE failed", self.name)
            answer = Refused(Reason.INTERNAL, f"internal error: {error!r}")
        if self._reply is not None:
            self._reply(item.envelope, HeldAnswer(answer, woken))

    def _member(self, group_name: str, consumer: str) -> tuple[Group, Member] | None:
        group = self.groups.get(group_name)
        if group is None:
            return None
        member = group.members.get(consumer)
        if member is None:
            if len(group.members) >= limits.work_consumers_max:
                return None
            member = group.members[consumer] = Member(consumer, time.monotonic())
        member.last_seen = time.monotonic()
        return group, member

    def join(self, join: GroupJoin) -> Encodable:
        """20: the group is created if new; answered once written."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        group = self.groups.get(join.group)
        if group is None:
            if len(self.groups) >= limits.work_groups_max:
                return Refused(Reason.NO_CAPACITY, f"already {limits.work_groups_max} groups")
            group = Group(join.group, join.ordered or join.key_parts > 0, join.start,
                          join.prefix, parts=join.key_parts)  # fmt: skip
            group.single_active = join.single_active
            self.groups[join.group] = group
            if join.start == "now":  # what the logs hold now is not this group's
                group.cursors = dict(self.ends)
            log.info("%s: consumer group %s created (from %s%s, key prefix %r)", self.name,
                     join.group, join.start, ", ordered" if join.ordered else "",
                     join.prefix)  # fmt: skip
        elif join.prefix and join.prefix != group.prefix:
            return Refused(Reason.BAD_REQUEST, f"group {join.group} takes key prefix "
                           f"{group.prefix!r}, not {join.prefix!r}")  # fmt: skip
        elif join.single_active and not group.single_active:
            return Refused(Reason.BAD_REQUEST, f"group {join.group} was created without "
                           "single active consumer: delete it to create it so")  # fmt: skip
        elif join.key_parts and join.key_parts != group.parts:
            return Refused(Reason.BAD_REQUEST, f"group {join.group} has {group.parts} key "
                           f"parts (0: not key-ordered), not {join.key_parts}")  # fmt: skip
        if self._member(join.group, join.consumer) is None:
            return Refused(Reason.NO_CAPACITY, f"already {limits.work_consumers_max} consumers")
        selection.join(group, join.consumer, join.priority, join.inflight)
        log.info("%s: consumer %s joined group %s", self.name, join.consumer, join.group)
        rules = self.rules
        dlq = dead_letter_queue(self.queue, group.name)
        lease_ms = int(rules.lease_s * 1000)
        joined = Joined(lease_ms, rules.inflight, rules.max_deliveries, group.ordered, dlq,
                        group.prefix, self.slot_messages,
                        single_active=group.single_active, key_parts=group.parts,
                        dedup=self.window_ms > 0)  # fmt: skip
        return self._synced(join, joined)

    def lease(self, ask: ConsumerRequest, envelope: Envelope | None) -> Answer:
        """21: the next slot; with none due and a `Wait`, held (None) until woken or its wait
        ends (`_answer_held`), when `envelope` is given."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        reply = self._lease(ask)
        self.pump()
        if self._woken_on_arrival(ask, reply):
            return HeldAnswer(reply, woken=True)
        return None if self._hold(ask, reply, envelope) else reply

    def _lease(self, ask: ConsumerRequest) -> Lease | NoSlot | Refused:
        found = self._member(ask.group, ask.consumer)
        if found is None:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {ask.group} (join it first)")
        self._note_seen(ask.seen)
        return self._lease_for(*found, ask.give)

    def _note_seen(self, seen: tuple[Tail, ...]) -> None:
        """Where consumers read a live exchange's log to end (whole batches): past its last
        report, so the open range can be cut there now rather than at the next report."""
        for tail in seen:
            known = self.ends.get(tail.exchange)
            if known is not None and tail.offset > max(known, self.seen.get(tail.exchange, 0)):
                self.seen[tail.exchange] = tail.offset

    def _lease_for(self, group: Group, member: Member, give: int) -> Lease | NoSlot:
        """The next slot for `member`, with its first `give` messages handed out at once (one
        request instead of two); or, with none, where the live logs may have grown."""
        now, wall = time.monotonic(), time.time()
        member.standby = not selection.may_take(
            group, member.consumer, now, self.rules.lease_s, self.rules.inflight
        )
        if member.standby:
            member.waiting_since = 0.0  # not waiting for a share: no slot is split or cut for it
            return NoSlot()  # another consumer takes the work: no log to look at
        readable = self._readable()
        ends = {x: max(end, self.seen.get(x, 0)) for x, end in self.ends.items()}
        slot = group.lease(member.consumer, now, wall, self.rules, set(readable), ends)
        if slot is None or not self._readable_to_end(slot, readable):
            if slot is not None:
                group.release(slot)
            return NoSlot(self._tails(group, readable))
        endpoint, leader, _ = readable[slot.exchange]
        counted = sorted(slot.deliveries)
        window = None
        if give > 0:  # a slot not counted yet: the consumer ignores what lies past its end
            room = self.rules.inflight - member.in_flight(group.slots)
            window = self._settled(slot, group.give(slot, _window(slot, give), room, wall,
                                                    self.rules))  # fmt: skip
        settled = sorted_ranges(slot.outside() + ranges(slot.settled))
        return Lease(
            slot.slot_id, slot.exchange, endpoint, leader, slot.start, slot.end, slot.count,
            tuple(settled), tuple(counted), tuple(slot.deliveries[i] for i in counted),
            window=window, part=slot.part,
        )  # fmt: skip

    @staticmethod
    def _tails(group: Group, readable: Readable) -> tuple[Tail, ...]:
        """Where each live log's open range starts, for a consumer that found no slot."""
        tails = [
            Tail(x, endpoint, group.cursors[x])
            for x, (endpoint, leader, _) in readable.items()
            if not leader and x in group.cursors
        ]
        return tuple(tails[: limits.work_tail_exchanges_max])

    def _readable_to_end(self, slot: Slot, readable: Readable) -> bool:
        _, leader, end = readable[slot.exchange]
        return max(end, 0 if leader else self.seen.get(slot.exchange, 0)) >= slot.end

    @staticmethod
    def _settled(slot: Slot, result: GiveResult, done: bool = False) -> Settled:
        return Settled(
            tuple(result.given), tuple(result.deliveries), tuple(result.expired),
            tuple(slot.deliveries.get(i, 0) for i in result.expired),
            tuple(slot.reasons.get(i, "") for i in result.expired),
            result.clipped, False, done,
        )  # fmt: skip

    def _owned(
        self, group_name: str, consumer: str, slot_id: str
    ) -> tuple[Group, Member, Slot | None] | None:
        found = self._member(group_name, consumer)
        if found is None:
            return None
        group, member = found
        slot = group.slots.get(slot_id)
        return group, member, slot

    def settle(self, settle: Settle) -> Encodable:
        """22: answered at once (its changes go with the next commit), or with `Sync` once
        written."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        found = self._owned(settle.group, settle.consumer, settle.slot)
        if found is None:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {settle.group}")
        group, member, slot = found
        member.applied = max(member.applied, settle.seq)
        if slot is None:  # deleted: everything in it was settled (by this consumer or before)
            result = Settled(lost=True, done=True)
        else:
            duplicates = self._deduplicate(group, slot, settle)
            result = replace(self._apply(group, member, slot, settle), duplicates=duplicates)
        after = self._lease_for(group, member, settle.next_give) if settle.next_give >= 0 else None
        reply = replace(result, written=member.written, epoch=self.epoch,
                        next=None if after is None else after.encode())  # fmt: skip
        return self._synced(settle, reply) if settle.sync else self._answered(reply)

    def _deduplicate(self, group: Group, slot: Slot, settle: Settle) -> tuple[int, ...]:
        """The slot's records named in `Ids` whose id the group's window holds from another
        place: settled as duplicates (before anything of the request is handed out), as
        flattened ranges for the consumer, which hands none of them out."""
        if not settle.ids or not self.window_ms:
            return ()
        window = self.ids.get(group.name)
        if window is None:
            window = self.ids[group.name] = GroupIds(self.window_ms)
        entries = [
            (index, message_id) for index, message_id in unpack_ids(settle.ids)
            if index not in slot.settled and slot.holds(index)
        ]  # fmt: skip
        where = (slot.exchange, slot.start, slot.part)
        found = sorted(window.check(where, entries, int(time.time() * 1000)))
        group.drop_duplicates(slot, found)
        return tuple(ranges(found))

    def _apply(self, group: Group, member: Member, slot: Slot, settle: Settle) -> Settled:
        if slot.count < 0 <= settle.count:
            group.count(slot, settle.count)
            if deadletters.evicted(group, slot):
                log.warning("%s: dead letter %s of group %s redriven, but retention deleted its "
                            "message (%s): back to the dead letters", self.name, slot.letter,
                            group.name, slot.slot_id)  # fmt: skip
            group.share(slot, time.monotonic())
        # Acks and dead letters count whoever sends them: the work was done.
        group.skip(slot, expand(settle.skip))
        group.ack(slot, settle.acks, member)
        group.dead(slot, settle.dead)
        group.drop_expired(slot, settle.ttl_expired)
        if slot.owner != settle.consumer:
            return Settled(lost=True, done=group.drop_if_done(slot))
        wall = time.time()
        for nack in settle.nacks:
            group.nack(slot, nack.index, nack.delay_ms, nack.reason, wall, self.rules)
        for later in settle.defer:
            group.defer(slot, later.index, later.until_ms / 1000)
        slot.lease_until = time.monotonic() + self.rules.lease_s  # progress renews the lease
        room = self.rules.inflight - member.in_flight(group.slots)
        result = group.give(slot, settle.give, room, wall, self.rules)
        done = group.drop_if_done(slot)
        if settle.release and not done:
            group.release(slot)
        return self._settled(slot, result, done)

    def release(self, ask: ConsumerRequest) -> Encodable:
        """23: the slot is given back; answered once written."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        found = self._owned(ask.group, ask.consumer, ask.slot)
        if found is None:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {ask.group}")
        group, _, slot = found
        if slot is not None and slot.owner == ask.consumer and not group.drop_if_done(slot):
            group.release(slot)
        return self._synced(ask, Synced("released"))

    def leave(self, ask: ConsumerRequest) -> Encodable:
        """24: the consumer's slots go back to the group; answered once written."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        group = self.groups.get(ask.group)
        if group is not None:
            group.leave(ask.consumer)
            selection.forget(group, {ask.consumer})
            log.info("%s: consumer %s left group %s", self.name, ask.consumer, ask.group)
        return self._synced(ask, Synced("left"))

    def info(self, ask: GroupInfo) -> Encodable:
        """25: one group's view, or every group's."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        if ask.group and ask.group not in self.groups:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {ask.group} on {self.queue}")
        names = [ask.group] if ask.group else sorted(self.groups)
        return self._answered(Groups(tuple(self._view(self.groups[n]) for n in names)))

    def views(self, most: int) -> list[tuple[GroupView, int]]:
        """The first `most` groups by name, each with its redeliveries (for its metrics);
        none while they are not read back yet."""
        if not self._loaded:
            return []
        groups = [self.groups[name] for name in sorted(self.groups)[:most]]
        return [(self._view(group), group.redelivered) for group in groups]

    def ttl_expired(self) -> dict[str, int]:
        """Group name → messages dropped past their expiry since the monitor started."""
        return {name: group.ttl_expired for name, group in self.groups.items()}

    def _view(self, group: Group) -> GroupView:
        now = time.monotonic()
        slots = list(group.slots.values())
        active = selection.active(group, now, self.rules.lease_s) if group.single_active else ""
        uncut = sum(max(0, end - group.cursors.get(x, 0)) for x, end in self.ends.items())
        return GroupView(
            group.name,
            group.ordered,
            len(slots),
            sum(1 for s in slots if s.owner),
            sum(s.unsettled() for s in slots),
            sum(1 for s in slots if s.count < 0),
            uncut,
            sum(len(s.handed) for s in slots),
            group.acked,
            group.dead_letters,
            dead_letter_queue(self.queue, group.name),
            tuple(_consumer_view(group, m, now, active) for m in group.members.values()),
            group.prefix,
            group.single_active,
            group.duplicates,
        )

    def delete(self, ask: GroupDelete) -> Encodable:
        """26: the group and its znodes go (at once, not by a commit)."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        if self.groups.pop(ask.group, None) is None:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {ask.group} on {self.queue}")
        self._wake_due.pop(ask.group, None)
        self.ids.pop(ask.group, None)
        try:
            self.store.delete_group(ask.group)
        except CoordinationError as error:
            return Refused(Reason.BUSY, f"group {ask.group} not deleted: {error}")
        log.info("%s: consumer group %s deleted", self.name, ask.group)
        return self._answered(Done("deleted"))

    def dead_letters(self, ask: DeadLetters) -> Encodable:
        """27: one step of a redrive or purge, answered once it is stored: everything pending
        is written first, so the step's writes are the next commit alone (atomic)."""
        if not self._ensure_loaded():
            return _NOT_LOADED
        group = self.groups.get(ask.group)
        if group is None:
            return Refused(Reason.UNKNOWN_QUEUE, f"no group {ask.group} on {self.queue}")
        if ask.action == Action.CHECK:
            return deadletters.apply(group, ask)  # changes nothing
        if not self.sync():
            return Refused(Reason.BUSY, f"group {ask.group}: earlier changes not stored yet")
        try:
            reply = deadletters.apply(group, ask)
        except deadletters.Refusal as refusal:
            return Refused(Reason.CONFLICT, str(refusal))
        if reply.done or reply.merged:
            log.info("%s: %s of group %s: %d letters (%d already, %d merged)", self.name,
                     ask.action, group.name, reply.done, reply.already, reply.merged)  # fmt: skip
        if not self.sync():  # stored later: the step run again finds them `Already`
            return Refused(Reason.BUSY, f"group {ask.group}: step not stored yet (run it again)")
        return reply

    # --- from the monitor's loop --------------------------------------------------------------
    def observe(self, exchange: str, end: int, cuts: tuple[int, ...], final: bool = False) -> None:
        """An exchange's report (or, `final`, the copy of a dead one's log): cut slots."""
        if not final:
            self.ends[exchange] = end
        else:
            self.ends.pop(exchange, None)
        if final or self.seen.get(exchange, 0) <= end:
            self.seen.pop(exchange, None)
        if not self._loaded:
            return
        now = time.monotonic()
        for group in self.groups.values():
            group.observe(exchange, end, cuts, now, self.slot_s, final)
            if not final and group.hungry(now):  # consumers wait: what came is theirs now
                group.cut_open({exchange: end}, {exchange})
            if group.barriers:
                keyed.observed(group, exchange, end, now)

    def moved_from(self, exchange: str, drain_s: float) -> None:
        """The monitor moves publishers off `exchange` (they drain it within `drain_s`): a
        barrier in every key-ordered group (keyed.py)."""
        now = time.monotonic()
        for group in self.groups.values():
            if group.parts:
                keyed.moved_from(group, exchange, now, drain_s)

    def gone(self, exchange: str) -> None:
        """`exchange` left or died: a key-ordered group's barriers on it end where its log
        was last reported to end, or where its copy does (keyed.py)."""
        end = self.ends.get(exchange, 0)
        for group in self.groups.values():
            if group.barriers:
                keyed.gone(group, exchange, end)

    def tick(self) -> None:
        """Leases past their end go back to their group; then what changed is written."""
        if not self._ensure_loaded():
            return
        now = time.monotonic()
        for group in self.groups.values():
            before = set(group.members)
            expired = group.expire(now, self.rules)
            selection.forget(group, before - set(group.members))
            for slot in expired:
                log.warning("%s: group %s: the lease of slot %s expired (consumer silent for "
                            "%.1f s): %d message(s) go back", self.name, group.name, slot.slot_id,
                            self.rules.lease_s, len(slot.suspects))  # fmt: skip
        self.pump()

    def close(self) -> None:
        self.sync()


def _consumer_view(group: Group, member: Member, now: float, active: str) -> ConsumerView:
    return ConsumerView(
        member.consumer, len(member.slots), member.in_flight(group.slots), member.acked,
        now - member.last_seen, selection.priority(group, member.consumer),
        member.consumer == active,
    )  # fmt: skip


def _ms(entry: object) -> int:
    """The time of a window record's entry (0 if it is not one: skipped on restore)."""
    if isinstance(entry, list) and entry and isinstance(entry[-1], int):
        return entry[-1]
    return 0


def _window(slot: Slot, give: int) -> Sequence[int]:
    """What a LEASE's `Give` asks for: the slot's first `give` messages not settled (its
    consumer counts the same ones from the `Settled` it is sent); of a slot never read, the
    first `give` indices."""
    if slot.count < 0:
        return range(slot.first, slot.first + give)
    wanted: list[int] = []
    for index in range(slot.first, slot.stop):
        if index not in slot.settled:
            wanted.append(index)
            if len(wanted) >= give:
                break
    return wanted


def sorted_ranges(flat: list[int]) -> list[int]:
    """Flattened [lo, hi) ranges, in order of `lo` (they do not overlap)."""
    pairs = sorted(zip(flat[::2], flat[1::2], strict=True))
    return [edge for pair in pairs for edge in pair]
