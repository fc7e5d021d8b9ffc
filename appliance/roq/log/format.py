"""The record-batch format: on the wire from publisher to exchange to subscriber, in the segment
files, and on the replication stream — the same bytes everywhere (DESIGN §6b).

A batch holds the records of one producer for one routing key. All integers are little-endian.

    offset size field
    0      4    length        bytes of the batch after this field (batch size = 4 + length)
    4      8    base_offset   byte position of the batch in its log; 0 until the exchange stamps it
    12     4    crc           zlib CRC-32 of every byte from offset 16 to the end of the batch
    16     1    magic         0xB7
    17     1    version       1
    18     2    flags         0 (reserved; readers reject unknown bits)
    20     4    count         number of records (>= 1)
    24     8    first_seq     producer sequence number of record 0; record i has first_seq + i
    32     8    first_ts_us   timestamp of record 0, microseconds since the Unix epoch
    40     16   producer_id   the producer's 16-byte id (a UUID)
    56     2    key_length    length of the routing key
    58     k    key           routing key bytes
    then `count` records, each:
    +0     4    ts_delta_us   timestamp minus first_ts_us, microseconds (unsigned)
    +4     4    payload_len
    +8     n    payload

The CRC does not cover `length` (checked against the frame or file) nor `base_offset`, so the
exchange stamps the offset without recomputing the CRC. See docs/log-format.md.

A CRC proves that the bytes are the sender's, not that they are a valid batch: `validate_batch`
also checks that the records fill the batch exactly, and is what a batch must pass before it is
appended to a log (by the exchange, or by a replica).
"""

from __future__ import annotations

import itertools
import operator
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from roq import limits
from roq.errors import CorruptRecord

MAGIC = 0xB7
FORMAT_VERSION = 1
FLAGS_KNOWN = 0

HEADER = struct.Struct("<IQIBBHIQQ16sH")
HEADER_BYTES = HEADER.size  # 58
RECORD = struct.Struct("<II")
RECORD_BYTES = RECORD.size  # 8
LENGTH = struct.Struct("<I")
_PAYLOAD_LEN = struct.Struct("<4xI").unpack_from  # a record head's payload_len
OFFSET = struct.Struct("<Q")
CRC_START = 16  # the CRC covers bytes [CRC_START, end)
BASE_OFFSET_AT = 4

batch_bytes_max = limits.batch_bytes_max
ts_delta_us_max = 2**32 - 1
# Sequence numbers and timestamps end in BSON (int64) and in subscribers' positions: a batch's
# last sequence number and its records' timestamps must stay below 2**63.
_SEQ_END_MAX = limits.int64_max + 1
_FIRST_TS_US_MAX = limits.int64_max - ts_delta_us_max

assert HEADER_BYTES == 58 and RECORD_BYTES == 8


@dataclass(slots=True)
class BatchHeader:
    """A batch's header fields. Not frozen: a frozen dataclass costs 4x more to build, and one
    is built for every frame the exchange takes. Treat it as read-only."""

    length: int
    base_offset: int
    crc: int
    count: int
    first_seq: int
    first_ts_us: int
    producer_id: bytes
    key: bytes

    @property
    def size(self) -> int:
        """Bytes the batch occupies in a frame or a file."""
        return 4 + self.length

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


class Record(NamedTuple):
    """One message as a reader sees it. A named tuple: immutable, and built 3x faster than a
    frozen dataclass, which is most of a subscriber's per-message cost."""

    offset: int  # base offset of the batch that holds it (the thesis: its byte position)
    producer_id: bytes
    seq: int
    timestamp_us: int
    key: bytes
    payload: bytes


def encode_batch(
    producer_id: bytes,
    first_seq: int,
    key: bytes,
    payloads: Sequence[bytes],
    timestamps_us: Sequence[int],
) -> bytes:
    """Pack one batch. Timestamps must not decrease by more than the first one's value and must
    span less than 2**32 µs (71 minutes); callers batch within milliseconds."""
    assert len(producer_id) == 16
    assert payloads and len(payloads) == len(timestamps_us)
    if len(key) > limits.key_bytes_max:
        raise ValueError(f"routing key of {len(key)} bytes exceeds {limits.key_bytes_max}")
    first_ts = timestamps_us[0]
    # Record headers and payloads interleaved by slice assignment, the headers packed by map():
    # no Python-level loop per record, which made this the publisher's largest cost.
    deltas = map(operator.sub, timestamps_us, itertools.repeat(first_ts))
    parts: list[bytes] = [b""] * (2 * len(payloads))
    parts[::2] = map(RECORD.pack, deltas, map(len, payloads))
    parts[1::2] = payloads
    body = b"".join(parts)
    tail = (
        struct.pack(
            "<BBHIQQ16sH",
            MAGIC,
            FORMAT_VERSION,
            0,
            len(payloads),
            first_seq,
            first_ts,
            producer_id,
            len(key),
        )
        + key
        + body
    )
    crc = zlib.crc32(tail)
    length = 8 + 4 + len(tail)
    if length + 4 > batch_bytes_max:
        raise ValueError(f"batch of {length + 4} bytes exceeds {batch_bytes_max}")
    return LENGTH.pack(length) + OFFSET.pack(0) + LENGTH.pack(crc) + tail


def read_header(buf: bytes | memoryview, at: int = 0) -> BatchHeader:
    """Parse and bound-check the header of the batch starting at `at` (no CRC check)."""
    if len(buf) - at < HEADER_BYTES:
        raise CorruptRecord(f"torn header at byte {at}: {len(buf) - at} of {HEADER_BYTES} bytes")
    (length, base, crc, magic, version, flags, count, seq, ts, pid, key_len) = HEADER.unpack_from(
        buf, at
    )
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic 0x{magic:02x} at byte {at}")
    if version != FORMAT_VERSION:
        raise CorruptRecord(f"unknown format version {version} at byte {at}")
    if flags & ~FLAGS_KNOWN:
        raise CorruptRecord(f"unknown flags 0x{flags:04x} at byte {at}")
    if length + 4 > batch_bytes_max:
        raise CorruptRecord(
            f"batch at byte {at} of {length + 4} bytes exceeds the {batch_bytes_max}-byte bound"
        )
    if length + 4 < HEADER_BYTES + key_len + RECORD_BYTES:
        raise CorruptRecord(f"impossible batch length {length} at byte {at}")
    if count < 1:
        raise CorruptRecord(f"batch with {count} records at byte {at}")
    if seq + count > _SEQ_END_MAX or ts > _FIRST_TS_US_MAX:
        raise CorruptRecord(f"sequence {seq} or timestamp {ts} past 2**63 in batch at byte {at}")
    if len(buf) - at < 4 + length:
        raise CorruptRecord(
            f"batch at byte {at} claims {4 + length} bytes, only {len(buf) - at} present"
        )
    key = bytes(buf[at + HEADER_BYTES : at + HEADER_BYTES + key_len])
    return BatchHeader(length, base, crc, count, seq, ts, bytes(pid), key)


def check_batch(buf: bytes | memoryview, at: int = 0) -> BatchHeader:
    """Header bounds plus CRC: what the exchange runs on every incoming batch."""
    header = read_header(buf, at)
    end = at + header.size
    if zlib.crc32(memoryview(buf)[at + CRC_START : end]) != header.crc:
        raise CorruptRecord(f"CRC mismatch in batch at byte {at}")
    return header


def validate_batch(buf: bytes | memoryview, at: int = 0) -> BatchHeader:
    """Full validity (docs/log-format.md §1): header bounds, CRC, and every record inside the
    batch. What a batch must pass before it is appended to a log: the exchange runs it on every
    batch a publisher sends, a replica on every batch a leader sends. Bytes read back from a log
    were validated when they were appended, so readers check the CRC only (`check_batch`)."""
    header = check_batch(buf, at)
    check_records(buf, header, at)
    return header


def check_records(buf: bytes | memoryview, header: BatchHeader, at: int = 0) -> None:
    """CorruptRecord unless the records of the batch at `at` fill it exactly. On the exchange's
    hot path, so no Python work per record in the common case: when every record has the size
    of the first (a publisher's usual batch) the check is four strided byte slices; otherwise
    it walks the record heads (~80 ns a record; docs/benchmarks.md §6b)."""
    start, end, count = at + HEADER_BYTES + len(header.key), at + header.size, header.count
    if count * RECORD_BYTES > end - start:
        raise CorruptRecord(f"batch at byte {at} is too short for its {count} records")
    if count == 1 and RECORD_BYTES + _PAYLOAD_LEN(buf, start)[0] == end - start:
        return
    data, shift = _bytes_of(buf, start, end)
    start, end = start - shift, end - shift
    if count == 1 or not _same_sizes(data, start, end, count):
        pos = start
        try:
            for _ in range(count):  # a record past `end` takes pos past it for good
                pos += RECORD_BYTES + _PAYLOAD_LEN(data, pos)[0]
        except struct.error:  # a record head past the end of `data`
            pos = -1
        if pos != end:
            for _ in iter_records(buf, at):
                pass  # raises, naming the first bad record
            raise CorruptRecord(f"the records of the batch at byte {at} do not fill it")


def _bytes_of(buf: bytes | memoryview, start: int, end: int) -> tuple[bytes, int]:
    """(data, shift) with data[i - shift] == buf[i] for i in [start, end): the bytes object
    itself when `buf` is one or views all of one (the exchange's frames), else a copy."""
    if isinstance(buf, bytes):
        return buf, 0
    under = buf.obj
    if isinstance(under, bytes) and buf.nbytes == len(under):
        return under, 0
    return bytes(buf[start:end]), start


def _same_sizes(data: bytes, start: int, end: int, count: int) -> bool:
    """Whether all `count` records in data[start:end] have the first one's payload_len and so
    fill it exactly: each byte of the payload_len field, taken with a stride of one record, is
    the same byte `count` times (C loops only)."""
    size = _PAYLOAD_LEN(data, start)[0]
    stride = RECORD_BYTES + size
    if stride * count != end - start:
        return False
    at = start + 4
    b0, b1, b2, b3 = LENGTH.pack(size)
    return (
        data[at:end:stride].count(b0) == count
        and data[at + 1 : end : stride].count(b1) == count
        and data[at + 2 : end : stride].count(b2) == count
        and data[at + 3 : end : stride].count(b3) == count
    )


def stamp_offset(batch: bytearray | memoryview, base_offset: int, at: int = 0) -> None:
    """Write the batch's base offset in place (outside the CRC, so the CRC stays valid)."""
    OFFSET.pack_into(batch, at + BASE_OFFSET_AT, base_offset)


def iter_records(buf: bytes | memoryview, at: int = 0) -> Iterator[Record]:
    """Every record of the batch at `at`, with its bounds checked (the CRC is not re-checked)."""
    header = read_header(buf, at)
    start = at + HEADER_BYTES + len(header.key)
    # One copy of the records' bytes, then plain bytes slices: cheaper per record than slicing
    # a memoryview and copying each payload out of it.
    data = bytes(memoryview(buf)[start : at + header.size])
    end, pos = len(data), 0
    unpack = RECORD.unpack_from
    offset, producer, key = header.base_offset, header.producer_id, header.key
    seq, stamp = header.first_seq, header.first_ts_us
    for index in range(header.count):
        if pos + RECORD_BYTES > end:
            raise CorruptRecord(f"record {index} of batch at byte {at} is torn")
        delta, size = unpack(data, pos)
        pos += RECORD_BYTES
        stop = pos + size
        if stop > end:
            raise CorruptRecord(f"record {index} of batch at byte {at} overruns the batch")
        yield Record(offset, producer, seq + index, stamp + delta, key, data[pos:stop])
        pos = stop
    if pos != end:
        raise CorruptRecord(f"batch at byte {at} has {end - pos} bytes after its last record")


def iter_batches(
    buf: bytes | memoryview, at: int = 0, *, validate: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each CRC-valid batch in a buffer of back-to-back batches; with
    `validate`, each also passes `validate_batch` (its records fill it)."""
    check = validate_batch if validate else check_batch
    while at < len(buf):
        header = check(buf, at)
        yield at, header
        at += header.size
