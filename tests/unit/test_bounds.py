"""Hostile numbers and torn records are refused where bytes become values (issue 16, items 1
and 2): offsets, timestamps, sequence numbers and record lengths of the data plane."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from logutil import PRODUCER, batch, torn

from roq import limits
from roq.errors import CorruptRecord, DecodeError
from roq.log import format as fmt
from roq.protocol import dataplane

# each test runs on the compiled batch loops and on the pure-Python ones (conftest.py)
pytestmark = pytest.mark.usefixtures("batch_code")

OFFSETS_OUT_OF_RANGE = [limits.log_offset_max, 2**63 - 1, 2**63 + 5, 2**64 - 1]


@pytest.mark.parametrize("offset", OFFSETS_OUT_OF_RANGE)
def test_a_read_offset_beyond_any_log_is_refused(offset: int) -> None:
    with pytest.raises(DecodeError, match=r"read offset \d+ is beyond any log"):
        dataplane.parse_read_request(dataplane.read_request(offset, 4096))


def test_the_largest_plausible_offset_is_accepted() -> None:
    request = dataplane.parse_read_request(dataplane.read_request(limits.log_offset_max - 1))
    assert request.offset == limits.log_offset_max - 1
    huge = dataplane.parse_read_request([dataplane.READ, struct.pack("<QI", 0, 2**32 - 1)])
    assert huge.max_bytes == dataplane.READ_BYTES_MAX  # a length is clamped, not trusted


@pytest.mark.parametrize("timestamp_us", [2**63, 2**64 - 1])
def test_a_seek_past_2_63_is_refused(timestamp_us: int) -> None:
    with pytest.raises(DecodeError, match="timestamp"):
        dataplane.parse_read_request(dataplane.seek_request(timestamp_us))
    assert dataplane.parse_read_request(dataplane.seek_request(2**63 - 1)).timestamp_us


@pytest.mark.parametrize("field", [0, 1, 2])
@pytest.mark.parametrize("value", OFFSETS_OUT_OF_RANGE)
def test_a_read_reply_with_an_offset_beyond_any_log_is_refused(field: int, value: int) -> None:
    numbers = [0, 0, 0]
    numbers[field] = value
    frames = dataplane.read_reply(dataplane.READ_BATCHES, *numbers, b"")
    with pytest.raises(DecodeError, match="beyond any log"):
        dataplane.parse_read_reply(frames)


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [(b"", "must be 8 bytes"), (bytes(9), "must be 8 bytes"), (struct.pack("<Q", 2**63), "beyond")],
)
def test_decode_offset_checks_size_and_range(frame: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        dataplane.decode_offset(frame)
    assert dataplane.decode_offset(struct.pack("<Q", 4096)) == 4096


def _with_header(seq: int, ts: int, count: int = 1) -> bytes:
    stamps = [ts] * count
    return fmt.encode_batch(PRODUCER, seq, b"k", [b"x"] * count, stamps)


@pytest.mark.parametrize(
    ("seq", "ts"),
    [(2**63, 0), (2**63 - 1, 0), (2**64 - 2, 0), (0, 2**63 - 2**32 + 1), (0, 2**64 - 1)],
)
def test_a_batch_whose_sequence_or_timestamp_passes_2_63_is_refused(seq: int, ts: int) -> None:
    data = _with_header(seq, ts, count=2)
    with pytest.raises(CorruptRecord, match="past 2\\*\\*63"):
        fmt.read_header(data)


def test_the_last_representable_sequence_and_timestamp_are_accepted() -> None:
    header = fmt.read_header(_with_header(2**63 - 2, 2**63 - 2**32, count=2))
    assert header.last_seq == 2**63 - 1


def test_a_torn_record_is_refused_naming_it_and_the_crc_alone_passes_it() -> None:
    data = torn(batch(0))
    fmt.check_batch(data)  # the CRC holds
    with pytest.raises(CorruptRecord, match="record 1 of batch at byte 0"):
        fmt.validate_batch(data)


def test_a_batch_too_short_for_its_count_is_refused_before_any_walk() -> None:
    data = bytearray(batch(0, records=1))
    struct.pack_into("<I", data, 20, 2**32 - 1)  # count
    struct.pack_into("<I", data, 12, zlib.crc32(data[fmt.CRC_START :]))
    with pytest.raises(CorruptRecord, match="too short for its 4294967295 records"):
        fmt.validate_batch(bytes(data))


def _reference_ok(data: bytes) -> bool:
    try:
        for _ in fmt.iter_records(data):
            pass
    except CorruptRecord:
        return False
    return True


# Changes to one record's payload_len: each byte of the field in turn, and the record's head
DELTAS = [1, -1, 8, -8, 256, -256, 65536, 2**24, -(2**24), 2**31]


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    same=st.booleans(),
    edits=st.lists(st.tuples(st.integers(0, 29), st.sampled_from(DELTAS)), max_size=3),
    view=st.sampled_from(["bytes", "view", "slice"]),
)
def test_check_records_agrees_with_reading_every_record(
    sizes: list[int], same: bool, edits: list[tuple[int, int]], view: str
) -> None:
    """The fast check (strided slices when the sizes are equal, a walk otherwise) accepts
    exactly the batches whose records can all be read, whatever their lengths claim."""
    if same:
        sizes = [sizes[0]] * len(sizes)
    payloads = [b"p" * n for n in sizes]
    data = bytearray(fmt.encode_batch(PRODUCER, 0, b"key", payloads, [0] * len(sizes)))
    heads = [
        fmt.HEADER_BYTES + 3 + sum(fmt.RECORD_BYTES + n for n in sizes[:i])
        for i in range(len(sizes))
    ]
    for index, delta in edits:
        if index < len(heads):
            length = struct.unpack_from("<I", data, heads[index] + 4)[0]
            struct.pack_into("<I", data, heads[index] + 4, (length + delta) % 2**32)
    header = fmt.read_header(data)
    buf: bytes | memoryview = bytes(data)
    if view == "view":
        buf = memoryview(bytes(data))
    elif view == "slice":  # a batch inside a larger buffer, as in a log read of several
        buf = memoryview(b"\xb7" * 5 + bytes(data) + b"\0" * 9)[5 : 5 + len(data)]
    try:
        fmt.check_records(buf, header)
        ok = True
    except CorruptRecord:
        ok = False
    assert ok == _reference_ok(bytes(data))
