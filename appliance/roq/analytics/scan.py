"""Streaming reader of log segments for the analytics job: pure Python, no Spark, no sockets.

A task scans one byte range [start, end) of one segment file. It owns every batch that *starts*
in its range (it may read past `end` to finish the last one). A range that does not start at 0
resynchronises: it looks for the first position p >= start where a batch header sits whose
stamped base offset equals the segment's base + p and whose CRC is valid. The stamped offset makes
a false match inside payload bytes practically impossible, so neighbouring ranges agree on the
batch boundaries without talking to each other.

Memory is bounded by the read window (`window_bytes`) plus one batch (at most
format.batch_bytes_max), whatever the size of the file.

Corruption (bad CRC, impossible header, wrong stamped offset, torn tail) is reported once, by the
range whose walk arrived at the bad position, as (position, bytes skipped, reason); the walk then
resumes at the next valid batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from roq.errors import CorruptRecord
from roq.log import format as fmt

# magic, version, flags at byte 16: one mark per format version (v2: records with meta), and
# v2 with its records' shared meta (FLAG_SHARED_META)
_SHARED_MARK = bytes([fmt.MAGIC, fmt.FORMAT_VERSION_META, fmt.FLAG_SHARED_META, 0])
MARKS = (*(bytes([fmt.MAGIC, version, 0, 0]) for version in fmt.FORMAT_VERSIONS), _SHARED_MARK)
MARK = MARKS[0]
MARK_AT = 16
WINDOW_BYTES = 4 * 1024 * 1024
SCAN_BYTES = 1024 * 1024
MICROS_PER_MINUTE = 60_000_000


class Readable(Protocol):
    def seek(self, pos: int, whence: int = ..., /) -> int: ...
    def read(self, n: int = ..., /) -> bytes: ...


class Window:
    """A read-ahead buffer over a seekable stream of known size."""

    def __init__(self, stream: Readable, size: int, window_bytes: int = WINDOW_BYTES):
        self.stream = stream
        self.size = size
        self.window_bytes = window_bytes
        self.buf = b""
        self.start = 0

    def get(self, pos: int, n: int) -> tuple[bytes, int]:
        """(buf, i) such that buf[i:i+n] are the bytes [pos, pos+n) of the file (fewer at EOF)."""
        end = min(pos + n, self.size)
        if pos < self.start or end > self.start + len(self.buf):
            self.stream.seek(pos)
            self.buf = bytes(self.stream.read(min(max(n, self.window_bytes), self.size - pos)))
            self.start = pos
        return self.buf, pos - self.start


@dataclass
class ProducerMinute:
    """What one range saw of one producer in one minute."""

    messages: int = 0
    payload_bytes: int = 0
    batches: int = 0
    first_ts_us: int = 2**63 - 1
    last_ts_us: int = 0
    min_seq: int = 2**63 - 1
    max_seq: int = -1


@dataclass
class Corruption:
    position: int  # byte position in the file
    skipped: int  # bytes not analysed from there
    reason: str


BatchHandler = Callable[[bytes, int, fmt.BatchHeader], None]


@dataclass
class RangeResult:
    batches: int = 0
    records: int = 0
    corrupt: list[Corruption] = field(default_factory=list)


def read_batch(window: Window, base: int, pos: int) -> tuple[bytes, int, fmt.BatchHeader]:
    """The batch at file position `pos`, checked (bounds, CRC, stamped offset)."""
    buf, i = window.get(pos, fmt.HEADER_BYTES)
    if len(buf) - i < fmt.HEADER_BYTES:
        raise CorruptRecord(f"torn header: {len(buf) - i} of {fmt.HEADER_BYTES} bytes")
    (length,) = fmt.LENGTH.unpack_from(buf, i)
    if 4 + length > fmt.batch_bytes_max:
        raise CorruptRecord(f"impossible batch length {length}")
    buf, i = window.get(pos, 4 + length)
    try:
        header = fmt.check_batch(buf, i)
    except CorruptRecord as error:
        # format's messages give positions inside our window; say it without them
        raise CorruptRecord(re.sub(r"\s*at byte \d+", "", str(error))) from None
    if header.base_offset != base + pos:
        raise CorruptRecord(f"stamped offset {header.base_offset}, expected {base + pos}")
    return buf, i, header


def resync(window: Window, base: int, pos: int) -> int:
    """The first position >= pos where a valid batch starts, or the file size."""
    while pos < window.size:
        buf, i = window.get(pos, SCAN_BYTES + MARK_AT + len(MARK))
        found = _find_mark(buf, i + MARK_AT, i + SCAN_BYTES + MARK_AT + len(MARK))
        if found < 0:
            pos += SCAN_BYTES
            continue
        candidate = pos + (found - i - MARK_AT)
        buf, i = window.get(candidate, 12)
        if len(buf) - i >= 12 and fmt.OFFSET.unpack_from(buf, i + 4)[0] == base + candidate:
            try:
                read_batch(window, base, candidate)
                return candidate
            except CorruptRecord:
                pass
        pos = candidate + 1
    return window.size


def _find_mark(buf: bytes, start: int, end: int) -> int:
    """The first position in buf[start:end] of any version's mark, or -1."""
    found = [at for at in (buf.find(mark, start, end) for mark in MARKS) if at >= 0]
    return min(found, default=-1)


def scan_range(
    window: Window, base: int, start: int, end: int, on_batch: BatchHandler
) -> RangeResult:
    """Walk the batches that start in [start, end); call on_batch(buf, i, header) for each."""
    result = RangeResult()
    pos = start if start == 0 else resync(window, base, start)
    while pos < window.size:
        try:
            buf, i, header = read_batch(window, base, pos)
        except CorruptRecord as error:
            after = resync(window, base, pos + 1)
            result.corrupt.append(Corruption(pos, after - pos, str(error)))
            pos = after
            continue
        if pos >= end:
            break  # a valid batch of the next range: its owner counts it
        try:
            on_batch(buf, i, header)
        except CorruptRecord as error:  # CRC-valid but malformed inside: a writer's bug
            result.corrupt.append(Corruption(pos, header.size, str(error)))
        else:
            result.batches += 1
            result.records += header.count
        pos += header.size
    return result


def count_records(
    buf: bytes, i: int, header: fmt.BatchHeader, into: dict[int, ProducerMinute]
) -> None:
    """Add the batch's records to per-minute counters. The records' bounds are checked first, so a
    malformed batch raises CorruptRecord having counted nothing."""
    pos = i + header.records_at  # after a shared meta block (not counted as payload)
    end = i + header.size
    first_ts = header.first_ts_us
    # v2 records carry a meta_len after the payload_len: skipped, not counted as payload
    v1 = header.v1_records
    head = header.record_head_bytes
    unpack = fmt.RECORD.unpack_from if v1 else fmt.RECORD_V2.unpack_from
    # minute -> [messages, bytes, min_ts, max_ts, first index, last index]
    cells: dict[int, list[int]] = {}
    minute = -1
    cell: list[int] = []
    for index in range(header.count):
        if pos + head > end:
            raise CorruptRecord(f"record {index} is torn")
        if v1:
            delta, size = unpack(buf, pos)
            pos += head + size
        else:
            delta, size, meta = unpack(buf, pos)
            pos += head + meta + size
        if pos > end:
            raise CorruptRecord(f"record {index} overruns the batch")
        ts = first_ts + delta
        if ts // MICROS_PER_MINUTE != minute:
            minute = ts // MICROS_PER_MINUTE
            cell = cells.setdefault(minute, [0, 0, ts, ts, index, index])
        cell[0] += 1
        cell[1] += size
        if ts < cell[2]:
            cell[2] = ts
        elif ts > cell[3]:
            cell[3] = ts
        cell[5] = index
    if pos != end:
        raise CorruptRecord(f"{end - pos} bytes after the last record")
    for minute, (messages, size, low, high, first, last) in cells.items():
        total = into.setdefault(minute, ProducerMinute())
        total.messages += messages
        total.payload_bytes += size
        total.batches += 1
        total.first_ts_us = min(total.first_ts_us, low)
        total.last_ts_us = max(total.last_ts_us, high)
        total.min_seq = min(total.min_seq, header.first_seq + first)
        total.max_seq = max(total.max_seq, header.first_seq + last)
