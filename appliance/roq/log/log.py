"""The message log of one exchange (and key space): ordered segments in one directory, a memory
log of the tail, a flush policy, retention, and recovery on open (DESIGN §5, docs/log-format.md).

Offsets are byte positions in the log: a batch's offset is where its first byte lies, the next
batch's offset is that plus the batch's size. So `read(offset)` finds its segment by bisecting
the segments' base offsets and seeks; there is no index to keep or rebuild.

A Log is owned by one thread (the exchange's main thread), which alone calls its methods, so
the log's own state takes no lock. Two helpers run beside it and hand over through their own
locks: the flusher (`flusher.py`, the `interval` policy's fdatasync on a duplicated descriptor)
and the process's janitor (`janitor.py`, unlinking retired segments).
"""

from __future__ import annotations

import enum
import logging
import os
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from roq import limits
from roq.errors import ConfigError, CorruptRecord, InvalidOffset, LogUnavailable
from roq.log import format as fmt
from roq.log import janitor
from roq.log.flusher import Flusher
from roq.log.memory import MemoryLog
from roq.log.segment import (
    DIR_MODE,
    Segment,
    SegmentCorrupt,
    find_next_batch,
    parse_segment_name,
)

log = logging.getLogger(__name__)

FLUSH_KINDS = ("every-batch", "interval", "os")


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When appended bytes are forced to stable storage (fdatasync). See docs/log-format.md:
    every-batch: durable before append() returns; interval: at most `interval_ms` of appends
    (plus the caller's tick period) can be lost on a power failure; os: the kernel decides, a
    process crash loses nothing but a power failure may lose anything not yet written back."""

    kind: str = "interval"
    interval_ms: int = 200

    def __post_init__(self) -> None:
        if self.kind not in FLUSH_KINDS:
            raise ConfigError(f"log.flush: {self.kind!r} is not one of {', '.join(FLUSH_KINDS)}")
        if self.interval_ms < 1:
            raise ConfigError(f"log.flush.interval.ms: {self.interval_ms} must be at least 1")

    @classmethod
    def parse(cls, text: str, interval_ms: int = 200) -> FlushPolicy:
        """`every-batch`, `os`, `interval` (uses `interval_ms`) or `interval:N` (N ms)."""
        kind, _, ms = text.strip().partition(":")
        if ms:
            if kind != "interval" or not ms.isdigit():
                raise ConfigError(f"log.flush: cannot parse {text!r}")
            return cls(kind, int(ms))
        return cls(kind, interval_ms)


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep at least this much of the log (0 = no limit of that kind); whole closed segments
    are deleted, oldest first, while what remains still satisfies every non-zero limit. `ms` is
    compared with a segment's newest batch timestamp."""

    bytes: int = 0
    ms: int = 0
    records: int = 0


@dataclass(frozen=True, slots=True)
class LogSettings:
    """How one log is kept; built from HCM.properties by `roq.config.log_settings`."""

    max_file_size: int = 64 * 1024 * 1024
    flush: FlushPolicy = field(default_factory=FlushPolicy)
    retention: Retention = field(default_factory=Retention)
    memory_bytes: int = 64 * 1024 * 1024


def sync_directory(directory: Path, what: str) -> None:
    """fsync a directory: its entries (a new file, a rename) survive a crash. LogUnavailable
    naming `what` if the disk refuses."""
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise LogUnavailable(f"{what}: cannot sync directory {directory}: {error}") from None


def log_directory(root: Path | str, queue: str, exchange_id: str) -> Path:
    """`<directory>/<queue>/<exchange_id>/`: where one exchange keeps its log."""
    return Path(root) / queue / exchange_id


_RETIRED = "RETIRED"  # not a segment name: Log.open skips it


def mark_retired(directory: Path, why: str) -> None:
    """Mark a lost exchange's log directory retired: its log and copies are held by live
    exchanges, so no log keeper serves them again (host/keepers.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _RETIRED).write_text(why + "\n")


def is_retired(directory: Path) -> bool:
    return (directory / _RETIRED).exists()


def state_root(root: Path | str, queue: str) -> Path:
    """Where one host keeps `queue`'s monitor's delivery-state logs (deleted with the queue)."""
    return Path(root) / "_state" / queue


def state_directory(root: Path | str, queue: str, leader_id: str) -> Path:
    """`<directory>/_state/<queue>/<leader id>/`: the state log of one monitor epoch."""
    return state_root(root, queue) / leader_id


def replica_root(root: Path | str, queue: str) -> Path:
    """Where one host keeps every copy of `queue`'s logs (deleted with the queue)."""
    return Path(root) / "_replicas" / queue


def replica_directory(root: Path | str, queue: str, leader_id: str, replica_id: str) -> Path:
    return replica_root(root, queue) / f"{leader_id}@{replica_id}"


class ReadStatus(enum.Enum):
    BATCHES = "batches"  # data holds one or more whole batches
    NO_MESSAGE_YET = "no-message-yet"  # offset == end_offset: nothing there yet (mq's 231)
    EVICTED = "evicted"  # offset < start_offset: retention removed it (mq's 230)


@dataclass(frozen=True, slots=True)
class ReadResult:
    status: ReadStatus
    offset: int  # the offset asked for
    data: bytes  # whole stamped batches, back to back (empty unless status is BATCHES)
    next_offset: int  # where the next read continues
    start_offset: int  # the log's first offset at the time of the read
    end_offset: int  # the log's end at the time of the read
    from_memory: bool = False


Clock = Callable[[], float]


class Log:
    """One exchange's log in `directory` (created if missing). Raises LogUnavailable if the
    directory or its files cannot be written."""

    def __init__(
        self,
        directory: Path | str,
        max_file_size: int = 64 * 1024 * 1024,
        flush_policy: FlushPolicy | None = None,
        retention: Retention | None = None,
        memory_bytes: int = 0,
        *,
        name: str = "",
        clock: Clock = time.monotonic,
        background_flush: bool = False,
        background_delete: bool = False,
    ):
        assert max_file_size >= fmt.HEADER_BYTES
        self._janitor = janitor.shared() if background_delete else None
        self.directory = Path(directory)
        self.name = name or str(self.directory)
        self.max_file_size = max_file_size
        self.flush_policy = flush_policy or FlushPolicy()
        self.retention = retention or Retention()
        # no reader needs the log before this offset (its readers said so: retain_from)
        self.consumed_before = 0
        self.memory = MemoryLog(memory_bytes)
        self.gaps: list[tuple[int, int]] = []  # [start, end) offsets missing between segments
        self.recovered_bytes_dropped = 0
        self.corrupt_batches = 0  # found on open with a valid CRC but torn records (kept)
        self._damage: dict[int, int] = {}  # damaged offset → where sound batches resume
        self._clock = clock
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._open_readers: list[Segment] = []  # closed segments with an open fd, LRU first
        self._closed = False
        try:
            self._open()
        except BaseException:
            for segment in self._segments:
                segment.close()
            raise
        self.durable_offset = self.end_offset
        self._last_sync = clock()
        self._generation = 0  # bumped by truncate_to: a sync asked for before it is stale
        self._sync_error: LogUnavailable | None = None
        self._flusher: Flusher | None = None
        if background_flush and self.flush_policy.kind == "interval":
            self._flusher = Flusher(self.name)
            self._flusher.start()

    @classmethod
    def open(
        cls,
        directory: Path | str,
        settings: LogSettings,
        *,
        name: str = "",
        background_flush: bool = False,
        background_delete: bool = False,
    ) -> Log:
        return cls(
            directory,
            settings.max_file_size,
            settings.flush,
            settings.retention,
            settings.memory_bytes,
            name=name,
            background_flush=background_flush,
            background_delete=background_delete,
        )

    # --- opening and recovery -----------------------------------------------------------------
    def _open(self) -> None:
        try:
            self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            names = sorted(p.name for p in self.directory.iterdir())
        except OSError as error:
            raise LogUnavailable(f"log {self.name}: cannot use directory: {error}") from None
        for leftover in [n for n in names if n.endswith(janitor.DELETED_SUFFIX)]:
            janitor.unlink(self.directory / leftover)  # retired before a crash
        paths = [self.directory / n for n in names if parse_segment_name(n) is not None]
        last = parse_segment_name(paths[-1].name) if paths else 0  # names sort by offset
        if last is not None and last >= limits.log_offset_max:
            raise CorruptRecord(f"log {self.name}: segment {paths[-1].name} lies beyond any log "
                                f"(offsets stay below {limits.log_offset_max})")  # fmt: skip
        if not paths:
            self._add(Segment.create(self.directory, 0))
            self._sync_directory()
            return
        for path in paths:
            self._add(Segment.open(path))
        self._check_continuity()
        self._recover(self._segments[-1])
        for segment in self._segments[:-1]:
            segment.sync()  # a run under the `os` policy may have left them unsynced
            segment.close()  # reopened read-only on demand

    def _add(self, segment: Segment) -> None:
        self._segments.append(segment)
        self._bases.append(segment.base)

    def _check_continuity(self) -> None:
        """Earlier segments are trusted, but one that does not end where the next begins (a
        short or missing file) is reported, and reads cannot cross the gap."""
        for before, after in zip(self._segments, self._segments[1:], strict=False):
            if before.end != after.base:
                log.warning(
                    "log %s: segment %s ends at offset %d but %s starts at %d: %d bytes %s",
                    self.name,
                    before.path.name,
                    before.end,
                    after.path.name,
                    after.base,
                    abs(after.base - before.end),
                    "missing" if before.end < after.base else "overlap (the later file wins)",
                )
                if before.end > after.base:
                    before.size = after.base - before.base
                else:
                    self.gaps.append((before.end, after.base))

    def _recover(self, segment: Segment) -> None:
        """Check every batch of the last segment; cut the file at the first bad one."""
        good = 0
        try:
            for position, view, header in segment.scan(verify=True):
                good = position + header.size
                self._check_records(segment, position, view, header)
        except SegmentCorrupt as error:
            dropped = segment.size - good
            log.warning(
                "log %s: %s: truncating at byte %d (offset %d), dropping %d bytes: %s",
                self.name,
                segment.path,
                good,
                segment.base + good,
                dropped,
                error.reason,
            )
            self.recovered_bytes_dropped += dropped
            segment.truncate(good)
        segment.stats = None  # recomputed from the headers when retention needs them
        segment.sync()

    def _check_records(
        self, segment: Segment, position: int, view: memoryview, header: fmt.BatchHeader
    ) -> None:
        """A batch whose CRC holds but whose records do not fill it (damage the CRC cannot see,
        or an exchange that did not check records) is kept and counted: its length is sound, so
        the batches after it stay reachable, and readers skip it. Cutting the file there
        would drop every later batch."""
        try:
            fmt.check_records(view, header)
        except CorruptRecord as error:
            self.corrupt_batches += 1
            log.warning("log %s: %s: the batch at offset %d (byte %d) is corrupt: %s; kept, "
                        "readers skip its %d records", self.name, segment.path,
                        segment.base + position, position, error, header.count)  # fmt: skip

    # --- offsets ------------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        """The first offset still in the log; reads below it answer EVICTED."""
        return self._segments[0].base

    @property
    def end_offset(self) -> int:
        """The offset the next appended batch gets; a read there answers NO_MESSAGE_YET."""
        return self._segments[-1].end

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    # --- appending ----------------------------------------------------------------------------
    def room_for(self, size: int) -> str:
        """Whether an append of `size` bytes would be written now: "" if so, else why not. It
        writes that many bytes to a scratch file in the log's directory and removes it (named
        like a retired segment, so one left by a crash goes at the next open); an append
        refused for want of space, or by a read-only or failing disk, so learns when it would
        work again. A failed fdatasync stays a refusal: it cannot be undone (see `append`)."""
        if self._closed:
            return f"log {self.name}: closed"
        if self._sync_error is not None:
            return str(self._sync_error)
        scratch = self.directory / f"room-probe{janitor.DELETED_SUFFIX}"
        try:
            fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                written, chunk = 0, bytes(min(size, 64 * 1024))
                while written < size:
                    written += os.write(fd, chunk[: size - written])
            finally:
                os.close(fd)
        except OSError as error:
            return f"log {self.name}: no room for {size} bytes: {error.strerror}"
        finally:
            try:
                scratch.unlink(missing_ok=True)
            except OSError:
                pass  # the next open removes it
        return ""

    def append(
        self,
        batch: bytes | bytearray | memoryview,
        header: fmt.BatchHeader | None = None,
        *,
        expect_offset: int | None = None,
    ) -> int:
        """Append one batch; returns its offset (its byte position in the log).

        The batch is checked (`format.validate_batch`: bounds, CRC and records; CorruptRecord if
        bad: nothing written) unless the caller passes the header its own full check returned
        (validate_batch, or check_batch and check_records). A bytearray is stamped with its
        offset in place (so the caller can forward the same bytes) and kept by
        the memory log: the caller must not change it afterwards. Other buffers are copied once.
        A replica passes the leader's offset as `expect_offset`: if this log's end differs, the
        logs diverged and InvalidOffset is raised before anything is written.
        Raises LogUnavailable if the disk refuses the write (nothing acknowledged is lost)."""
        if self._closed:
            raise LogUnavailable(f"log {self.name}: closed")
        if self._sync_error is not None:
            raise self._sync_error
        if header is None:
            header = fmt.validate_batch(memoryview(batch), 0)
        if header.size != len(batch):
            raise CorruptRecord(f"{len(batch)} bytes given for one batch of {header.size} bytes")
        if expect_offset is not None and expect_offset != self.end_offset:
            raise InvalidOffset(
                f"log {self.name}: batch for offset {expect_offset} but the log ends at "
                f"{self.end_offset}"
            )
        data = batch if isinstance(batch, bytearray) else bytearray(batch)
        active = self._segments[-1]
        if active.size and active.size + len(data) > self.max_file_size:
            active = self._roll()
        offset = active.append(data, header)
        self.memory.append(offset, data)
        if self.flush_policy.kind == "every-batch":
            active.sync()
            self.durable_offset = active.end
        elif self.flush_policy.kind == "interval":
            self.maybe_flush()
        return offset

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or after `offset` (a batch boundary between start_offset and
        end_offset): a replica cuts back what a new leader never had. Later segments are
        deleted; the one holding `offset` becomes the active segment again."""
        if not self.start_offset <= offset <= self.end_offset:
            raise InvalidOffset(
                f"log {self.name}: cannot truncate to {offset}: the log holds "
                f"{self.start_offset}..{self.end_offset}"
            )
        if offset == self.end_offset:
            return
        self.read(offset, 1)  # raises InvalidOffset unless a batch starts there
        while len(self._segments) > 1 and self._segments[-1].base > offset:
            self._bases.pop()
            self._drop(self._segments.pop())
        last = self._segments.pop()
        if last in self._open_readers:
            self._open_readers.remove(last)
        last.close()
        self._segments.append(Segment.open(last.path))
        self._segments[-1].truncate(offset - last.base)
        self.memory.drop_from(offset)
        self._damage.clear()
        self.gaps = [gap for gap in self.gaps if gap[1] <= offset]
        self.durable_offset = min(self.durable_offset, offset)
        self._generation += 1
        log.warning("log %s: truncated to offset %d", self.name, offset)

    def restart_at(self, offset: int) -> None:
        """Empty the log and go on at `offset`, past its end: a replica's copy that fell behind
        its leader's retention starts again where the leader's log now starts (everything it
        held is older than that). The new segment is made durable before the old ones go, so a
        crash in between leaves a gap that opening reports, never a lost new segment."""
        if not self.end_offset < offset < limits.log_offset_max:
            raise InvalidOffset(
                f"log {self.name}: cannot restart at {offset}: the log already ends at "
                f"{self.end_offset}, and no log reaches {limits.log_offset_max}"
            )
        segment = Segment.create(self.directory, offset)
        self._sync_directory()
        for old in self._segments:
            self._drop(old)
        self._segments, self._bases, self._open_readers = [], [], []
        self._add(segment)
        self.memory.clear()
        self._damage.clear()
        self.gaps = []
        self.durable_offset = offset
        self._generation += 1  # a sync asked for before is stale
        log.warning("log %s: emptied; it goes on at offset %d", self.name, offset)

    def roll(self) -> int:
        """Start a new segment now (the state log's compaction, statelog.py, begins its snapshot
        in a segment of its own so that the segments before it can be dropped whole). An empty
        active segment is kept: a new one would have its name. Returns where the new one
        starts (the end offset)."""
        if self._closed:
            raise LogUnavailable(f"log {self.name}: closed")
        if self._segments[-1].size:
            self._roll()
        return self.end_offset

    def _roll(self) -> Segment:
        """Close the active segment (made durable first unless the OS manages flushing) and
        start the next one, named by the offset where the old one ends."""
        old = self._segments[-1]
        if self.flush_policy.kind != "os":
            old.sync()
            self.durable_offset = old.end
        segment = Segment.create(self.directory, old.end)
        if self.flush_policy.kind != "os":
            self._sync_directory()
        self._add(segment)
        old.close()
        log.info("log %s: rolled to %s", self.name, segment.path.name)
        self.enforce_retention()
        return segment

    def _sync_directory(self) -> None:
        """Make a new segment's directory entry durable (a file without one is lost on a crash)."""
        sync_directory(self.directory, f"log {self.name}")

    # --- flushing -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Force everything appended so far to stable storage."""
        if self.durable_offset < self.end_offset:
            self._segments[-1].sync()
            self.durable_offset = self.end_offset
        self._last_sync = self._clock()

    def maybe_flush(self, now: float | None = None) -> bool:
        """Under the `interval` policy, flush if `interval_ms` passed since the last flush.
        Returns whether it flushed. The exchange calls tick() from its loop, so an idle log is
        flushed too."""
        if self.flush_policy.kind != "interval":
            return False
        self._collect_sync()
        if self.durable_offset == self.end_offset:
            return False
        now = self._clock() if now is None else now
        if (now - self._last_sync) * 1000 < self.flush_policy.interval_ms:
            return False
        if self._flusher is None:
            self.flush()
            return True
        asked = self._flusher.request(
            self._segments[-1].fileno(), self.end_offset, self._generation
        )
        if asked:
            self._last_sync = now
        return asked

    def _collect_sync(self) -> None:
        """Take the background flusher's last result: durable offset, or its failure."""
        done = self._flusher.take_done() if self._flusher is not None else None
        if done is None:
            return
        if done.error is not None:
            # After a failed fdatasync the kernel may have dropped the dirty pages: what was
            # acknowledged is no longer known to be on disk, so nothing more is accepted.
            self._sync_error = LogUnavailable(f"log {self.name}: {done.error}")
        elif done.generation == self._generation:
            self.durable_offset = max(self.durable_offset, done.end_offset)

    def tick(self, now: float | None = None) -> None:
        """Timers: the interval flush and time-based retention. Call at least every
        `limits.poll_interval_ms` from the owning thread's loop."""
        self.maybe_flush(now)
        if self.retention.ms:
            self.enforce_retention()

    # --- retention ----------------------------------------------------------------------------
    def enforce_retention(self, now_us: int | None = None) -> int:
        """Delete whole closed segments, oldest first, that retention no longer needs. Returns
        how many were deleted."""
        ret = self.retention
        limited = ret.bytes or ret.ms or ret.records or self.consumed_before
        if not limited or len(self._segments) < 2:
            return 0
        now_us = time.time_ns() // 1000 if now_us is None else now_us
        total_bytes = sum(s.size for s in self._segments)
        total_records = sum(s.ensure_stats().records for s in self._segments) if ret.records else 0
        deleted = 0
        while len(self._segments) > 1:
            head = self._segments[0]
            records = head.ensure_stats().records if (ret.records or ret.ms) else 0
            if not self._expendable(head, total_bytes, total_records, now_us):
                break
            total_bytes -= head.size
            total_records -= records
            self._delete_head()
            deleted += 1
        return deleted

    def _expendable(self, head: Segment, total_bytes: int, total_records: int, now_us: int) -> bool:
        ret = self.retention
        records = head.stats.records if head.stats else 0
        reasons = [self.consumed_before > 0 and head.end <= self.consumed_before]
        if ret.bytes:
            reasons.append(total_bytes - head.size >= ret.bytes)
        if ret.records:
            reasons.append(total_records - records >= ret.records)
        if ret.ms and head.stats is not None:
            reasons.append(now_us - head.stats.newest_ts_us > ret.ms * 1000)
        # A segment goes once any one limit says it is surplus (Kafka's rule): each limit is
        # "keep at least", and the first limit reached frees the space.
        return any(reasons)

    def retain_from(self, offset: int) -> int:
        """Its readers need nothing before `offset` from now on (it only grows): whole closed
        segments that end at or before it are deleted, now and by later retention, beside
        what `retention` deletes. Returns how many were deleted now."""
        self.consumed_before = max(self.consumed_before, min(offset, self.end_offset))
        return self.enforce_retention()

    def drop_before(self, offset: int) -> int:
        """Delete every closed segment, oldest first, that ends at or before `offset`: what a
        compacted log (statelog.py) no longer needs once a snapshot starting at `offset` is
        written. Everything from `offset` on is made durable first, with the directory entries
        of its segments, so a crash leaves the old segments or their replacement, never
        neither (under every flush policy: `os` syncs nothing on a roll). Returns how many
        segments were deleted; the active segment is never one."""
        if not self.start_offset <= offset <= self.end_offset:
            raise InvalidOffset(
                f"log {self.name}: cannot drop before {offset}: the log holds "
                f"{self.start_offset}..{self.end_offset}"
            )
        doomed = 0
        while doomed < len(self._segments) - 1 and self._segments[doomed].end <= offset:
            doomed += 1
        if not doomed:
            return 0
        for segment in self._segments[doomed:]:
            if segment is not self._segments[-1]:
                self._note_reader(segment)  # reopened read-only: fdatasync works on that too
            segment.sync()
        self._sync_directory()
        self.durable_offset = self.end_offset
        for _ in range(doomed):
            self._delete_head("compaction")
        return doomed

    def _drop(self, segment: Segment) -> None:
        """Delete a segment that left the log (retention, truncation, restart)."""
        if self._janitor is not None:
            self._janitor.discard(segment.retire())  # an unlink can take 40 ms: janitor.py
        else:
            segment.delete()

    def _delete_head(self, why: str = "retention") -> None:
        head = self._segments.pop(0)
        self._bases.pop(0)
        if head in self._open_readers:
            self._open_readers.remove(head)
        self._drop(head)
        self.gaps = [gap for gap in self.gaps if gap[0] >= self.start_offset]
        self.memory.drop_before(self.start_offset)
        log.info(
            "log %s: %s deleted %s; log starts at offset %d",
            self.name,
            why,
            head.path.name,
            self.start_offset,
        )

    # --- reading ------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches from `offset` (a batch's offset), as many as fit in `max_bytes` but at
        least one. Below start_offset → EVICTED; at end_offset → NO_MESSAGE_YET; past the end
        or not where a batch starts → InvalidOffset. The tail comes from the memory log."""
        if self._closed:
            raise LogUnavailable(f"log {self.name}: closed")
        start, end = self.start_offset, self.end_offset
        if offset < start:
            return ReadResult(ReadStatus.EVICTED, offset, b"", start, start, end)
        if offset == end:
            return ReadResult(ReadStatus.NO_MESSAGE_YET, offset, b"", end, start, end)
        if offset > end:
            raise InvalidOffset(f"log {self.name}: offset {offset} is past the end ({end})")
        data = self.memory.read(offset, max_bytes)
        if data is not None:
            return ReadResult(
                ReadStatus.BATCHES, offset, data, offset + len(data), start, end, True
            )
        data, next_offset = self._read_disk(offset, max_bytes)
        return ReadResult(ReadStatus.BATCHES, offset, data, next_offset, start, end)

    def _read_disk(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        index = bisect_right(self._bases, offset) - 1
        segment = self._segments[index]
        if offset >= segment.end:
            # Only at a gap left by a missing file: continue where the data resumes.
            raise InvalidOffset(
                f"log {self.name}: offset {offset} lies in a gap between segments; "
                f"data resumes at {self._segments[index + 1].base}"
            )
        parts = [self._read_segment(segment, offset - segment.base, max_bytes, True)]
        size = len(parts[0])
        while size < max_bytes and segment.end == offset + size:
            index += 1
            if index == len(self._segments) or self._segments[index].base != segment.end:
                break
            segment = self._segments[index]
            if segment.size == 0:
                break
            more = self._read_segment(segment, 0, max_bytes - size, False)
            if not more:
                break
            parts.append(more)
            size += len(more)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data, offset + len(data)

    def next_sound_batch(self, offset: int) -> int:
        """Where reading goes on after the damaged batch at `offset` (a read raised CorruptRecord
        there): the next position of its segment where a sound batch stamped with its own offset
        begins, else the segment's end. Changes nothing: the damage stays for `roq log inspect`
        to report, and every reader skips it. The answer is kept (a scan may read the rest of a
        segment, on the exchange's thread: every reader that meets the damage asks)."""
        if not self.start_offset <= offset < self.end_offset:
            raise InvalidOffset(f"log {self.name}: offset {offset} is not in the log")
        resume = self._damage.get(offset)
        if resume is None:
            if len(self._damage) >= limits.log_damage_kept_max:
                self._damage.clear()
            resume = self._damage[offset] = self._find_sound_batch(offset)
        return resume

    def _find_sound_batch(self, offset: int) -> int:
        index = bisect_right(self._bases, offset) - 1
        segment = self._segments[index]
        if segment is not self._segments[-1]:
            self._note_reader(segment)
        try:
            found = find_next_batch(
                segment.fileno(), segment.base, segment.size, offset - segment.base + 1
            )
        except OSError as error:
            raise LogUnavailable(f"log {self.name}: cannot read {segment.path}: {error}") from None
        return segment.end if found is None else segment.base + found

    def _read_segment(
        self, segment: Segment, position: int, max_bytes: int, at_least_one: bool
    ) -> bytes:
        if segment is not self._segments[-1]:
            self._note_reader(segment)
        try:
            return segment.read(position, max_bytes, at_least_one=at_least_one)
        except OSError as error:
            raise LogUnavailable(f"log {self.name}: cannot read {segment.path}: {error}") from None

    def _note_reader(self, segment: Segment) -> None:
        """Keep at most `limits.log_read_files_max` closed segments open (least recently used
        are closed), so a log of thousands of segments does not exhaust file descriptors."""
        if segment in self._open_readers:
            self._open_readers.remove(segment)
        self._open_readers.append(segment)
        while len(self._open_readers) > limits.log_read_files_max:
            self._open_readers.pop(0).close()

    # --- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush (whatever the policy: a clean stop loses nothing) and close every file."""
        if self._closed:
            return
        try:
            if self._flusher is not None:
                self._flusher.stop()
            self.flush()
        finally:
            self._closed = True
            for segment in self._segments:
                segment.close()
            self._open_readers.clear()
            self.memory.clear()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
