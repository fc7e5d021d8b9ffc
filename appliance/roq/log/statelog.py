"""A keyed state store kept as a roq Log: a changelog, like Kafka's compacted `__consumer_offsets`
(docs/log-format.md §11). The storage core of the delivery state (task records, consumer-group
slot states, HTTP topic heads) that ZooKeeper keeps today; not yet used by the monitor.

A change is a key (a string) and a value (bytes), or None: a tombstone, which deletes the key.
Each record is a BSON document {"k": key, "n": version, "v": value} ("v" absent in a
tombstone), and the changes of one `append` are one batch: one write, kept or lost whole.
Versions live in the records, so replaying the files, or a copy's bytes, gives the same ones.

Versions: a key's first write is version 1 and each write (a tombstone too) adds 1, so a version
a caller read names one state of that key for good. A key written again after its tombstone goes
on from the tombstone's version. Compaction drops tombstones but keeps their versions in a
*floor* (the highest version any dropped tombstone had, written at the start of each snapshot):
a key that is absent and has no tombstone starts above it. So a stale version never matches
again, before or after compaction, and `expect` makes an append a compare-and-set.

Compaction does not rewrite offsets (replication copies a log by byte offset): it starts a new
segment, appends a snapshot there (every live key's record, same version, in batches keyed
b"snapshot"), makes it durable, and only then deletes the segments before it. A crash in between
leaves the old segments and part of a snapshot restating current values: a replay still gives
the right state. The log must keep no retention of its own, which would delete live state.

Standard library, roq.log and bson only. A StateLog, like its Log, belongs to one thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

import bson
from bson.errors import BSONError

from roq import limits
from roq.errors import (
    ConfigError,
    CorruptRecord,
    InvalidChange,
    LogError,
    StateConflict,
)
from roq.log import format as fmt
from roq.log.log import FlushPolicy, Log, LogSettings, ReadStatus, Retention, sync_directory

log = logging.getLogger(__name__)

CHANGES = b"state"  # the batch key of an append's batch
SNAPSHOT = b"snapshot"  # ... and of a snapshot's: a reader can tell them apart
KINDS = (CHANGES, SNAPSHOT)
FLOOR_KEY = ""  # a StateRecord's key for a snapshot's floor record ({"floor": N} on disk)


@dataclass(frozen=True, slots=True)
class Change:
    """Set `key` to `value`, or delete it (`value` None). With `expect`, only if the key is at
    that version now (0: only if it is absent); otherwise the whole append is refused."""

    key: str
    value: bytes | None
    expect: int | None = None


class StateRecord(NamedTuple):
    """One record of a state log, decoded."""

    key: str  # FLOOR_KEY for a snapshot's floor record
    version: int  # the key's version after this write; the floor for a floor record
    value: bytes | None  # None: a tombstone (or the floor record)


class Entry(NamedTuple):
    """A live key's current record."""

    value: bytes
    version: int
    offset: int  # the offset of the batch holding its record
    size: int  # bytes its record takes in the batch (head and BSON), counted in live_bytes


Planned = tuple[StateRecord, bytes]  # a record and its BSON payload


def encode_record(record: StateRecord) -> bytes:
    doc: dict[str, Any]
    if record.key == FLOOR_KEY:
        doc = {"floor": record.version}
    else:
        doc = {"k": record.key, "n": record.version}
        if record.value is not None:
            doc["v"] = record.value
    return bytes(bson.encode(doc))


def decode_record(payload: bytes) -> StateRecord | None:
    """The record a payload holds, or None if it is not a state record (fields it does not
    know are ignored: a later version may add some)."""
    try:
        doc = bson.decode(payload)
    except (BSONError, ValueError, TypeError, IndexError, OverflowError):
        return None
    if "k" not in doc:
        floor = doc.get("floor")
        return StateRecord(FLOOR_KEY, int(floor), None) if _is_count(floor, 0) else None
    key, version, value = doc["k"], doc.get("n"), doc.get("v")
    if not (isinstance(key, str) and 0 < len(key) <= limits.state_key_chars_max):
        return None
    if not _is_count(version, 1) or not (value is None or isinstance(value, bytes)):
        return None
    return StateRecord(key, int(version), value)


def _is_count(value: object, lowest: int) -> TypeGuard[int]:
    """An integer in [lowest, int64_max]; bson decodes one past 32 bits as Int64 (an int)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return lowest <= value <= limits.int64_max


def _space(key: str) -> str:
    """A key's first path part, with its "/" ("task/" of "task/abc"); a key without one is its
    own."""
    cut = key.find("/")
    return key if cut < 0 else key[: cut + 1]


class _Image:
    """The state a sequence of batches describes: built by a replay or from a copy's bytes, and
    kept up to date by the StateLog's own appends (through `apply`, the one way it changes)."""

    def __init__(self, name: str, producer_id: bytes):
        self.name = name  # for warnings: the log's name (its directory) or the copy's
        self.producer_id = producer_id
        self.live: dict[str, Entry] = {}
        # the live keys by their first path part ("task/", "http/"...): a prefix read scans its
        # part, not every key (the task collector's twice a second, beside 300,000 topic keys,
        # took a quarter of a core)
        self.spaces: dict[str, set[str]] = {}
        self.tombs: dict[str, int] = {}  # key → its tombstone's version, until compaction
        self.floor = 0
        self.live_bytes = 0
        self.next_seq = 0  # first_seq of the next batch this producer writes
        self.read_to = -1  # the end offset of the last batch applied
        self.corrupt_batches = 0
        self.corrupt_records = 0

    def found(self, key: str) -> int:
        """The key's version, 0 if it is absent."""
        entry = self.live.get(key)
        return entry.version if entry is not None else 0

    def last_version(self, key: str) -> int:
        """The highest version the key may have had: its next write takes the one after."""
        entry = self.live.get(key)
        if entry is not None:
            return entry.version
        return max(self.tombs.get(key, 0), self.floor)

    def apply(self, record: StateRecord, offset: int, size: int) -> None:
        if record.key == FLOOR_KEY:
            self.floor = max(self.floor, record.version)
            return
        old = self.live.pop(record.key, None)
        space = self.spaces.setdefault(_space(record.key), set())
        if old is not None:
            self.live_bytes -= old.size
        if record.value is None:
            self.tombs[record.key] = record.version
            space.discard(record.key)
        else:
            self.tombs.pop(record.key, None)
            self.live[record.key] = Entry(record.value, record.version, offset, size)
            self.live_bytes += size
            space.add(record.key)

    def apply_batch(self, buf: bytes, at: int, header: fmt.BatchHeader) -> None:
        """Apply the records of the CRC-checked batch at `at`. A batch that is no state batch,
        has torn records or repeats one already applied is skipped whole, a record that is no
        state record alone; each is counted and logged."""
        offset = header.base_offset
        try:
            records = self._records(buf, at, header)
        except CorruptRecord as error:
            self.bad_batch(f"the batch at offset {offset}", str(error))
            return
        self.read_to = offset + header.size
        bad = 0
        for record in records:
            decoded = decode_record(record.payload)
            if decoded is None:
                bad += 1
            else:
                self.apply(decoded, offset, fmt.RECORD_BYTES + len(record.payload))
        if header.producer_id == self.producer_id:
            self.next_seq = max(self.next_seq, header.last_seq + 1)
        if bad:
            self.corrupt_records += bad
            log.warning(
                "state log %s: %d of the %d records of the batch at offset %d are no state "
                "records; skipped",
                self.name,
                bad,
                len(records),
                offset,
            )

    def _records(self, buf: bytes, at: int, header: fmt.BatchHeader) -> list[fmt.Record]:
        if header.key not in KINDS:
            raise CorruptRecord(f"its key {header.key!r} is not a state log's")
        if header.base_offset < self.read_to:
            # A chunk handed twice: applying it again would bring back older values.
            raise CorruptRecord(f"it repeats one applied (up to offset {self.read_to})")
        return list(fmt.iter_records(buf, at))  # CorruptRecord if a record is torn

    def bad_batch(self, where: str, why: str) -> None:
        self.corrupt_batches += 1
        log.warning("state log %s: %s is skipped: %s", self.name, where, why)

    def take_chunk(self, chunk: bytes) -> None:
        """Apply a chunk of whole batches as a log read returns them. A batch that fails its
        check is counted, and reading goes on at the next valid batch in the chunk."""
        at = 0
        while at < len(chunk):
            try:
                header = fmt.check_batch(chunk, at)
            except CorruptRecord as error:
                resume = _next_batch_in(chunk, at)
                self.bad_batch(f"byte {at} of a chunk", f"{error}; {resume - at} bytes skipped")
                at = resume
                continue
            self.apply_batch(chunk, at, header)
            at += header.size


def _next_batch_in(chunk: bytes, at: int) -> int:
    """The first position past `at` where a CRC-valid batch begins, else the chunk's end."""
    magic = bytes([fmt.MAGIC])
    found = chunk.find(magic, at + 1 + fmt.CRC_START)
    while found != -1:
        try:
            fmt.check_batch(chunk, found - fmt.CRC_START)
            return found - fmt.CRC_START
        except CorruptRecord:
            found = chunk.find(magic, found + 1)
    return len(chunk)


def _replay(state_log: Log, image: _Image) -> None:
    """Apply every batch of the log, in order. A damaged batch is counted and skipped (reading
    goes on where `Log.next_sound_batch` says); a gap between segments is jumped over."""
    offset = state_log.start_offset
    while offset < state_log.end_offset:
        gap = next((gap for gap in state_log.gaps if gap[0] <= offset < gap[1]), None)
        if gap is not None:
            log.warning(
                "state log %s: offsets %d..%d are missing (a segment file is gone): their "
                "changes are lost",
                state_log.name,
                gap[0],
                gap[1],
            )
            offset = gap[1]
            continue
        try:
            result = state_log.read(offset, limits.log_scan_chunk_bytes)
        except CorruptRecord as error:
            resume = state_log.next_sound_batch(offset)
            image.bad_batch(f"the batch at offset {offset}", f"{error}; resuming at {resume}")
            offset = resume
            continue
        if result.status is not ReadStatus.BATCHES:
            break
        for at, header in fmt.iter_batches(result.data):
            image.apply_batch(result.data, at, header)
        offset = result.next_offset


def _check_open(settings: LogSettings, producer_id: bytes) -> None:
    if settings.retention != Retention():
        raise ConfigError("a state log is kept by compaction: retention would delete live state")
    if len(producer_id) != 16:
        raise ValueError(f"a producer id has 16 bytes, not {len(producer_id)}")


def _check_change(change: Change) -> None:
    key, value = change.key, change.value
    if not isinstance(key, str) or not 0 < len(key) <= limits.state_key_chars_max:
        size = len(key) if isinstance(key, str) else type(key).__name__
        raise InvalidChange(
            f"a state key has 1 to {limits.state_key_chars_max} characters "
            f"(limits.state_key_chars_max), not {size}"
        )
    try:
        key.encode()
    except UnicodeEncodeError:
        raise InvalidChange(f"state key {key!r} is not valid UTF-8") from None
    if value is not None and not isinstance(value, bytes):
        raise InvalidChange(f"state key {key!r}: a value is bytes, not {type(value).__name__}")
    if value is not None and len(value) > limits.state_value_bytes_max:
        raise InvalidChange(
            f"state key {key!r}: a value of {len(value)} bytes exceeds "
            f"limits.state_value_bytes_max ({limits.state_value_bytes_max})"
        )
    if change.expect is not None and not _is_count(change.expect, 0):
        raise InvalidChange(f"state key {key!r}: expected version {change.expect!r}")


def _batch_bytes(kind: bytes, planned: Sequence[Planned]) -> int:
    return fmt.HEADER_BYTES + len(kind) + sum(fmt.RECORD_BYTES + len(p) for _, p in planned)


@dataclass
class _Compaction:
    """A compaction under way: where its snapshot starts, the keys live when it began (in
    order; `done` of them restated), and the tombstones the floor record covers."""

    start: int
    keys: list[str]
    tombs: dict[str, int]
    done: int = 0


class StateLog:
    """Keyed state in a Log of its own; see the module's docstring. Open with `open` (or build
    from a copy with `restore`); `log` is the Log, for the replication that copies it."""

    def __init__(self, state_log: Log, producer_id: bytes, image: _Image):
        self.log = state_log
        self.producer_id = producer_id
        self._image = image
        self._compaction: _Compaction | None = None  # a compaction under way, in slices

    @classmethod
    def open(
        cls, directory: Path | str, settings: LogSettings, producer_id: bytes, *, name: str = ""
    ) -> StateLog:
        """Open (or create) the state log in `directory` and rebuild its state by replaying
        every batch. The Log's own recovery has cut a torn tail off the last segment; a damaged
        batch or record elsewhere is skipped, counted and logged, never fatal."""
        _check_open(settings, producer_id)
        state_log = Log.open(directory, settings, name=name)
        try:
            image = _Image(state_log.name, producer_id)
            _replay(state_log, image)
            return cls(state_log, producer_id, image)
        except BaseException:
            state_log.close()
            raise

    # --- reading ------------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, version) of a live key, None if it is absent."""
        entry = self._image.live.get(key)
        return None if entry is None else (entry.value, entry.version)

    def keys(self, prefix: str = "") -> list[str]:
        """The live keys starting with `prefix`, sorted (a prefix with a "/" reads the keys of
        its first part only)."""
        image = self._image
        found = image.spaces.get(_space(prefix), ()) if "/" in prefix else image.live
        return sorted(key for key in found if key.startswith(prefix))

    def __len__(self) -> int:
        return len(self._image.live)

    def entry(self, key: str) -> Entry | None:
        """A live key's current record, with the offset of its batch."""
        return self._image.live.get(key)

    @property
    def live_bytes(self) -> int:
        """Bytes the live keys' current records take: what a snapshot would write."""
        return self._image.live_bytes

    @property
    def corrupt_batches(self) -> int:
        """Batches skipped while building the state (damaged, torn, not a state batch)."""
        return self._image.corrupt_batches

    @property
    def corrupt_records(self) -> int:
        """Records of sound batches skipped because they are no state records."""
        return self._image.corrupt_records

    @property
    def start_offset(self) -> int:
        return self.log.start_offset

    @property
    def end_offset(self) -> int:
        return self.log.end_offset

    @property
    def durable_offset(self) -> int:
        """Below it, every batch is on stable storage: acknowledge a change once its batch's
        offset is below it."""
        return self.log.durable_offset

    # --- writing ------------------------------------------------------------------------------
    def append(self, changes: Sequence[Change]) -> int:
        """Write the changes as one batch (a group commit of one caller turn; later changes of
        a key see the earlier ones) and return its offset. If any change's `expect` does not
        hold, StateConflict names it and nothing is written; InvalidChange if a change is past
        a bound or the changes do not fit one batch (split the turn). Durable once flushed."""
        if not changes:
            raise InvalidChange("an append writes at least one change")
        planned = self._plan(changes)
        size = _batch_bytes(CHANGES, planned)
        if size > fmt.batch_bytes_max:
            raise InvalidChange(
                f"{len(changes)} changes take {size} bytes, past one batch "
                f"(limits.batch_bytes_max, {fmt.batch_bytes_max}): split them over appends"
            )
        return self._write_batch(CHANGES, planned)

    def _plan(self, changes: Sequence[Change]) -> list[Planned]:
        """Each change's record, with its version; StateConflict at a failed expectation."""
        turn: dict[str, tuple[int, int]] = {}  # key → (found, last version) after this turn
        planned = []
        for change in changes:
            _check_change(change)
            key = change.key
            found, last = turn.get(key) or (self._image.found(key), self._image.last_version(key))
            if change.expect is not None and change.expect != found:
                raise StateConflict(key, change.expect, found)
            record = StateRecord(key, last + 1, change.value)
            turn[key] = (0 if change.value is None else last + 1, last + 1)
            planned.append((record, encode_record(record)))
        return planned

    def _write_batch(self, kind: bytes, planned: Sequence[Planned]) -> int:
        """Append one batch of planned records and apply them. If the Log raises after the
        batch reached its file (a failed fdatasync), the records are applied all the same: a
        replay would apply them."""
        image = self._image
        now = time.time_ns() // 1000
        payloads = [payload for _, payload in planned]
        stamps = [now] * len(payloads)
        batch = fmt.encode_batch(self.producer_id, image.next_seq, kind, payloads, stamps)
        end = self.log.end_offset
        try:
            return self.log.append(bytearray(batch))
        finally:
            if self.log.end_offset > end:
                image.next_seq += len(planned)
                image.read_to = self.log.end_offset
                for record, payload in planned:
                    image.apply(record, end, fmt.RECORD_BYTES + len(payload))

    def flush(self) -> None:
        """Force every append to stable storage (fdatasync): the owner calls it once per turn
        before acknowledging (the `every-batch` policy already syncs each append)."""
        self.log.flush()

    def tick(self) -> None:
        """The Log's timers (the `interval` policy's flush): call from the owner's loop."""
        self.log.tick()

    # --- compaction ---------------------------------------------------------------------------
    def should_compact(self) -> bool:
        """Whether the log outgrew its live state: longer than limits.state_compact_min_bytes
        and than limits.state_compact_ratio times live_bytes."""
        size = self.end_offset - self.start_offset
        bound = max(limits.state_compact_min_bytes, limits.state_compact_ratio * self.live_bytes)
        return size > bound

    def maybe_compact(self) -> bool:
        """One slice of compaction (at most limits.state_compact_keys_per_turn keys), starting
        one if the log outgrew its live state (limits.state_compact_*); for the owner's loop,
        whose appends go on between slices. Returns whether a compaction ended."""
        if self._compaction is None:
            if not self.should_compact():
                return False
            self._compaction = self._begin_compaction()
        return self._compact_slice(limits.state_compact_keys_per_turn) is not None

    def compact(self) -> int:
        """Compact now, whole (or finish the one under way). Returns where the log starts."""
        if self._compaction is None:
            self._compaction = self._begin_compaction()
        start = None
        while start is None:
            start = self._compact_slice(len(self._compaction.keys))
        return start

    # A snapshot restates, from a new segment, the floor and then every key live when it began,
    # as each is when its slice is written. Appends made meanwhile land after its start too, so
    # when the last slice is written every live key has a record at or after the start, and
    # every segment before it can go. A crash midway leaves a partial snapshot: restatements,
    # harmless to a replay, dropped by the next compaction.
    def _begin_compaction(self) -> _Compaction:
        image = self._image
        start = self.log.roll()
        floor = max([image.floor, *image.tombs.values()])
        record = StateRecord(FLOOR_KEY, floor, None)
        self._write_batch(SNAPSHOT, [(record, encode_record(record))])
        return _Compaction(start, sorted(image.live), dict(image.tombs))

    def _compact_slice(self, count: int) -> int | None:
        """Restate the next `count` keys; at the last, make it durable and drop the segments
        before its start, which it returns (None while keys are left)."""
        compaction = self._compaction
        assert compaction is not None
        keys = compaction.keys[compaction.done : compaction.done + count]
        compaction.done += len(keys)
        self._restate(keys)
        if compaction.done < len(compaction.keys):
            return None
        self._compaction = None
        self.flush()
        dropped = self.log.drop_before(compaction.start)
        for key, version in compaction.tombs.items():  # the floor record keeps their versions
            if self._image.tombs.get(key) == version:
                del self._image.tombs[key]
        log.info(
            "state log %s: compacted: %d keys, %d live bytes from offset %d, %d segments deleted",
            self.log.name, len(self), self.live_bytes, compaction.start, dropped,
        )  # fmt: skip
        return compaction.start

    def _restate(self, keys: Sequence[str]) -> None:
        """Append each key's current record (a key deleted since is gone: its tombstone is
        already after the snapshot's start), packed into batches of about
        limits.state_snapshot_batch_bytes."""
        batch: list[Planned] = []
        size = _batch_bytes(SNAPSHOT, batch)
        for key in keys:
            entry = self._image.live.get(key)
            if entry is None:
                continue
            record = StateRecord(key, entry.version, entry.value)
            item = (record, encode_record(record))
            if size + fmt.RECORD_BYTES + len(item[1]) > limits.state_snapshot_batch_bytes and batch:
                self._write_batch(SNAPSHOT, batch)
                batch, size = [], _batch_bytes(SNAPSHOT, [])
            batch.append(item)
            size += fmt.RECORD_BYTES + len(item[1])
        if batch:
            self._write_batch(SNAPSHOT, batch)

    # --- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close the Log (a clean stop loses nothing)."""
        self.log.close()

    def __enter__(self) -> StateLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def restore(
    directory: Path | str,
    settings: LogSettings,
    producer_id: bytes,
    chunks: Iterable[bytes],
    *,
    name: str = "",
) -> StateLog:
    """Build a state log in `directory` (absent or empty) from a copy: `chunks` are whole
    batches as a read of another state log returns them, from its start, in order. The new log
    holds a snapshot of the state they describe (not their bytes: its owner starts a log of its
    own), written in a scratch directory beside it, made durable, then renamed into place: a
    crash leaves no half-built log where `open` would take it for the state. Damaged batches
    and records of the copy are skipped and counted in the returned log's counters."""
    directory = Path(directory)
    _check_open(settings, producer_id)
    if directory.exists() and any(directory.iterdir()):
        raise LogError(f"state log {directory}: not empty; restore makes a new log")
    image = _Image(name or f"copy for {directory}", producer_id)
    for chunk in chunks:
        image.take_chunk(bytes(chunk))
    scratch = directory.with_name(directory.name + ".restoring")
    shutil.rmtree(scratch, ignore_errors=True)  # a crashed restore's
    # A roll syncs the segment it closes under every policy but `os`: the copy must be durable.
    durable = settings
    if settings.flush.kind == "os":
        durable = replace(settings, flush=FlushPolicy("interval"))
    with StateLog(Log.open(scratch, durable), producer_id, image) as new:
        new.compact()  # the copy's state, restated in the new log
    os.replace(scratch, directory)  # an empty directory is replaced
    sync_directory(directory.parent, f"state log {directory}")
    restored = StateLog.open(directory, settings, producer_id, name=name)
    restored._image.corrupt_batches += image.corrupt_batches
    restored._image.corrupt_records += image.corrupt_records
    return restored
