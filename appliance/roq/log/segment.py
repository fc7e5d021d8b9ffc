"""A segment: one append-only file of back-to-back record batches (format.py), named by the log
offset of its first byte (the thesis's naming, Kafka's 20-digit padding so `ls` sorts them).

A log offset is a byte position in the log, so the batch at offset `o` lives in the segment with
the largest base `b <= o`, at file position `o - b`; no index is needed. Every batch carries its
own offset in its header (stamped before the write), which lets a reader check that a position
is a batch boundary.

A Segment is owned by one thread (the exchange's main thread); nothing here is thread-safe.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from roq import limits
from roq.errors import CorruptRecord, InvalidOffset, LogUnavailable
from roq.log import format as fmt
from roq.log.janitor import DELETED_SUFFIX

log = logging.getLogger(__name__)

SUFFIX = ".log"
NAME_DIGITS = 20
FILE_MODE = 0o640
DIR_MODE = 0o750


def segment_name(base: int) -> str:
    """`00000000000000004096.log` for base offset 4096."""
    assert 0 <= base < 10**NAME_DIGITS
    return f"{base:0{NAME_DIGITS}d}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The base offset a segment file name encodes, or None if it is not a segment's name."""
    stem, suffix = name[: -len(SUFFIX)], name[-len(SUFFIX) :]
    if suffix != SUFFIX or len(stem) != NAME_DIGITS or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem)


class SegmentCorrupt(CorruptRecord):
    """Scanning stopped at `offset` (a log offset) because the bytes there are not a valid batch."""

    def __init__(self, path: Path, offset: int, position: int, reason: str):
        super().__init__(f"{path}: bad batch at offset {offset} (byte {position}): {reason}")
        self.path = path
        self.offset = offset
        self.position = position
        self.reason = reason


@dataclass(slots=True)
class SegmentStats:
    batches: int = 0
    records: int = 0
    newest_ts_us: int = 0  # largest batch timestamp (first_ts_us of a batch); 0 if empty

    def add(self, header: fmt.BatchHeader) -> None:
        self.batches += 1
        self.records += header.count
        self.newest_ts_us = max(self.newest_ts_us, header.first_ts_us)


def iter_file(
    fd: int, path: Path, base: int, size: int, *, verify: bool = True, start: int = 0
) -> Iterator[tuple[int, memoryview, fmt.BatchHeader]]:
    """(file position, batch bytes, header) of each batch in bytes [start, size) of a segment
    file (`start` a batch boundary), read in chunks of `limits.log_scan_chunk_bytes`. Checks
    bounds, the stamped offset and (if `verify`) the CRC; raises SegmentCorrupt at the first
    batch that fails."""
    buf = b""
    buf_at = start  # file position of buf[0]
    pos = start
    while pos < size:
        rel = pos - buf_at
        if rel + _bytes_needed(buf, rel) > len(buf) and buf_at + len(buf) < size:
            want = max(limits.log_scan_chunk_bytes, _bytes_needed(buf, rel))
            buf = os.pread(fd, min(want, size - pos), pos)
            buf_at, rel = pos, 0
        try:
            header = fmt.check_batch(buf, rel) if verify else fmt.read_header(buf, rel)
        except CorruptRecord as error:
            raise SegmentCorrupt(path, base + pos, pos, _reason(buf, rel, error)) from None
        if header.base_offset != base + pos:
            reason = f"stamped offset {header.base_offset} is not its position {base + pos}"
            raise SegmentCorrupt(path, base + pos, pos, reason)
        yield pos, memoryview(buf)[rel : rel + header.size], header
        pos += header.size


def _bytes_needed(buf: bytes, rel: int) -> int:
    """Bytes the batch at `rel` needs in the buffer (its header if its length is not there)."""
    if len(buf) - rel < 4:
        return fmt.HEADER_BYTES
    length: int = fmt.LENGTH.unpack_from(buf, rel)[0]
    return max(fmt.HEADER_BYTES, min(4 + length, fmt.batch_bytes_max))


def _reason(buf: bytes, rel: int, error: CorruptRecord) -> str:
    tail = bytes(memoryview(buf)[rel:])
    if not tail.strip(b"\0"):
        return f"zeroed tail: the {len(tail)} bytes from here are all zero"
    # format.py names the position in its buffer; the caller names the file position instead.
    return str(error).replace(f" at byte {rel}", "")


def find_next_batch(fd: int, base: int, size: int, start: int) -> int | None:
    """The first file position >= `start` where a CRC-valid batch stamped with its own offset
    begins, or None. Reads the file in chunks; candidates are positions of the magic byte."""
    chunk = limits.log_scan_chunk_bytes
    magic = bytes([fmt.MAGIC])
    magic_at = fmt.CRC_START  # the magic is the first byte the CRC covers
    pos = start
    while pos < size:
        data = os.pread(fd, min(chunk + fmt.HEADER_BYTES, size - pos), pos)
        at = data.find(magic, magic_at)
        while at != -1 and at - magic_at < chunk:
            candidate = pos + at - magic_at
            if fmt.OFFSET.unpack_from(data, at - magic_at + fmt.BASE_OFFSET_AT)[0] == (
                base + candidate
            ) and _valid_at(fd, candidate, size):
                return candidate
            at = data.find(magic, at + 1)
        pos += chunk
    return None


def _valid_at(fd: int, position: int, size: int) -> bool:
    head = os.pread(fd, 4, position)
    if len(head) < 4:
        return False
    length = min(4 + fmt.LENGTH.unpack_from(head)[0], fmt.batch_bytes_max, size - position)
    try:
        fmt.check_batch(os.pread(fd, length, position))
    except CorruptRecord:
        return False
    return True


class Segment:
    """One segment file. `size` is the count of valid bytes; the file holds exactly those."""

    def __init__(self, path: Path, base: int, fd: int | None, size: int):
        self.path = path
        self.base = base
        self.size = size
        self._fd = fd
        self.stats: SegmentStats | None = SegmentStats() if size == 0 else None

    @property
    def end(self) -> int:
        """The log offset just past this segment's last byte."""
        return self.base + self.size

    @classmethod
    def create(cls, directory: Path, base: int) -> Segment:
        path = directory / segment_name(base)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags, FILE_MODE)
        except OSError as error:
            raise LogUnavailable(f"{path}: cannot create segment: {error.strerror}") from None
        return cls(path, base, fd, 0)

    @classmethod
    def open(cls, path: Path) -> Segment:
        """Open an existing segment for appending and reading; its size is the file's size."""
        base = parse_segment_name(path.name)
        assert base is not None, path
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            size = os.fstat(fd).st_size
        except OSError as error:
            raise LogUnavailable(f"{path}: cannot open segment: {error.strerror}") from None
        return cls(path, base, fd, size)

    def fileno(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as error:
                raise LogUnavailable(f"{self.path}: cannot open segment: {error}") from None
        return self._fd

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    # --- writing -----------------------------------------------------------------------------
    def append(self, batch: bytearray, header: fmt.BatchHeader) -> int:
        """Stamp `batch` with its log offset, write it after the last byte, return the offset.
        On a failed write the file is cut back to its previous size and LogUnavailable raised."""
        assert header.size == len(batch)
        offset = self.end
        fmt.stamp_offset(batch, offset)
        fd = self.fileno()
        view = memoryview(batch)
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(fd, view[written:], self.size + written)
        except OSError as error:
            self._undo(written, error)
        self.size += len(batch)
        if self.stats is not None:
            self.stats.add(header)
        return offset

    def _undo(self, written: int, error: OSError) -> None:
        why = f"{self.path}: cannot append at offset {self.end}: {error.strerror}"
        if written:
            try:
                os.ftruncate(self.fileno(), self.size)
            except OSError as second:
                raise LogUnavailable(
                    f"{why}; and cannot cut back {written} partly written bytes: "
                    f"{second.strerror} (recovery on the next open drops them)"
                ) from None
        raise LogUnavailable(why) from None

    def sync(self) -> None:
        try:
            os.fdatasync(self.fileno())
        except OSError as error:
            if error.errno == errno.EINVAL:
                return  # a special file (a device) that has nothing to synchronise
            raise LogUnavailable(f"{self.path}: fdatasync failed: {error.strerror}") from None

    def truncate(self, size: int) -> None:
        assert 0 <= size <= self.size
        try:
            os.ftruncate(self.fileno(), size)
            os.fsync(self.fileno())
        except OSError as error:
            raise LogUnavailable(f"{self.path}: cannot truncate: {error.strerror}") from None
        self.size = size

    # --- reading -----------------------------------------------------------------------------
    def read(self, position: int, max_bytes: int, *, at_least_one: bool) -> bytes:
        """Whole batches from file `position` (a batch boundary), at most `max_bytes` of them, or
        the first batch whatever its size if `at_least_one`. CRCs are checked again: a reader
        never gets bytes that changed on disk. The read stops before a damaged batch, and raises
        CorruptRecord if the first one is damaged (`find_next_batch` says where to go on).
        InvalidOffset if `position` is not where a batch starts."""
        assert 0 <= position < self.size
        want = min(max(max_bytes, fmt.HEADER_BYTES if at_least_one else 0), self.size - position)
        data = os.pread(self.fileno(), want, position) if want else b""
        first = self._check_boundary(data, position) if at_least_one else None
        used = _whole_batches(data)
        if used == 0 and first is not None:
            data = os.pread(self.fileno(), first.size, position)
            used = len(data)
        used = _sound_prefix(memoryview(data)[:used])
        return data if used == len(data) else data[:used]

    def _check_boundary(self, data: bytes, position: int) -> fmt.BatchHeader:
        try:
            header = _peek_header(data)
        except CorruptRecord as error:
            raise InvalidOffset(
                f"offset {self.base + position} is not the start of a batch in {self.path.name} "
                f"({error})"
            ) from None
        if header.base_offset != self.base + position:
            raise InvalidOffset(
                f"offset {self.base + position} is not the start of a batch in {self.path.name}"
            )
        if header.size > self.size - position:
            raise CorruptRecord(f"{self.path}: batch at offset {self.base + position} is torn")
        return header

    def scan(self, *, verify: bool) -> Iterator[tuple[int, memoryview, fmt.BatchHeader]]:
        return iter_file(self.fileno(), self.path, self.base, self.size, verify=verify)

    def ensure_stats(self) -> SegmentStats:
        """Batch and record counts and newest timestamp, read from the headers if not known."""
        if self.stats is None:
            stats = SegmentStats()
            for _, _, header in self.scan(verify=False):
                stats.add(header)
            self.stats = stats
        return self.stats

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            raise LogUnavailable(f"{self.path}: cannot delete segment: {error}") from None

    def retire(self) -> Path:
        """Close the segment and rename it out of the log (`janitor.py` deletes it later);
        returns its new path."""
        self.close()
        retired = self.path.with_name(self.path.name + DELETED_SUFFIX)
        try:
            self.path.rename(retired)
        except OSError as error:
            raise LogUnavailable(f"{self.path}: cannot retire segment: {error}") from None
        return retired


def _peek_header(data: bytes) -> fmt.BatchHeader:
    """The header of the batch at data[0], bounds-checked without requiring the whole batch."""
    if len(data) < fmt.HEADER_BYTES:
        raise CorruptRecord(f"only {len(data)} bytes left")
    fields = fmt.HEADER.unpack_from(data, 0)
    length, base, crc, magic, version, flags, count, seq, ts, pid, _ = fields
    known = flags & ~fmt.FLAGS_KNOWN == 0 and (not flags or version != fmt.FORMAT_VERSION)
    if magic != fmt.MAGIC or version not in fmt.FORMAT_VERSIONS or not known or count < 1:
        raise CorruptRecord("no batch header there")
    if not fmt.HEADER_BYTES + fmt.RECORD_BYTES <= length + 4 <= fmt.batch_bytes_max:
        raise CorruptRecord(f"impossible batch length {length}")
    return fmt.BatchHeader(length, base, crc, count, seq, ts, bytes(pid), b"", version)


def _sound_prefix(view: memoryview) -> int:
    """Bytes of `view` (whole batches) before the first damaged batch; CorruptRecord if the
    first one is damaged."""
    at = 0
    while at < len(view):
        try:
            at += fmt.check_batch(view, at).size
        except CorruptRecord:
            if at == 0:
                raise
            break
    return at


def _whole_batches(data: bytes) -> int:
    """Bytes of `data` taken by whole batches, walking the length fields from data[0]."""
    at = 0
    end = len(data)
    unpack = fmt.LENGTH.unpack_from
    while end - at >= 4:
        nxt = at + 4 + unpack(data, at)[0]
        if nxt > end:
            break
        at = nxt
    return at
