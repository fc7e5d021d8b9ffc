"""The record-batch format's per-record loops, written for mypyc (issue 35): `make setup` compiles
this module into an extension beside it, and `roq.log.format` uses that extension when it loads.
Run as plain Python these loops are slower than format.py's own code (which keeps the per-record
work in C through struct, map and strided slices), so format.py never calls this module unless it
is compiled (`native()` below), and ROQ_PURE_PYTHON=1 keeps it out altogether (the tests run the
format both ways).

Only version 1 batches (no meta), the common case, go through here; everything returns a result
for format.py to act on and raises nothing on bad input: where a batch is unsound, format.py's
own walk finds the record to name in its error. The layout is the one of format.py's docstring.
"""

from __future__ import annotations

import zlib
from typing import Final

from librt.strings import BytesWriter, read_i32_le, write_i16_le, write_i32_le, write_i64_le
from mypy_extensions import i32, i64

from roq.log.record import Record

# Final: mypyc inlines them (a plain module global is a dictionary lookup at every use)
_MAGIC: Final = 0xB7
_VERSION: Final = 1
_RECORD_BYTES: Final = 8
# A named tuple's own constructor is a Python function (~1 µs a call); the tuple's is C (~0.2)
_new: Final = tuple.__new__


def _u32(data: bytes, at: i64) -> i64:
    """The unsigned 32-bit little-endian integer at data[at:at + 4] (librt reads it signed)."""
    return i64(read_i32_le(data, at)) & 0xFFFFFFFF


def _i32(value: i64) -> i32:
    """An unsigned 32-bit value as the signed one of the same bytes (librt writes signed)."""
    return i32(value - 0x100000000 if value >= 0x80000000 else value)


def _i64(value: int) -> i64:
    """An unsigned 64-bit value as the signed one of the same bytes (ValueError if it is not
    one: below 0 or from 2**64 on)."""
    if value < 0 or value >= 0x10000000000000000:
        raise ValueError(f"{value} is not an unsigned 64-bit integer")
    return i64(value - 0x10000000000000000 if value >= 0x8000000000000000 else value)


def fills_v1(data: bytes, start: i64, end: i64, count: i64) -> bool:
    """Whether `count` v1 records, the first at `start`, end exactly at `end` (each record's
    head inside data[:end])."""
    pos, left = start, count
    while left > 0:  # not `for _ in range(count)`, which boxes its index
        if pos + _RECORD_BYTES > end:
            return False
        pos += _RECORD_BYTES + _u32(data, pos + 4)
        left -= 1
    return pos == end


def records_v1(
    data: bytes,
    count: i64,
    offset: int,
    producer: bytes,
    seq: int,
    stamp: int,
    key: bytes,
) -> list[Record] | None:
    """The `count` v1 records that fill `data` exactly, or None if they do not."""
    out: list[Record] = []
    pos: i64 = 0
    end: i64 = len(data)
    for index in range(count):
        if pos + _RECORD_BYTES > end:
            return None
        delta = int(_u32(data, pos))
        stop = pos + _RECORD_BYTES + _u32(data, pos + 4)
        if stop > end:
            return None
        fields = (offset, producer, seq + index, stamp + delta, key, data[pos + 8 : stop], None)
        out.append(_new(Record, fields))
        pos = stop
    return out if pos == end else None


def encode_v1(
    producer_id: bytes, first_seq: int, key: bytes, payloads: list[bytes], timestamps_us: list[int]
) -> bytes:
    """A v1 batch, byte for byte what format.encode_batch builds (which checks the arguments
    and the batch's size bound). ValueError for a timestamp before the first one or 2**32 µs
    after it; TypeError for a payload that is not `bytes`."""
    writer = BytesWriter()
    writer.append(_MAGIC)
    writer.append(_VERSION)
    write_i16_le(writer, 0)
    write_i32_le(writer, len(payloads))
    first_ts = timestamps_us[0]
    write_i64_le(writer, _i64(first_seq))
    write_i64_le(writer, _i64(first_ts))
    writer.write(producer_id)
    write_i16_le(writer, len(key))
    writer.write(key)
    for index in range(len(payloads)):
        payload = payloads[index]
        delta = timestamps_us[index] - first_ts
        if delta < 0 or delta > 0xFFFFFFFF:
            raise ValueError(f"timestamp {timestamps_us[index]} is not within 2**32 µs after "
                             f"the batch's first, {first_ts}")  # fmt: skip
        write_i32_le(writer, _i32(delta))
        write_i32_le(writer, _i32(len(payload)))
        writer.write(payload)
    tail = writer.getvalue()
    head = BytesWriter()
    write_i32_le(head, 12 + len(tail))
    write_i64_le(head, 0)
    write_i32_le(head, _i32(zlib.crc32(tail)))
    head.write(tail)
    return head.getvalue()
