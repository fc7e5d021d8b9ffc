"""The record-batch format: on the wire from publisher to exchange to subscriber, in the segment
files, and on the replication stream — the same bytes everywhere (DESIGN §6b).

A batch holds the records of one producer for one routing key. All integers are little-endian.

    offset size field
    0      4    length        bytes of the batch after this field (batch size = 4 + length)
    4      8    base_offset   byte position of the batch in its log; 0 until the exchange stamps it
    12     4    crc           zlib CRC-32 of every byte from offset 16 to the end of the batch
    16     1    magic         0xB7
    17     1    version       1
    18     2    flags         0; in version 2, bit 0 = FLAG_SHARED_META (below); others rejected
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

A batch of version 2 has the same header; each of its records has a 10-byte head and an
optional meta section (headers, a message id, expiry and not-before times) before the payload:

    +0     4    ts_delta_us
    +4     4    payload_len   n
    +8     2    meta_len      m (0: no meta)
    +10    m    meta          flags (1), [header count (1), per header name_len (1) and
                              value_len (2)], [message_id 16], [expires_at_us 8], [not_before_us 8],
                              [each header's name then value]
    +10+m  n    payload

A version 2 batch with flag bit 0 (`FLAG_SHARED_META`) carries one meta for all its records
(what `send_many(..., headers=...)` sends): after the key, `shared_meta_len` (2) and the meta,
then v1 records (8-byte heads, no meta_len); every record reads with that meta.

Publishers write version 1 unless a message of the batch carries meta, so v1 stays the default
and every v1 log stays readable. The meta's lengths come first (its *shape*): the shape alone says
whether a meta is sound, which lets the checks work per distinct shape, not per record.

The CRC does not cover `length` (checked against the frame or file) nor `base_offset`, so the
exchange stamps the offset without recomputing the CRC. See docs/log-format.md.

A CRC proves that the bytes are the sender's, not that they are a valid batch: `validate_batch`
also checks that the records fill the batch exactly, and is what a batch must pass before it is
appended to a log (by the exchange, or by a replica).
"""

from __future__ import annotations

import importlib.machinery
import itertools
import operator
import os
import struct
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple, Union

from roq import limits
from roq.errors import CorruptRecord
from roq.log.record import Headers as Headers  # re-exported: format.Record is the public name
from roq.log.record import Record as Record
from roq.log.record import RecordMeta as RecordMeta

MAGIC = 0xB7
FORMAT_VERSION = 1  # what a batch without meta is written as
FORMAT_VERSION_META = 2  # records with a meta section
FORMAT_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_META)
FLAG_SHARED_META = 0x0001  # v2 only: one meta for every record, after the key
FLAGS_KNOWN = FLAG_SHARED_META

HEADER = struct.Struct("<IQIBBHIQQ16sH")
HEADER_BYTES = HEADER.size  # 58
RECORD = struct.Struct("<II")
RECORD_BYTES = RECORD.size  # 8
RECORD_V2 = struct.Struct("<IIH")
RECORD_V2_BYTES = RECORD_V2.size  # 10
_SIZES_V2 = struct.Struct("<4xIH").unpack_from  # a v2 record head's payload_len and meta_len
LENGTH = struct.Struct("<I")
_PAYLOAD_LEN = struct.Struct("<4xI").unpack_from  # a record head's payload_len
OFFSET = struct.Struct("<Q")
SHARED_META_LEN = struct.Struct("<H")  # a shared-meta batch's shared_meta_len, after the key
CRC_START = 16  # the CRC covers bytes [CRC_START, end)
BASE_OFFSET_AT = 4

batch_bytes_max = limits.batch_bytes_max
ts_delta_us_max = 2**32 - 1
# Sequence numbers and timestamps end in BSON (int64) and in subscribers' positions: a batch's
# last sequence number and its records' timestamps must stay below 2**63.
_SEQ_END_MAX = limits.int64_max + 1
_FIRST_TS_US_MAX = limits.int64_max - ts_delta_us_max

# A record's meta section (version 2)
META_ID, META_EXPIRES, META_NOT_BEFORE, META_HEADERS = 1, 2, 4, 8
META_FLAGS_KNOWN = META_ID | META_EXPIRES | META_NOT_BEFORE | META_HEADERS
MESSAGE_ID_BYTES = 16
_HEADER_LENGTHS = struct.Struct("<BH")  # a header's name_len and value_len
_TIME = struct.Struct("<q")  # expires_at_us, not_before_us: signed µs since the epoch
META_BYTES_MAX = (
    2 + 3 * limits.record_headers_max + MESSAGE_ID_BYTES + 2 * _TIME.size
    + limits.record_headers_bytes_max
)  # fmt: skip
_SHAPES_CACHED_MAX = 4096

assert HEADER_BYTES == 58 and RECORD_BYTES == 8 and RECORD_V2_BYTES == 10

PURE_PYTHON_ENV = "ROQ_PURE_PYTHON"


def _load_native() -> ModuleType | None:
    """The mypyc-compiled loops (`roq.log._native`, built by `make setup`), or None: not built,
    or ROQ_PURE_PYTHON=1 asks for this module's own code (the tests run both). Its source run
    as plain Python would be slower than the code here, so only the extension is taken."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        from roq.log import _native
    except ImportError:  # e.g. librt (mypyc's run-time library) missing
        return None
    built = (_native.__file__ or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    return _native if built else None


_native = _load_native()
# Records are built with the tuple's constructor: a named tuple's own (`Record(...)`) is a Python
# function, ~5x slower, and was most of a subscriber's cost per record.
_new_tuple = tuple.__new__
NATIVE = _native is not None  # whether the compiled loops are in use (`roq version` reports it)
assert META_BYTES_MAX < 2**16 and limits.record_header_name_bytes_max < 2**8


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
    version: int = FORMAT_VERSION
    shared_meta: bytes = b""  # the meta of every record (FLAG_SHARED_META), b"": none

    @property
    def size(self) -> int:
        """Bytes the batch occupies in a frame or a file."""
        return 4 + self.length

    @property
    def records_at(self) -> int:
        """Where the first record starts, from the batch's start: after the key and, in a
        shared-meta batch, after the shared meta block."""
        shared = self.shared_meta
        return HEADER_BYTES + len(self.key) + (SHARED_META_LEN.size + len(shared) if shared else 0)

    @property
    def v1_records(self) -> bool:
        """Whether the records have v1's 8-byte heads: a v1 batch, or a shared-meta v2 one."""
        return self.version == FORMAT_VERSION or bool(self.shared_meta)

    @property
    def record_head_bytes(self) -> int:
        """Bytes of each record's head: 8 (v1 records) or 10 (v2, with meta_len)."""
        return RECORD_BYTES if self.v1_records else RECORD_V2_BYTES

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


HeadersIn = Union[Mapping[str, bytes | str], Iterable[tuple[str, bytes | str]]]  # noqa: UP007


def new_message_id() -> bytes:
    """A random 16-byte message id (a uuid4's bytes)."""
    return uuid.uuid4().bytes


def encode_meta(
    headers: HeadersIn | None = None,
    message_id: bytes | uuid.UUID | None = None,
    expires_at_us: int | None = None,
    not_before_us: int | None = None,
) -> bytes:
    """A record's meta section (b"" when it has none). ValueError names what breaks a bound.
    On a publisher's path once per message with meta: one pass over the headers, no helper
    call per header."""
    flags, fixed = 0, b""
    if message_id is not None:
        raw = message_id.bytes if isinstance(message_id, uuid.UUID) else bytes(message_id)
        if len(raw) != MESSAGE_ID_BYTES:
            raise ValueError(f"message id of {len(raw)} bytes: it must be {MESSAGE_ID_BYTES}")
        flags, fixed = META_ID, raw
    if expires_at_us is not None:
        flags, fixed = flags | META_EXPIRES, fixed + _pack_time(expires_at_us, "expires_at_us")
    if not_before_us is not None:
        flags, fixed = flags | META_NOT_BEFORE, fixed + _pack_time(not_before_us, "not_before_us")
    if not headers:
        return bytes((flags,)) + fixed if flags else b""
    items = headers.items() if isinstance(headers, dict | Mapping) else headers
    shape: list[bytes] = [b""]
    body: list[bytes] = []
    total = 0
    for name, value in items:
        raw_name = name.encode() if type(name) is str else _refuse_name(name)
        raw_value = value if type(value) is bytes else _value_bytes(value)
        if not 0 < len(raw_name) <= limits.record_header_name_bytes_max:
            raise ValueError(f"header name {name[:40]!r} must have 1 to "
                             f"{limits.record_header_name_bytes_max} bytes")  # fmt: skip
        total += len(raw_name) + len(raw_value)
        shape.append(_HEADER_LENGTHS.pack(len(raw_name), len(raw_value)))
        body += (raw_name, raw_value)
    count = len(shape) - 1
    if count > limits.record_headers_max:
        raise ValueError(f"{count} headers: at most {limits.record_headers_max} per message")
    if total > limits.record_headers_bytes_max:
        raise ValueError(f"headers of {total} bytes: names and values may have at most "
                         f"{limits.record_headers_bytes_max} together")  # fmt: skip
    shape[0] = bytes((flags | META_HEADERS, count))
    return b"".join(shape) + fixed + b"".join(body)


def _pack_time(value: int, what: str) -> bytes:
    if type(value) is not int or not -(2**63) <= value <= limits.int64_max:
        raise ValueError(f"{what} {value!r} is not a signed 64-bit count of µs")
    return _TIME.pack(value)


def _refuse_name(name: object) -> bytes:
    raise ValueError(f"header name {name!r} must be str")


def _value_bytes(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"header value {value!r} must be str or bytes")


# shape bytes -> the size of the meta it describes (or the reason it is unsound)
_shapes: dict[bytes, int | str] = {}


def _meta_size(shape: bytes) -> int | str:
    """The meta size a shape describes, or why it is unsound; cached per distinct shape."""
    found = _shapes.get(shape)
    if found is None:
        found = _size_of_shape(shape)
        if len(_shapes) >= _SHAPES_CACHED_MAX:
            _shapes.clear()
        _shapes[shape] = found
    return found


def _size_of_shape(shape: bytes) -> int | str:
    flags = shape[0]
    if not flags or flags & ~META_FLAGS_KNOWN:
        return f"meta flags 0x{flags:02x} are unknown or none"
    size = 1 + MESSAGE_ID_BYTES * (flags & META_ID) + 4 * (flags & META_EXPIRES)
    size += 2 * (flags & META_NOT_BEFORE)  # 8 bytes for each time present
    if not flags & META_HEADERS:
        return size
    count = shape[1]
    if not 0 < count <= limits.record_headers_max:
        return f"{count} headers (1 to {limits.record_headers_max})"
    total = 0
    for name_len, value_len in _HEADER_LENGTHS.iter_unpack(shape[2:]):
        if not name_len:
            return "a header with an empty name"
        total += name_len + value_len
    if total > limits.record_headers_bytes_max:
        return f"headers of {total} bytes (at most {limits.record_headers_bytes_max})"
    return size + 1 + 3 * count + total


def _shape_at(data: bytes, pos: int, size: int) -> bytes | None:
    """The shape of the meta data[pos:pos+size] (None: too short to hold its own shape)."""
    if data[pos] & META_HEADERS:
        if size < 2 or size < 2 + 3 * data[pos + 1]:
            return None
        return data[pos : pos + 2 + 3 * data[pos + 1]]
    return data[pos : pos + 1]


def _check_meta(data: bytes, pos: int, size: int) -> str:
    """Why the meta data[pos:pos+size] is unsound, or ""."""
    shape = _shape_at(data, pos, size)
    if shape is None:
        return f"meta of {size} bytes is too short for its own lengths"
    expected = _meta_size(shape)
    if isinstance(expected, str):
        return expected
    return "" if expected == size else f"meta of {size} bytes, its lengths say {expected}"


class _Plan(NamedTuple):
    """Where a meta of one shape keeps its fields (0: absent; no field starts at byte 0)."""

    size: int
    id_at: int
    expires_at: int
    not_before_at: int
    headers: tuple[tuple[int, int, int], ...]  # (name start, value start, value end)


_plans: dict[bytes, _Plan] = {}  # shape -> plan: a subscriber decodes each shape's layout once


def _plan_of(shape: bytes, size: int) -> _Plan:
    flags, pos, lengths = shape[0], len(shape), _HEADER_LENGTHS.iter_unpack(shape[2:])
    at = {}
    for bit, width in ((META_ID, MESSAGE_ID_BYTES), (META_EXPIRES, 8), (META_NOT_BEFORE, 8)):
        if flags & bit:
            at[bit], pos = pos, pos + width
    spans = []
    for name_len, value_len in lengths if flags & META_HEADERS else ():
        spans.append((pos, pos + name_len, pos + name_len + value_len))
        pos += name_len + value_len
    plan = _Plan(size, at.get(META_ID, 0), at.get(META_EXPIRES, 0),
                 at.get(META_NOT_BEFORE, 0), tuple(spans))  # fmt: skip
    if len(_plans) >= _SHAPES_CACHED_MAX:
        _plans.clear()
    _plans[shape] = plan
    return plan


def decode_meta(meta: bytes) -> RecordMeta:
    """A meta section's fields; CorruptRecord if it is unsound. One dictionary lookup finds
    where its fields are (`_Plan`, per distinct shape), then only slices."""
    size = len(meta)
    shape = meta[: 2 + 3 * meta[1]] if size > 1 and meta[0] & META_HEADERS else meta[:1]
    plan = _plans.get(shape)
    if plan is None or plan.size != size:
        problem = _check_meta(meta, 0, size) if meta else "an empty meta"
        if problem:
            raise CorruptRecord(problem)
        plan = _plan_of(shape, size)
    at = plan.id_at
    message_id = meta[at : at + MESSAGE_ID_BYTES] if at else None
    expires = _TIME.unpack_from(meta, plan.expires_at)[0] if plan.expires_at else None
    not_before = _TIME.unpack_from(meta, plan.not_before_at)[0] if plan.not_before_at else None
    headers = tuple([(meta[a:b].decode("utf-8", "replace"), meta[b:c]) for a, b, c in plan.headers])
    return RecordMeta(message_id, expires, not_before, headers)


def encode_batch(
    producer_id: bytes,
    first_seq: int,
    key: bytes,
    payloads: Sequence[bytes],
    timestamps_us: Sequence[int],
    metas: Sequence[bytes] | None = None,
    *,
    share_meta: bool = True,
) -> bytes:
    """Pack one batch. Timestamps must not decrease by more than the first one's value and must
    span less than 2**32 µs (71 minutes); callers batch within milliseconds. Without `metas` the
    batch is version 1; with them (one `encode_meta` per payload, b"" for none) version 2, with
    the meta stored once (`FLAG_SHARED_META`) when every record has the same one (and
    `share_meta`, which only tests turn off, to write the per-record layout)."""
    assert len(producer_id) == 16
    assert payloads and len(payloads) == len(timestamps_us)
    if len(key) > limits.key_bytes_max:
        raise ValueError(f"routing key of {len(key)} bytes exceeds {limits.key_bytes_max}")
    flags, shared = 0, b""
    # metas.count: a C loop, identity first (send_many repeats one object)
    if metas and share_meta and len(metas) > 1 and metas[0] and metas.count(metas[0]) == len(metas):
        flags, shared = FLAG_SHARED_META, SHARED_META_LEN.pack(len(metas[0])) + metas[0]
    first_ts = timestamps_us[0]
    # Record heads, metas and payloads interleaved by slice assignment, the heads packed by map():
    # no Python-level loop per record, which made this the publisher's largest cost.
    deltas = map(operator.sub, timestamps_us, itertools.repeat(first_ts))
    body: bytes | memoryview
    if metas is None or flags:
        batch = _native_v1(producer_id, first_seq, key, payloads, timestamps_us)
        if batch is not None and not flags:
            if len(batch) > batch_bytes_max:
                raise ValueError(f"batch of {len(batch)} bytes exceeds {batch_bytes_max}")
            return batch
        if batch is not None:  # its records, under a v2 header and the shared meta
            body = memoryview(batch)[HEADER_BYTES + len(key) :]
        else:
            parts = [b""] * (2 * len(payloads))
            parts[::2] = map(RECORD.pack, deltas, map(len, payloads))
            parts[1::2] = payloads
            body = b"".join(parts)
    else:
        assert len(metas) == len(payloads)
        parts = [b""] * (3 * len(payloads))
        parts[::3] = map(RECORD_V2.pack, deltas, map(len, payloads), map(len, metas))
        parts[1::3] = metas
        parts[2::3] = payloads
        body = b"".join(parts)
    version = FORMAT_VERSION if metas is None else FORMAT_VERSION_META
    tail = (
        struct.pack(
            "<BBHIQQ16sH",
            MAGIC,
            version,
            flags,
            len(payloads),
            first_seq,
            first_ts,
            producer_id,
            len(key),
        )
        + key
        + shared
        + body
    )
    crc = zlib.crc32(tail)
    length = 8 + 4 + len(tail)
    if length + 4 > batch_bytes_max:
        raise ValueError(f"batch of {length + 4} bytes exceeds {batch_bytes_max}")
    return LENGTH.pack(length) + OFFSET.pack(0) + LENGTH.pack(crc) + tail


def _native_v1(
    producer_id: bytes, first_seq: int, key: bytes, payloads: Sequence[bytes],
    timestamps_us: Sequence[int],
) -> bytes | None:  # fmt: skip
    """The compiled encoder's v1 batch, or None: not compiled, or arguments it does not take
    (not lists, a payload that is not `bytes`) and the Python code below packs."""
    if _native is None or not isinstance(payloads, list) or not isinstance(timestamps_us, list):
        return None
    try:
        batch: bytes = _native.encode_v1(producer_id, first_seq, key, payloads, timestamps_us)
    except TypeError:  # a payload that is not `bytes` (a bytearray, a memoryview)
        return None
    return batch


def read_header(buf: bytes | memoryview, at: int = 0) -> BatchHeader:
    """Parse and bound-check the header of the batch starting at `at` (no CRC check)."""
    if len(buf) - at < HEADER_BYTES:
        raise CorruptRecord(f"torn header at byte {at}: {len(buf) - at} of {HEADER_BYTES} bytes")
    (length, base, crc, magic, version, flags, count, seq, ts, pid, key_len) = HEADER.unpack_from(
        buf, at
    )
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic 0x{magic:02x} at byte {at}")
    if version not in FORMAT_VERSIONS:
        raise CorruptRecord(f"unknown format version {version} at byte {at}")
    if flags & ~FLAGS_KNOWN or (flags and version == FORMAT_VERSION):
        raise CorruptRecord(f"unknown flags 0x{flags:04x} for version {version} at byte {at}")
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
    if flags:
        shared = _shared_meta(buf, at, at + HEADER_BYTES + key_len, at + 4 + length)
        return BatchHeader(length, base, crc, count, seq, ts, bytes(pid), key, version, shared)
    return BatchHeader(length, base, crc, count, seq, ts, bytes(pid), key, version)


def _shared_meta(buf: bytes | memoryview, at: int, pos: int, end: int) -> bytes:
    """The shared meta block at `pos` of the batch at `at` (ending at `end`): its bytes, bounds
    checked (its soundness is `check_records`'s and `iter_records`'s to check)."""
    if pos + SHARED_META_LEN.size > end:
        raise CorruptRecord(f"batch at byte {at}: shared meta block torn (no shared_meta_len)")
    (size,) = SHARED_META_LEN.unpack_from(buf, pos)
    pos += SHARED_META_LEN.size
    if not size:
        raise CorruptRecord(f"batch at byte {at}: shared meta block of 0 bytes")
    if pos + size + RECORD_BYTES > end:
        raise CorruptRecord(
            f"batch at byte {at}: shared meta block of {size} bytes at byte {pos - at} "
            f"leaves no room for its records in {end - at} bytes"
        )
    return bytes(buf[pos : pos + size])


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
    if header.shared_meta:
        problem = _check_meta(header.shared_meta, 0, len(header.shared_meta))
        if problem:
            raise CorruptRecord(f"shared meta of batch at byte {at}: {problem}")
    elif header.version != FORMAT_VERSION:
        _check_records_v2(buf, header, at)
        return
    start, end, count = at + header.records_at, at + header.size, header.count
    if count * RECORD_BYTES > end - start:
        raise CorruptRecord(f"batch at byte {at} is too short for its {count} records")
    if count == 1 and RECORD_BYTES + _PAYLOAD_LEN(buf, start)[0] == end - start:
        return
    data, shift = _bytes_of(buf, start, end)
    start, end = start - shift, end - shift
    if _native is not None:  # a compiled walk: ~3 ns a record, whatever their sizes
        if not _native.fills_v1(data, start, end, count):
            _raise_first_problem(buf, at)
        return
    if count == 1 or not _same_sizes(data, start, end, count):
        pos = start
        try:
            for _ in range(count):  # a record past `end` takes pos past it for good
                pos += RECORD_BYTES + _PAYLOAD_LEN(data, pos)[0]
        except struct.error:  # a record head past the end of `data`
            pos = -1
        if pos != end:
            _raise_first_problem(buf, at)


def _raise_first_problem(buf: bytes | memoryview, at: int) -> None:
    """CorruptRecord naming the first bad record of a batch whose records do not fill it."""
    for _ in iter_records(buf, at):
        pass  # raises, naming the first bad record
    raise CorruptRecord(f"the records of the batch at byte {at} do not fill it")


def _check_records_v2(buf: bytes | memoryview, header: BatchHeader, at: int) -> None:
    """check_records of a v2 batch: the records fill it and every meta is sound. Strided
    slices when every record has the first one's sizes and meta shape; else a walk that looks
    each meta's shape up (`_meta_size`)."""
    start, end, count = at + HEADER_BYTES + len(header.key), at + header.size, header.count
    if count * RECORD_V2_BYTES > end - start:
        raise CorruptRecord(f"batch at byte {at} is too short for its {count} records")
    data, shift = _bytes_of(buf, start, end)
    start, end = start - shift, end - shift
    if _same_shapes_v2(data, start, end, count):
        return
    pos, shapes = start, _shapes
    for index in range(count):
        if pos + RECORD_V2_BYTES > end:
            break
        size, meta = _SIZES_V2(data, pos)
        pos += RECORD_V2_BYTES
        if meta and pos + meta <= end:
            # inline: the shape's cached size is the common case (~a third of the walk's cost
            # as a call); a shape longer than the meta never caches to `meta`, so it is checked
            if data[pos] & META_HEADERS and meta > 1:
                known = shapes.get(data[pos : pos + 2 + 3 * data[pos + 1]])
            else:
                known = shapes.get(data[pos : pos + 1])
            problem = "" if known == meta else _check_meta(data, pos, meta)
            if problem:
                raise CorruptRecord(f"record {index} of batch at byte {at}: {problem}")
        pos += meta + size
    else:
        if pos == end:
            return
    for _ in iter_records(buf, at):
        pass  # raises, naming the first bad record
    raise CorruptRecord(f"the records of the batch at byte {at} do not fill it")


def _same_shapes_v2(data: bytes, start: int, end: int, count: int) -> bool:
    """Whether all `count` v2 records in data[start:end] have the first one's payload_len,
    meta_len and meta shape, that shape is sound, and they fill it exactly (C loops only)."""
    size, meta = _SIZES_V2(data, start)
    stride = RECORD_V2_BYTES + meta + size
    if stride * count != end - start:
        return False
    if meta:
        shape = _shape_at(data, start + RECORD_V2_BYTES, meta)
        if shape is None or _meta_size(shape) != meta:
            return False
        same = data[start + 4 : start + RECORD_V2_BYTES + len(shape)]
    else:
        same = data[start + 4 : start + RECORD_V2_BYTES]
    if count == 1:
        return True
    at = start + 4
    return all(data[at + i : end : stride].count(byte) == count for i, byte in enumerate(same))


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
    """Every record of the batch at `at`, with its bounds checked (the CRC is not re-checked);
    a v2 record's meta is decoded into `Record.meta` (CorruptRecord if it is unsound)."""
    header = read_header(buf, at)
    start = at + header.records_at
    # One copy of the records' bytes, then plain bytes slices: cheaper per record than slicing
    # a memoryview and copying each payload out of it.
    data = bytes(memoryview(buf)[start : at + header.size])
    meta = None
    if header.shared_meta:
        try:
            meta = decode_meta(header.shared_meta)
        except CorruptRecord as error:
            raise CorruptRecord(f"shared meta of batch at byte {at}: {error}") from None
    elif header.version != FORMAT_VERSION:
        yield from _iter_records_v2(data, header, at)
        return
    if _native is not None:
        records = _native.records_v1(data, header.count, header.base_offset, header.producer_id,
                                     header.first_seq, header.first_ts_us, header.key)  # fmt: skip
        if records is not None and meta is None:
            yield from records
            return
        if records is not None:  # the shared meta into each: a tuple concatenation, in C
            tail, new = (meta,), _new_tuple
            yield from [new(Record, record[:6] + tail) for record in records]
            return  # None: unsound, and the walk below names the first bad record
    end, pos = len(data), 0
    unpack, new = RECORD.unpack_from, _new_tuple
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
        yield new(Record, (offset, producer, seq + index, stamp + delta, key, data[pos:stop], meta))
        pos = stop
    if pos != end:
        raise CorruptRecord(f"batch at byte {at} has {end - pos} bytes after its last record")


def _iter_records_v2(data: bytes, header: BatchHeader, at: int) -> Iterator[Record]:
    end, pos, new = len(data), 0, _new_tuple
    offset, producer, key = header.base_offset, header.producer_id, header.key
    seq, stamp = header.first_seq, header.first_ts_us
    metas: dict[bytes, RecordMeta] = {}  # a batch's records often share one meta: decode it once
    for index in range(header.count):
        if pos + RECORD_V2_BYTES > end:
            raise CorruptRecord(f"record {index} of batch at byte {at} is torn")
        delta, size, meta_len = RECORD_V2.unpack_from(data, pos)
        pos += RECORD_V2_BYTES
        stop = pos + meta_len + size
        if stop > end:
            raise CorruptRecord(f"record {index} of batch at byte {at} overruns the batch")
        meta = None
        if meta_len:
            raw = data[pos : pos + meta_len]
            meta = metas.get(raw)
            if meta is None:
                try:
                    meta = metas[raw] = decode_meta(raw)
                except CorruptRecord as error:
                    raise CorruptRecord(f"record {index} of batch at byte {at}: {error}") from None
        yield new(Record, (offset, producer, seq + index, stamp + delta, key,
                           data[pos + meta_len : stop], meta))  # fmt: skip
        pos = stop
    if pos != end:
        raise CorruptRecord(f"batch at byte {at} has {end - pos} bytes after its last record")


def payload_bytes(buf: bytes | memoryview, header: BatchHeader, at: int = 0) -> int:
    """Bytes of the batch's payloads (v2: without the metas; the records must be sound)."""
    heads = header.record_head_bytes * header.count
    total = header.size - header.records_at - heads
    if header.v1_records:
        return total
    pos = at + HEADER_BYTES + len(header.key)
    for _ in range(header.count):
        size, meta = _SIZES_V2(buf, pos)
        total -= meta
        pos += RECORD_V2_BYTES + meta + size
    return total


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


def message_ids(buf: bytes | memoryview, header: BatchHeader, at: int = 0) -> list[bytes | None]:
    """Each record's message id (None: it has none) of a checked batch (`check_records`
    passed); [] for a v1 batch, which carries none: the exchange's de-duplication reads ids
    from v2 batches only, so a v1 batch costs it nothing."""
    if header.version == FORMAT_VERSION:
        return []
    if header.shared_meta:  # every record has the shared meta's id, or none
        shared = header.shared_meta
        if not shared[0] & META_ID:
            return [None] * header.count
        id_at = _id_at(shared, 0, shared[0])
        return [shared[id_at : id_at + MESSAGE_ID_BYTES]] * header.count
    start, end = at + HEADER_BYTES + len(header.key), at + header.size
    data, shift = _bytes_of(buf, start, end)
    start, end = start - shift, end - shift
    if _same_shapes_v2(data, start, end, header.count):  # one slice per record, in C
        size, meta = _SIZES_V2(data, start)
        flags = data[start + RECORD_V2_BYTES] if meta else 0
        if not flags & META_ID:
            return [None] * header.count
        first = start + RECORD_V2_BYTES + _id_at(data, start + RECORD_V2_BYTES, flags)
        stride = RECORD_V2_BYTES + meta + size
        return [data[p : p + MESSAGE_ID_BYTES] for p in range(first, end, stride)]
    pos, ids = start, list[bytes | None]()
    for _ in range(header.count):
        size, meta = _SIZES_V2(data, pos)
        pos += RECORD_V2_BYTES
        flags = data[pos] if meta else 0
        if flags & META_ID:
            id_at = pos + _id_at(data, pos, flags)
            ids.append(data[id_at : id_at + MESSAGE_ID_BYTES])
        else:
            ids.append(None)
        pos += meta + size
    return ids


def _id_at(data: bytes, meta_at: int, flags: int) -> int:
    """Where a meta's id starts, from the meta's start: after the flags, and the header
    lengths if any."""
    return 1 + (1 + 3 * data[meta_at + 1] if flags & META_HEADERS else 0)
