"""Work queues: what consumers of a group ask their queue's monitor (B+1, commands 20–26), and the
group views the GCM's admin API passes on (2020–2022). docs/protocol.md, "Consumer groups".

A message of a slot is named by its index: the i-th record of the slot's offset range
[Start, End) of one exchange's log, in log order. The monitor never sees a payload.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_bool, field_docs, field_int, field_list, field_str
from roq.protocol.commands import AdminCommand, MonitorCommand
from roq.protocol.dispatch import Encodable
from roq.protocol.names import check_queue_name

FROM_CHOICES = ("beginning", "now")
_ITEMS = limits.work_items_per_request_max
_SLOT_ID_CHARS = 290  # "<exchange id>@<offset>[#<first index>]"
_COUNT_MAX = limits.work_slot_messages_max


def check_group_name(name: str) -> str:
    """A group names a znode and, with its queue, the dead-letter queue `<queue>.<group>.dlq`."""
    if len(name) > limits.work_group_name_chars_max:
        raise DecodeError(
            f"group name {name!r} is longer than {limits.work_group_name_chars_max} characters"
        )
    return check_queue_name(name)


def dead_letter_queue(queue: str, group: str) -> str:
    return f"{queue}.{group}.dlq"[: limits.queue_name_chars_max]


def field_indices(doc: Mapping[str, Any], name: str, *, prefix: str = "") -> tuple[int, ...]:
    """A list of message indices of one slot (each 0 ≤ i < work_slot_messages_max)."""
    values = field_list(doc, name, max_items=_ITEMS, default=[], prefix=prefix)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _COUNT_MAX:
            raise DecodeError(f"the {prefix}{name} field must hold indices below {_COUNT_MAX}")
    return tuple(values)


def _group(doc: Mapping[str, Any], empty_ok: bool = False) -> str:
    name = field_str(doc, "Group", empty_ok=empty_ok, max_chars=limits.work_group_name_chars_max)
    return check_group_name(name) if name else name


def _consumer(doc: Mapping[str, Any]) -> str:
    return field_str(doc, "Consumer", max_chars=limits.producer_id_chars_max)


def field_prefix(doc: Mapping[str, Any], name: str = "Prefix") -> bytes:
    """A routing-key prefix (binary, at most a routing key long); absent: b"" (every key)."""
    value = doc.get(name, b"")
    if not isinstance(value, bytes) or len(value) > limits.key_bytes_max:
        raise DecodeError(
            f"the {name} field must be binary of at most {limits.key_bytes_max} bytes"
        )
    return value


def ranges(indices: Iterable[int]) -> list[int]:
    """Sorted indices as flattened [lo, hi) ranges, the form `Settled` and `Skip` travel in:
    compact for a slot mostly settled in order."""
    out: list[int] = []
    for i in sorted(indices):
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out += [i, i + 1]
    return out


def expand(flat: Sequence[int]) -> Iterator[int]:
    """The indices of flattened [lo, hi) ranges."""
    for lo, hi in zip(flat[::2], flat[1::2], strict=True):
        yield from range(lo, hi)


@dataclass(frozen=True)
class GroupJoin:
    """20: `Consumer` joins `Group`, which is created if new (from the `From` position, taking
    the messages whose routing key starts with `Prefix`). Joining an existing group with
    another prefix is refused."""

    group: str
    consumer: str
    start: str = "beginning"  # From
    ordered: bool = False  # Ordered (only when the group is created)
    prefix: bytes = b""  # Prefix (only when the group is created; b"": every key)
    # issue 33, item 6 (monitor/selection.py): Priority (higher first), Inflight (this
    # consumer's prefetch; 0: the group's), SingleActive (only when the group is created)
    priority: int = 0
    inflight: int = 0
    single_active: bool = False
    key_parts: int = 0  # KeyParts: a key-ordered group's (only when created; 0: not keyed)

    def encode(self) -> Document:
        doc = {"CMD": int(MonitorCommand.GROUP_JOIN), "Group": self.group,
               "Consumer": self.consumer, "From": self.start, "Ordered": self.ordered,
               "Prefix": self.prefix, "Priority": self.priority, "Inflight": self.inflight,
               "SingleActive": self.single_active}  # fmt: skip
        if self.key_parts:
            doc["KeyParts"] = self.key_parts
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        start = field_str(doc, "From", default="beginning")
        if start not in FROM_CHOICES:
            raise DecodeError(f"the From field must be one of {FROM_CHOICES}")
        most = limits.work_consumer_priority_max
        return cls(_group(doc), _consumer(doc), start, field_bool(doc, "Ordered", default=False),
                   field_prefix(doc), field_int(doc, "Priority", lo=-most, hi=most, default=0),
                   field_int(doc, "Inflight", hi=limits.work_inflight_max, default=0),
                   field_bool(doc, "SingleActive", default=False), _key_parts(doc))  # fmt: skip


@dataclass(frozen=True)
class Joined:
    """The reply to 20: the group's settings, which the consumer follows."""

    lease_ms: int
    inflight: int
    max_deliveries: int
    ordered: bool
    dead_letters: str  # the dead-letter queue's name
    prefix: bytes = b""  # the group's routing-key prefix: the consumer skips other keys
    slot_messages: int = 1000  # SlotMessages: a slot cut on demand holds about this many
    written: int = 0  # Written: this consumer's settles up to this Seq are in ZooKeeper
    single_active: bool = False  # SingleActive: the group's (monitor/selection.py)
    key_parts: int = 0  # KeyParts: a key-ordered group's parts (0: not key-ordered)
    # Dedup: the group hands out a message id once within its window: the consumer sends the
    # ids of a slot's records (`Settle.ids`) before it hands any of them out
    dedup: bool = False

    def encode(self) -> Document:
        doc = bsonmsg.ok(LeaseMs=self.lease_ms, Inflight=self.inflight,
                         MaxDeliveries=self.max_deliveries, Ordered=self.ordered,
                         DeadLetters=self.dead_letters, Prefix=self.prefix,
                         SlotMessages=self.slot_messages, Written=self.written,
                         SingleActive=self.single_active)  # fmt: skip
        if self.key_parts:
            doc["KeyParts"] = self.key_parts
        if self.dedup:
            doc["Dedup"] = True
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_int(doc, "LeaseMs", lo=1),
            field_int(doc, "Inflight", lo=1),
            field_int(doc, "MaxDeliveries", lo=1),
            field_bool(doc, "Ordered"),
            check_queue_name(field_str(doc, "DeadLetters")),
            field_prefix(doc),
            field_int(doc, "SlotMessages", lo=1, hi=_COUNT_MAX, default=1000),
            field_int(doc, "Written", default=0),
            field_bool(doc, "SingleActive", default=False),
            _key_parts(doc),
            field_bool(doc, "Dedup", default=False),
        )


def _key_parts(doc: Mapping[str, Any]) -> int:
    """A key-ordered group's parts (monitor/keyed.py); absent: 0, not key-ordered."""
    return field_int(doc, "KeyParts", lo=0, hi=limits.work_key_parts_max, default=0)


@dataclass(frozen=True)
class Tail:
    """Where a live exchange's log is past the group's last slot: `From` is the start of the
    open range, read at `Endpoint`. In a no-slot answer (`Tails`), so that a waiting consumer
    can look whether the log grew since the exchange's last report."""

    exchange: str
    endpoint: str = ""
    offset: int = 0  # From (in a reply) or End (in `Seen`: the log holds whole batches to it)

    def fields(self) -> Document:
        return {"Exchange": self.exchange, "Endpoint": self.endpoint, "From": self.offset}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Exchange", max_chars=_SLOT_ID_CHARS, prefix=prefix),
            bsonmsg.field_endpoint(doc, "Endpoint", empty_ok=True, default="", prefix=prefix),
            field_int(doc, "From", hi=limits.log_offset_max, prefix=prefix),
        )


def field_tails(doc: Mapping[str, Any], name: str) -> tuple[Tail, ...]:
    if name not in doc:
        return ()
    return field_docs(doc, name, Tail.decode, max_items=limits.work_tail_exchanges_max)


@dataclass(frozen=True)
class ConsumerRequest:
    """21 GROUP_LEASE, 23 GROUP_RELEASE (of `Slot`), 24 GROUP_LEAVE: who asks, and of what.
    A LEASE may ask for the first `Give` messages of the slot in the same answer (its
    `Window`), and tell in `Seen` where the consumer found an exchange's log to end (it read
    it after a `Tails` answer): the monitor cuts the open range there for it. A LEASE with
    `Wait` (ms, at most `limits.work_lease_wait_max_ms`) that finds no slot may be held until
    the monitor learns that a request of the group's service was published (a requester's
    TASK_GET), or a report cut a slot, or `Wait` ends: then it is answered as any LEASE."""

    command: MonitorCommand
    group: str
    consumer: str
    slot: str = ""
    give: int = 0
    seen: tuple[Tail, ...] = ()
    wait_ms: int = 0

    def encode(self) -> Document:
        doc: Document = {"CMD": int(self.command), "Group": self.group,
                         "Consumer": self.consumer, "Slot": self.slot, "Give": self.give,
                         "Seen": [t.fields() for t in self.seen]}  # fmt: skip
        if self.wait_ms > 0:  # absent otherwise: a monitor of an older version answers at once
            doc["Wait"] = self.wait_ms
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        command = MonitorCommand(bsonmsg.command(doc))
        slot = field_str(doc, "Slot", empty_ok=True, default="", max_chars=_SLOT_ID_CHARS)
        give = field_int(doc, "Give", hi=_ITEMS, default=0)
        wait_ms = min(field_int(doc, "Wait", default=0), limits.work_lease_wait_max_ms)
        return cls(command, _group(doc), _consumer(doc), slot, give, field_tails(doc, "Seen"),
                   wait_ms)  # fmt: skip


@dataclass(frozen=True)
class Lease:
    """The reply to 21 with a slot: read [Start, End) of `Exchange`'s log at `Endpoint` (a
    copy's holder, with `Leader` as the read's last frame, when the exchange is dead).
    `Settled`: flattened [lo, hi) ranges of indices already settled; `Counted`/`Deliveries`:
    how often each unsettled index was handed out; `Count`: the slot's messages, -1 unknown."""

    slot: str
    exchange: str
    endpoint: str
    leader: str
    start: int
    end: int
    count: int
    settled: tuple[int, ...] = ()
    counted: tuple[int, ...] = ()
    deliveries: tuple[int, ...] = ()
    not_before: float = 0.0  # epoch s: none of its messages is due before this
    window: Settled | None = None  # what of the slot is handed out at once (LEASE's `Give`)
    part: int = -1  # Part: a key-ordered group's key part (its records only); -1: every record

    def encode(self) -> Document:
        doc = bsonmsg.ok(
            Slot=self.slot, Exchange=self.exchange, Endpoint=self.endpoint, Leader=self.leader,
            Start=self.start, End=self.end, Count=self.count, Settled=list(self.settled),
            Counted=list(self.counted), Deliveries=list(self.deliveries),
            NotBefore=self.not_before,
        )  # fmt: skip
        if self.window is not None:
            doc["Window"] = self.window.encode()
        if self.part >= 0:
            doc["Part"] = self.part
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        lease = cls(
            field_str(doc, "Slot", max_chars=_SLOT_ID_CHARS),
            field_str(doc, "Exchange", max_chars=_SLOT_ID_CHARS),
            bsonmsg.field_endpoint(doc, "Endpoint"),
            field_str(doc, "Leader", empty_ok=True, max_chars=_SLOT_ID_CHARS),
            field_int(doc, "Start", hi=limits.log_offset_max),
            field_int(doc, "End", hi=limits.log_offset_max),
            field_int(doc, "Count", lo=-1, hi=_COUNT_MAX),
            field_indices(doc, "Settled"),
            field_indices(doc, "Counted"),
            field_indices(doc, "Deliveries"),
            bsonmsg.field_float(doc, "NotBefore", lo=0.0, default=0.0),
            _window(doc),
            field_int(doc, "Part", lo=-1, hi=limits.work_key_parts_max - 1, default=-1),
        )
        if len(lease.counted) != len(lease.deliveries) or len(lease.settled) % 2:
            raise DecodeError(
                "a lease's Counted and Deliveries differ in length, or Settled is odd"
            )
        return lease


def _window(doc: Mapping[str, Any]) -> Settled | None:
    window = doc.get("Window")
    if window is None:
        return None
    if not isinstance(window, Mapping):
        raise DecodeError("the Window field must be a document")
    return Settled.decode(window)


@dataclass(frozen=True)
class NoSlot:
    """The reply to 21 with no slot due now (`Slot: ""`): where each live log's open range
    starts (`Tails`), for the consumer to look whether it grew since its exchange's report."""

    tails: tuple[Tail, ...] = ()

    def encode(self) -> Document:
        return bsonmsg.ok("no slot", Slot="", Tails=[t.fields() for t in self.tails])

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        if field_str(doc, "Slot", empty_ok=True):
            raise DecodeError("the Slot field of a no-slot answer must be empty")
        return cls(field_tails(doc, "Tails"))


@dataclass(frozen=True)
class HeldAnswer:
    """A held 21's answer (its `Wait`), sent when it is woken or its wait ends: the answer it
    would have had then (a `Lease`, a `NoSlot`, or a refusal), with `Held: true` (its consumer
    asks again at once: it did wait) and `Woken` (by a requester's wait, else its wait ended)."""

    answer: Encodable
    woken: bool = False

    def encode(self) -> Document:
        return {**self.answer.encode(), "Held": True, "Woken": self.woken}

    @staticmethod
    def flags(doc: Mapping[str, Any]) -> tuple[bool, bool]:
        """(held, woken) of a LEASE answer; both False in one answered at once."""
        return field_bool(doc, "Held", default=False), field_bool(doc, "Woken", default=False)


def written(doc: Mapping[str, Any]) -> int:
    """`Written` of a SETTLE's answer (0 when absent): this consumer's settles up to this Seq
    are stored."""
    return field_int(doc, "Written", default=0)


def lease_reply(doc: Mapping[str, Any]) -> Lease | tuple[Tail, ...]:
    """A LEASE answer (or a SETTLE's `Next`): the slot, or where the logs may have grown."""
    if doc.get("Slot"):
        return Lease.decode(doc)
    return field_tails(doc, "Tails")


@dataclass(frozen=True)
class Nack:
    index: int  # I
    delay_ms: int  # DelayMs: -1 for the group's back-off
    reason: str = ""

    def fields(self) -> Document:
        return {"I": self.index, "DelayMs": self.delay_ms, "Reason": self.reason}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_int(doc, "I", hi=_COUNT_MAX - 1, prefix=prefix),
            field_int(doc, "DelayMs", lo=-1, hi=limits.work_delay_max_ms, prefix=prefix),
            field_str(doc, "Reason", empty_ok=True, default="", prefix=prefix,
                      max_chars=limits.work_reason_chars_max),
        )  # fmt: skip


@dataclass(frozen=True)
class Defer:
    """A message whose not-before time has not come: hand it to no consumer before `UntilMs`
    (wall-clock ms since the epoch); a hand-out of it in this lease did not happen."""

    index: int  # I
    until_ms: int  # UntilMs

    def fields(self) -> Document:
        return {"I": self.index, "UntilMs": self.until_ms}

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_int(doc, "I", hi=_COUNT_MAX - 1, prefix=prefix),
            field_int(doc, "UntilMs", prefix=prefix),
        )


@dataclass(frozen=True)
class Settle:
    """22: settle messages of one leased slot and ask for more of it. `Acks`: done; `Nacks`:
    to hand out again after a delay; `Dead`: the consumer put them on the dead-letter queue
    (rejected, or past max deliveries); `Give`: indices the consumer wants to hand out next;
    `Count`: the slot's messages (the consumer read it; -1 if it did not yet); `Skip`:
    flattened [lo, hi) ranges of indices outside the group's key prefix, settled for this group
    without being handed out or counted as acked. Any 22 renews the slot's lease (in_progress
    is an empty one). `Defer`: messages not due yet (their not-before time), put off;
    `TtlExpired`: messages past their expiry, settled without being handed out (counted).
    `Ids`: the message ids of records of the slot, packed (`pack_ids`), for the group's
    de-duplication window (monitor/groupids.py): the monitor settles those it already had
    from another place and names them in `Settled`'s `Duplicates`."""

    group: str
    consumer: str
    slot: str
    count: int = -1
    acks: tuple[int, ...] = ()
    nacks: tuple[Nack, ...] = ()
    dead: tuple[int, ...] = ()
    give: tuple[int, ...] = ()
    skip: tuple[int, ...] = ()  # flattened [lo, hi) ranges
    seq: int = 0  # Seq: this consumer's numbering of its settles (`Written` answers it)
    sync: bool = False  # Sync: answer once this is in ZooKeeper (flush, close)
    release: bool = False  # Release: give the slot back after this (RELEASE in one request)
    next_give: int = -1  # Next: lease the next slot too, with this many given (-1: do not)
    defer: tuple[Defer, ...] = ()  # Defer: not due yet (TTL and delay)
    ttl_expired: tuple[int, ...] = ()  # TtlExpired: past their expiry, dropped
    ids: bytes = b""  # Ids: (index, message id) entries, `pack_ids`

    def encode(self) -> Document:
        doc: Document = {
            "CMD": int(MonitorCommand.GROUP_SETTLE), "Group": self.group,
            "Consumer": self.consumer, "Slot": self.slot, "Count": self.count,
            "Acks": list(self.acks), "Nacks": [n.fields() for n in self.nacks],
            "Dead": list(self.dead), "Give": list(self.give), "Skip": list(self.skip),
            "Seq": self.seq, "Sync": self.sync, "Release": self.release, "Next": self.next_give,
        }  # fmt: skip
        if self.defer or self.ttl_expired:  # absent otherwise: a settle as before
            doc["Defer"] = [d.fields() for d in self.defer]
            doc["TtlExpired"] = list(self.ttl_expired)
        if self.ids:
            doc["Ids"] = self.ids
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        settle = cls(
            _group(doc), _consumer(doc), field_str(doc, "Slot", max_chars=_SLOT_ID_CHARS),
            field_int(doc, "Count", lo=-1, hi=_COUNT_MAX, default=-1),
            field_indices(doc, "Acks"),
            field_docs(doc, "Nacks", Nack.decode, max_items=_ITEMS) if "Nacks" in doc else (),
            field_indices(doc, "Dead"), field_indices(doc, "Give"), field_indices(doc, "Skip"),
            field_int(doc, "Seq", default=0), field_bool(doc, "Sync", default=False),
            field_bool(doc, "Release", default=False),
            field_int(doc, "Next", lo=-1, hi=_ITEMS, default=-1),
            field_docs(doc, "Defer", Defer.decode, max_items=_ITEMS) if "Defer" in doc else (),
            field_indices(doc, "TtlExpired"),
            field_ids(doc),
        )  # fmt: skip
        # ascending and apart: what the monitor expands is bounded by a slot's size
        if len(settle.skip) % 2 or list(settle.skip) != sorted(set(settle.skip)):
            raise DecodeError("the Skip field must hold ascending, disjoint [lo, hi) ranges")
        return settle


@dataclass(frozen=True)
class Settled:
    """The reply to 22. `Given`/`Deliveries`: what may be handed out now, with its delivery
    count (this one included); `Expired`/`ExpiredCounts`: handed out `max.deliveries` times
    already, to be put on the dead-letter queue; `Clipped`: asked for but not given because of
    the in-flight limit; `Lost`: the lease is gone (expired, or the slot was deleted)."""

    given: tuple[int, ...] = ()
    deliveries: tuple[int, ...] = ()
    expired: tuple[int, ...] = ()
    expired_counts: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()  # the last nack reason of each expired index
    clipped: int = 0
    lost: bool = False
    done: bool = False  # every message of the slot is settled: the slot is deleted
    written: int = 0  # Written: this consumer's settles up to this Seq are in ZooKeeper
    epoch: str = ""  # Life: this monitor process (a new one may lack what the old one took)
    next: Document | None = None  # Next: the LEASE answer for the next slot (SETTLE's Next)
    # Duplicates: flattened [lo, hi) ranges of the indices of `Ids` settled as duplicates
    duplicates: tuple[int, ...] = ()

    def encode(self) -> Document:
        doc = bsonmsg.ok(
            Given=list(self.given), Deliveries=list(self.deliveries),
            Expired=list(self.expired), ExpiredCounts=list(self.expired_counts),
            Reasons=list(self.reasons), Clipped=self.clipped, Lost=self.lost, Done=self.done,
            Written=self.written, Life=self.epoch,
        )  # fmt: skip
        if self.next is not None:
            doc["Next"] = self.next
        if self.duplicates:
            doc["Duplicates"] = list(self.duplicates)
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(
            field_indices(doc, "Given"), field_indices(doc, "Deliveries"),
            field_indices(doc, "Expired"), field_indices(doc, "ExpiredCounts"),
            bsonmsg.field_strs(doc, "Reasons", max_items=_ITEMS, empty_ok=True,
                               max_chars=limits.work_reason_chars_max),
            field_int(doc, "Clipped", hi=_ITEMS), field_bool(doc, "Lost"),
            field_bool(doc, "Done"), field_int(doc, "Written", default=0),
            field_str(doc, "Life", empty_ok=True, default="", max_chars=_SLOT_ID_CHARS),
            _next(doc),
            field_indices(doc, "Duplicates"),
        )  # fmt: skip


ID_ENTRY_BYTES = 4 + 16  # an index (uint32, little-endian) and its record's message id


def pack_ids(entries: Iterable[tuple[int, bytes]]) -> bytes:
    """(index, 16-byte message id) pairs as `Settle`'s `Ids`: 20 bytes each."""
    return b"".join(index.to_bytes(4, "little") + message_id for index, message_id in entries)


def unpack_ids(packed: bytes) -> list[tuple[int, bytes]]:
    return [
        (int.from_bytes(packed[at : at + 4], "little"), packed[at + 4 : at + ID_ENTRY_BYTES])
        for at in range(0, len(packed), ID_ENTRY_BYTES)
    ]


def field_ids(doc: Mapping[str, Any]) -> bytes:
    """`Ids`: whole entries, at most `work_dedup_ids_per_request_max` of them; absent: none."""
    value = doc.get("Ids", b"")
    most = limits.work_dedup_ids_per_request_max
    if not isinstance(value, bytes) or len(value) % ID_ENTRY_BYTES:
        raise DecodeError(f"the Ids field must be binary, {ID_ENTRY_BYTES} bytes an entry")
    if len(value) > most * ID_ENTRY_BYTES:
        raise DecodeError(f"the Ids field holds {len(value) // ID_ENTRY_BYTES} ids, "
                          f"more than {most}")  # fmt: skip
    return value


def _next(doc: Mapping[str, Any]) -> Document | None:
    found = doc.get("Next")
    if found is None:
        return None
    if not isinstance(found, Mapping):
        raise DecodeError("the Next field must be a document")
    return dict(found)


@dataclass(frozen=True)
class Synced:
    """The reply to 23 and 24, sent once their change is in ZooKeeper: `Written` as in a
    `Settled`."""

    comment: str  # "released", "left"
    written: int = 0

    def encode(self) -> Document:
        return bsonmsg.ok(self.comment, Written=self.written)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(bsonmsg.Reply.decode(doc).comment, field_int(doc, "Written"))


# --- views: 25 GROUP_INFO and the admin API's 2020/2021 -----------------------------------------
@dataclass(frozen=True)
class ConsumerView:
    consumer: str  # Id
    slots: int  # Slots leased
    in_flight: int  # InFlight: handed out, not settled
    acked: int  # Acked since it joined
    idle_s: float  # Idle: since its last request
    priority: int = 0  # Priority (monitor/selection.py)
    active: bool = False  # Active: the group's single active consumer (a single-active group)

    def fields(self) -> Document:
        return {"Id": self.consumer, "Slots": self.slots, "InFlight": self.in_flight,
                "Acked": self.acked, "Idle": self.idle_s, "Priority": self.priority,
                "Active": self.active}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", prefix=prefix), field_int(doc, "Slots", prefix=prefix),
            field_int(doc, "InFlight", prefix=prefix), field_int(doc, "Acked", prefix=prefix),
            bsonmsg.field_float(doc, "Idle", lo=0.0, prefix=prefix),
            field_int(doc, "Priority", lo=-limits.work_consumer_priority_max,
                      hi=limits.work_consumer_priority_max, default=0, prefix=prefix),
            field_bool(doc, "Active", default=False, prefix=prefix),
        )  # fmt: skip


@dataclass(frozen=True)
class GroupView:
    name: str
    ordered: bool
    slots: int  # live slots (not deleted)
    leased: int  # of which leased
    lag: int  # messages not settled in known slots, plus those of slots not yet counted (-1)
    uncounted: int  # slots whose messages no consumer counted yet
    uncut: int  # bytes of logs past the last slot (not yet cut)
    in_flight: int
    acked: int  # since the monitor started
    dead_letters: int  # since the monitor started
    dead_letter_queue: str
    consumers: tuple[ConsumerView, ...] = field(default=())
    prefix: bytes = b""
    single_active: bool = False  # SingleActive (monitor/selection.py)
    duplicates: int = 0  # Duplicates: copies of ids settled, not handed out (monitor start on)

    def fields(self) -> Document:
        return {
            "Name": self.name, "Ordered": self.ordered, "Slots": self.slots,
            "Leased": self.leased, "Lag": self.lag, "Uncounted": self.uncounted,
            "Uncut": self.uncut, "InFlight": self.in_flight, "Acked": self.acked,
            "DeadLetters": self.dead_letters, "DeadLetterQueue": self.dead_letter_queue,
            "Consumers": [c.fields() for c in self.consumers], "Prefix": self.prefix,
            "SingleActive": self.single_active, "Duplicates": self.duplicates,
        }  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        def number(name: str) -> int:
            return field_int(doc, name, prefix=prefix)

        return cls(
            field_str(doc, "Name", prefix=prefix), field_bool(doc, "Ordered", prefix=prefix),
            number("Slots"), number("Leased"), number("Lag"), number("Uncounted"),
            number("Uncut"), number("InFlight"), number("Acked"), number("DeadLetters"),
            field_str(doc, "DeadLetterQueue", prefix=prefix),
            field_docs(doc, "Consumers", ConsumerView.decode, prefix=prefix,
                       max_items=limits.work_consumers_max),
            field_prefix(doc),
            field_bool(doc, "SingleActive", default=False, prefix=prefix),
            field_int(doc, "Duplicates", default=0, prefix=prefix),
        )  # fmt: skip


@dataclass(frozen=True)
class GroupInfo:
    """25 (monitor) or 2020/2021 (admin, with `QName`): one group, or all when `Group` is ""."""

    group: str = ""
    queue: str = ""  # QName, admin only

    def encode(self) -> Document:
        if self.queue:
            command = AdminCommand.GET_GROUP if self.group else AdminCommand.LIST_GROUPS
            return {"CMD": int(command), "QName": self.queue, "Group": self.group}
        return {"CMD": int(MonitorCommand.GROUP_INFO), "Group": self.group}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        queue = field_str(doc, "QName", default="")
        return cls(_group(doc, empty_ok=True) if "Group" in doc else "",
                   check_queue_name(queue) if queue else "")  # fmt: skip

    @classmethod
    def decode_admin(cls, doc: Mapping[str, Any]) -> Self:
        """2020/2021 on the GCM's admin API, where `QName` is required."""
        queue = check_queue_name(field_str(doc, "QName"))
        return cls(_group(doc, empty_ok=True) if "Group" in doc else "", queue)


@dataclass(frozen=True)
class GroupDelete:
    """26 (monitor) or 2022 (admin, with `QName`)."""

    group: str
    queue: str = ""

    def encode(self) -> Document:
        if self.queue:
            return {"CMD": int(AdminCommand.DELETE_GROUP), "QName": self.queue,
                    "Group": self.group}  # fmt: skip
        return {"CMD": int(MonitorCommand.GROUP_DELETE), "Group": self.group}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        queue = field_str(doc, "QName", default="")
        return cls(_group(doc), check_queue_name(queue) if queue else "")

    @classmethod
    def decode_admin(cls, doc: Mapping[str, Any]) -> Self:
        """2022 on the GCM's admin API, where `QName` is required."""
        queue = check_queue_name(field_str(doc, "QName"))
        return cls(_group(doc), queue)


@dataclass(frozen=True)
class Groups:
    """The reply to 25, 2020, 2021."""

    groups: tuple[GroupView, ...]

    def encode(self) -> Document:
        return bsonmsg.ok(Groups=[g.fields() for g in self.groups])

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_docs(doc, "Groups", GroupView.decode, max_items=limits.work_groups_max))
