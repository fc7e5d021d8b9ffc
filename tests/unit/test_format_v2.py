"""Log format version 2 (docs/log-format.md §1): records with a meta section (headers, a message
id, expiry and not-before times). Encode and decode, the CRC over the metas, the bounds, the
record check's fast and slow paths against reading every record, and v1 logs written by the
v1 writer read beside v2 batches by the log, the inspector and the analytics scan."""

from __future__ import annotations

import functools
import io
import struct
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from logutil import PRODUCER

from roq import limits
from roq.analytics import scan
from roq.client.publisher import _Handover
from roq.errors import CorruptRecord
from roq.log import FlushPolicy, Log, ReadStatus
from roq.log import format as fmt
from roq.log.inspect import Batch, Summary, walk
from roq.transport import Kind, connect, new_context, open_socket

# each test runs on the compiled batch loops and on the pure-Python ones (conftest.py)
pytestmark = pytest.mark.usefixtures("batch_code")

TS = 1_700_000_000_000_000
OS = FlushPolicy("os")


def v1_reference(seq: int, key: bytes, payloads: list[bytes], stamps: list[int]) -> bytes:
    """A v1 batch packed from the page's table alone (§1), not by format.py: what the v1
    writer wrote before version 2 existed."""
    records = b"".join(
        struct.pack("<II", ts - stamps[0], len(p)) + p
        for p, ts in zip(payloads, stamps, strict=True)
    )
    tail = struct.pack("<BBHIQQ16sH", 0xB7, 1, 0, len(payloads), seq, stamps[0], PRODUCER, len(key))
    tail += key + records
    return struct.pack("<IQI", 12 + len(tail), 0, zlib.crc32(tail)) + tail


def v2_batch(seq: int = 0, count: int = 3, meta: bytes | None = None, share: bool = False) -> bytes:
    """Records that all carry the same meta: a meta per record (the layout of every v2 batch
    written before the shared meta existed) or, with `share`, the meta once."""
    meta = fmt.encode_meta({"trace": b"t" * 32, "type": "a/b"}) if meta is None else meta
    payloads = [b"%d" % (seq + i) for i in range(count)]
    stamps, metas = [TS + seq] * count, [meta] * count
    return fmt.encode_batch(PRODUCER, seq, b"key", payloads, stamps, metas, share_meta=share)


def fix_crc(data: bytearray) -> bytes:
    struct.pack_into("<I", data, 12, zlib.crc32(data[fmt.CRC_START :]))
    return bytes(data)


# --- encode and decode ----------------------------------------------------------------------


def test_the_v2_worked_example_in_the_format_doc_is_what_the_code_writes():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "log-format.md").read_text()
    block = doc.split("#### The worked example in version 2", 1)[1].split("```", 2)[1]
    shown = bytes.fromhex("".join(line[6:] for line in block.strip().splitlines()))
    meta = fmt.encode_meta({"content-type": "text/plain"}, bytes(range(16, 32)), TS + 60_000_000)
    made = bytearray(
        fmt.encode_batch(PRODUCER, 7, b"k", [b"hi", b"yo!"], [TS, TS + 250], [meta, b""])
    )
    fmt.stamp_offset(made, 4096)
    assert shown == bytes(made)
    first, second = fmt.iter_records(shown)
    assert first.headers == (("content-type", b"text/plain"),)
    assert first.message_id == bytes(range(16, 32)) and first.expires_at_us == TS + 60_000_000
    assert second.meta is None and second.payload == b"yo!"


def test_without_meta_the_writer_still_writes_v1_byte_for_byte():
    payloads, stamps = [b"hi", b"yo!", b""], [TS, TS + 250, TS + 251]
    made = fmt.encode_batch(PRODUCER, 7, b"k", payloads, stamps)
    assert made == v1_reference(7, b"k", payloads, stamps)
    assert fmt.validate_batch(made).version == 1


def test_every_field_round_trips_and_records_without_meta_mix_in():
    pid = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    metas = [
        fmt.encode_meta([("a", b"1"), ("a", "2"), ("é", b"\x00\xff")], pid, -5, 2**63 - 1),
        b"",
        fmt.encode_meta(not_before_us=TS),
        fmt.encode_meta(message_id=b"m" * 16),
    ]
    payloads = [b"p0", b"p1", b"", b"p3"]
    batch = fmt.encode_batch(PRODUCER, 3, b"kk", payloads, [TS] * 4, metas)
    header = fmt.validate_batch(batch)
    assert header.version == 2 and header.record_head_bytes == 10
    records = list(fmt.iter_records(batch))
    assert [r.payload for r in records] == payloads and [r.seq for r in records] == [3, 4, 5, 6]
    first = records[0]
    assert first.headers == (("a", b"1"), ("a", b"2"), ("é", b"\x00\xff"))
    assert first.header("a") == b"1" and first.header("b") is None
    assert (first.message_id, first.expires_at_us, first.not_before_us) == (
        pid.bytes,
        -5,
        2**63 - 1,
    )
    assert records[1].meta is None and records[1].headers == () and records[1].message_id is None
    assert records[2].meta == fmt.RecordMeta(not_before_us=TS)
    assert records[3].message_id == b"m" * 16 and records[3].headers == ()


def test_no_meta_at_all_encodes_to_nothing():
    assert fmt.encode_meta() == b"" and fmt.encode_meta({}) == b"" and fmt.encode_meta([]) == b""


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"headers": {f"h{i}": b"" for i in range(33)}}, "33 headers: at most 32"),
        ({"headers": {"h": b"v" * 8192}}, "headers of 8193 bytes"),
        ({"headers": {"": b"v"}}, "must have 1 to 255 bytes"),
        ({"headers": {"n" * 256: b"v"}}, "must have 1 to 255 bytes"),
        ({"headers": {b"bytes-name": b"v"}}, "header name b'bytes-name' must be str"),
        ({"headers": {"h": 5}}, "header value 5 must be str or bytes"),
        ({"message_id": b"short"}, "message id of 5 bytes: it must be 16"),
        ({"expires_at_us": 2**63}, "expires_at_us 9223372036854775808 is not a signed"),
        ({"not_before_us": -(2**63) - 1}, "not_before_us"),
        ({"not_before_us": True}, "not_before_us True"),
    ],
)
def test_a_meta_past_a_bound_is_refused_naming_it(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        fmt.encode_meta(**kwargs)


def test_the_largest_meta_fits_beside_the_largest_message():
    headers = [(f"{i:02d}" + "n" * 253, b"") for i in range(limits.record_headers_max)]
    value = b"v" * (limits.record_headers_bytes_max - 32 * 255)
    headers[0] = (headers[0][0], value)
    meta = fmt.encode_meta(headers, b"i" * 16, 1, 2)
    assert len(meta) == fmt.META_BYTES_MAX
    big = b"x" * limits.message_bytes_max
    batch = fmt.encode_batch(PRODUCER, 0, b"k" * 255, [big], [TS], [meta])
    assert len(batch) <= limits.batch_bytes_max
    [record] = fmt.iter_records(fmt.validate_batch(batch) and batch)
    assert record.headers[0][1] == value and len(record.headers) == 32


# --- the CRC and the record check -----------------------------------------------------------


def test_the_crc_covers_every_byte_of_the_metas():
    batch = v2_batch()
    meta_at = fmt.HEADER_BYTES + 3 + fmt.RECORD_V2_BYTES
    for at in range(meta_at, meta_at + 40):
        damaged = bytearray(batch)
        damaged[at] ^= 0x01
        with pytest.raises(CorruptRecord, match="CRC mismatch"):
            fmt.check_batch(bytes(damaged))


def _meta_start(index: int, batch: bytes) -> int:
    """Where record `index`'s meta starts in a batch of equal records."""
    header = fmt.read_header(batch)
    start = fmt.HEADER_BYTES + len(header.key)
    stride = (header.size - start) // header.count
    return start + index * stride + fmt.RECORD_V2_BYTES


@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize(
    ("offset", "value", "fragment"),
    [
        (0, 0x10 | fmt.META_HEADERS, "meta flags 0x18 are unknown"),
        (0, 0x00, "meta flags 0x00 are unknown or none"),
        (1, 0, "0 headers"),
        (1, 33, "too short for its own lengths"),
        (2, 0, "a header with an empty name"),
        (3, 200, "its lengths say"),
    ],
)
def test_an_unsound_meta_is_refused_by_the_record_check(index, offset, value, fragment):
    """In the first or a later record: the strided fast path must not take a damaged meta for
    its neighbours'."""
    data = bytearray(v2_batch())
    data[_meta_start(index, bytes(data)) + offset] = value
    damaged = fix_crc(data)
    fmt.check_batch(damaged)  # the CRC holds: only the record check can tell
    with pytest.raises(CorruptRecord, match=f"record {index} .*{fragment}"):
        fmt.validate_batch(damaged)
    with pytest.raises(CorruptRecord):
        list(fmt.iter_records(damaged))


def test_a_meta_len_that_overruns_the_batch_is_refused():
    data = bytearray(v2_batch(count=1))
    struct.pack_into("<H", data, fmt.HEADER_BYTES + 3 + 8, 60_000)
    with pytest.raises(CorruptRecord, match="overruns"):
        fmt.validate_batch(fix_crc(data))


def test_a_v2_batch_too_short_for_its_count_is_refused_before_any_walk():
    data = bytearray(v2_batch(count=1))
    struct.pack_into("<I", data, 20, 2**32 - 1)
    with pytest.raises(CorruptRecord, match="too short for its 4294967295 records"):
        fmt.validate_batch(fix_crc(data))


def _reference_ok(data: bytes) -> bool:
    try:
        for _ in fmt.iter_records(data):
            pass
    except CorruptRecord:
        return False
    return True


_HEADERS = st.lists(
    st.tuples(st.text(min_size=1, max_size=4), st.binary(max_size=40)), min_size=0, max_size=3
)
_METAS = st.builds(
    lambda h, i, e: fmt.encode_meta(h, i, e),
    _HEADERS,
    st.one_of(st.none(), st.binary(min_size=16, max_size=16)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)


@settings(max_examples=300)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=20),
    metas=st.lists(_METAS, min_size=1, max_size=20),
    same=st.booleans(),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    view=st.sampled_from(["bytes", "view", "slice"]),
    share=st.booleans(),
)
def test_the_v2_record_check_agrees_with_reading_every_record(
    sizes, metas, same, edits, view, share
):
    """Records of one size and meta shape (the strided path) or mixed (the walk), with random
    bytes overwritten anywhere after the batch header (heads, meta lengths, flags, payloads),
    the CRC made right again: the check accepts exactly the batches every record of which can
    be read, metas included."""
    if same:
        sizes, metas = [sizes[0]] * len(sizes), [metas[0]] * len(sizes)
    metas = (metas * len(sizes))[: len(sizes)]
    payloads = [b"p" * n for n in sizes]
    stamps = [TS] * len(sizes)
    data = bytearray(fmt.encode_batch(PRODUCER, 0, b"key", payloads, stamps, metas,
                                      share_meta=share))  # fmt: skip
    body = fmt.HEADER_BYTES + 3
    for at, value in edits:
        data[body + at % (len(data) - body)] = value
    damaged = fix_crc(data)
    try:
        header = fmt.read_header(damaged)  # a shared meta block's bounds are the header's
    except CorruptRecord:
        assert not _reference_ok(damaged)
        return
    buf: bytes | memoryview = damaged
    if view == "view":
        buf = memoryview(damaged)
    elif view == "slice":
        buf = memoryview(b"\xb7" * 5 + damaged + b"\0" * 9)[5 : 5 + len(damaged)]
    try:
        fmt.check_records(buf, header)
        ok = True
    except CorruptRecord:
        ok = False
    assert ok == _reference_ok(damaged)


@given(
    metas=st.lists(
        st.tuples(
            _HEADERS,
            st.one_of(st.none(), st.binary(min_size=16, max_size=16)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_whatever_a_publisher_may_send_reads_back_as_sent(metas):
    encoded = [fmt.encode_meta(*fields) for fields in metas]
    payloads = [b"x%d" % i for i in range(len(metas))]
    batch = fmt.encode_batch(PRODUCER, 0, b"k", payloads, [TS] * len(metas), encoded)
    fmt.validate_batch(batch)
    for record, (headers, message_id, expires, not_before) in zip(
        fmt.iter_records(batch), metas, strict=True
    ):
        assert record.headers == tuple((n, v) for n, v in headers)
        assert (record.message_id, record.expires_at_us, record.not_before_us) == (
            message_id,
            expires,
            not_before,
        )


# --- shared meta (flags bit 0) ----------------------------------------------------------------


def test_the_shared_meta_worked_example_in_the_format_doc_is_what_the_code_writes():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "log-format.md").read_text()
    block = doc.split("#### Shared meta:", 1)[1].split("```", 2)[1]
    shown = bytes.fromhex("".join(line[6:] for line in block.strip().splitlines()))
    meta = fmt.encode_meta({"content-type": "text/plain"})
    made = bytearray(
        fmt.encode_batch(PRODUCER, 7, b"k", [b"hi", b"yo!"], [TS, TS + 250], [meta, meta])
    )
    fmt.stamp_offset(made, 4096)
    assert shown == bytes(made)
    header = fmt.validate_batch(shown)
    assert header.shared_meta == meta and header.record_head_bytes == fmt.RECORD_BYTES
    first, second = fmt.iter_records(shown)
    assert first.headers == second.headers == (("content-type", b"text/plain"),)
    assert (second.seq, second.timestamp_us, second.payload) == (8, TS + 250, b"yo!")


def test_records_sharing_a_meta_store_it_once_and_read_as_the_per_record_layout():
    """What `send_many(headers=...)` writes: 600 x 100 B with two 32-byte headers is v1's size
    plus one meta, and reads record for record as the per-record layout (every v2 batch
    written before the flag), which stays readable."""
    meta = fmt.encode_meta({"h0": b"a" * 32, "h1": b"b" * 32}, b"i" * 16, TS + 1)
    payloads, stamps = [b"%100d" % i for i in range(600)], [TS + i for i in range(600)]
    shared = fmt.encode_batch(PRODUCER, 9, b"key", payloads, stamps, [meta] * 600)
    old = fmt.encode_batch(PRODUCER, 9, b"key", payloads, stamps, [meta] * 600, share_meta=False)
    v1 = fmt.encode_batch(PRODUCER, 9, b"key", payloads, stamps)
    assert len(shared) == len(v1) + 2 + len(meta) and len(old) > len(shared) + 600 * len(meta)
    new_header, old_header = fmt.validate_batch(shared), fmt.validate_batch(old)
    assert new_header.shared_meta == meta and not old_header.shared_meta
    assert list(fmt.iter_records(shared)) == list(fmt.iter_records(old))
    assert fmt.payload_bytes(shared, new_header) == fmt.payload_bytes(old, old_header) == 60_000
    assert fmt.message_ids(shared, new_header) == fmt.message_ids(old, old_header)
    assert fmt.message_ids(shared, new_header) == [b"i" * 16] * 600
    plain = fmt.encode_meta({"h": b"v"})
    header = fmt.validate_batch(v2_batch(count=4, meta=plain, share=True))
    assert fmt.message_ids(v2_batch(count=4, meta=plain, share=True), header) == [None] * 4


def test_metas_that_differ_keep_the_per_record_layout():
    one, two = fmt.encode_meta({"h": b"1"}), fmt.encode_meta({"h": b"2"})
    for metas in ([one, two], [one, b""], [b"", b""], [one]):
        batch = fmt.encode_batch(PRODUCER, 0, b"k", [b"a"] * len(metas), [TS] * len(metas), metas)
        header = fmt.validate_batch(batch)
        assert header.version == 2 and not header.shared_meta
        assert header.record_head_bytes == fmt.RECORD_V2_BYTES


def _shared_len_at() -> int:
    return fmt.HEADER_BYTES + len(b"key")


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        # shared_meta_len past the batch's end: the block is torn
        (lambda d: struct.pack_into("<H", d, _shared_len_at(), 60_000),
         "shared meta block of 60000 bytes at byte 63 leaves no room for its records"),
        (lambda d: struct.pack_into("<H", d, _shared_len_at(), 0), "shared meta block of 0 bytes"),
        # the shared meta unsound: its flags, its header count, its lengths
        (lambda d: d.__setitem__(_shared_len_at() + 2, 0x10 | fmt.META_HEADERS),
         "shared meta of batch at byte 0: meta flags 0x18 are unknown"),
        (lambda d: d.__setitem__(_shared_len_at() + 3, 0),
         "shared meta of batch at byte 0: 0 headers"),
        (lambda d: d.__setitem__(_shared_len_at() + 5, 200),
         "shared meta of batch at byte 0: meta of .* bytes, its lengths say"),
        # shared_meta_len one short: the meta disagrees with its shape
        (lambda d: struct.pack_into("<H", d, _shared_len_at(), d[_shared_len_at()] - 1),
         "shared meta of batch at byte 0"),
        # the flag on a version 1 batch, and a bit no reader knows
        (lambda d: d.__setitem__(17, 1), "unknown flags 0x0001 for version 1"),
        (lambda d: d.__setitem__(18, 3), "unknown flags 0x0003 for version 2"),
        # a record after the shared block overruns the batch
        (lambda d: struct.pack_into("<I", d, len(d) - 1 - 8 + 4, 9),
         "record 2 of batch at byte 0 overruns"),
    ],
)  # fmt: skip
def test_a_torn_or_inconsistent_shared_meta_block_is_refused_naming_it(edit, fragment):
    data = bytearray(v2_batch(count=3, share=True))
    assert fmt.read_header(bytes(data)).shared_meta
    edit(data)
    damaged = fix_crc(data)
    with pytest.raises(CorruptRecord, match=fragment):
        fmt.validate_batch(damaged)
    with pytest.raises(CorruptRecord, match=fragment):
        list(fmt.iter_records(damaged))
    with pytest.raises(CorruptRecord, match=fragment.replace("at byte 0", "at byte 3")):
        fmt.validate_batch(b"\0" * 3 + damaged, 3)  # a batch inside a larger frame


# --- v1 logs stay readable ------------------------------------------------------------------


def _v1_log(directory: Path) -> list[int]:
    """A log written the v1 way: the writer without metas, through Log.append."""
    with Log(directory, flush_policy=OS) as log:
        return [
            log.append(fmt.encode_batch(PRODUCER, 3 * i, b"key", [b"a", b"bb", b"c"], [TS] * 3))
            for i in range(4)
        ]


def test_a_v1_log_is_read_beside_v2_batches_appended_to_it(tmp_path):
    offsets = _v1_log(tmp_path)
    assert all(
        (tmp_path / "00000000000000000000.log").read_bytes()[o + 17] == 1 for o in offsets
    ), "the writer without metas writes version 1"
    with Log(tmp_path, flush_policy=OS) as log:  # reopened: recovery checks every v1 batch
        assert log.recovered_bytes_dropped == 0 and log.corrupt_batches == 0
        v2_at = log.append(v2_batch(seq=12))
        log.append(fmt.encode_batch(PRODUCER, 15, b"key", [b"d"], [TS]))
    with Log(tmp_path, flush_policy=OS) as log:  # and recovery takes the v2 batch too
        assert log.recovered_bytes_dropped == 0 and log.corrupt_batches == 0
        result = log.read(0, 10**6)
        assert result.status is ReadStatus.BATCHES
    records = [
        r for at, _ in fmt.iter_batches(result.data) for r in fmt.iter_records(result.data, at)
    ]
    assert [r.seq for r in records] == list(range(16))
    assert [r.meta is None for r in records] == [True] * 12 + [False] * 3 + [True]
    assert records[12].header("trace") == b"t" * 32 and records[12].offset == v2_at


def test_the_inspector_and_the_analytics_scan_read_v1_and_v2_alike(tmp_path):
    _v1_log(tmp_path)
    with Log(tmp_path, flush_policy=OS) as log:
        log.append(v2_batch(seq=12, count=3))
        log.append(v2_batch(seq=15, count=2, share=True))
    summary = Summary(str(tmp_path))
    for item in walk(tmp_path):
        if isinstance(item, Batch):
            summary.add(item)
        else:
            pytest.fail(f"unexpected {item}")
    assert summary.records == 17 and summary.batches == 6 and summary.clean
    segment = (tmp_path / "00000000000000000000.log").read_bytes()
    # from the start, and from byte 1: resynchronising onto the second (v1) batch
    for start, messages, payload in ((0, 17, 4 * 4 + 3 * 2 + 2 * 2), (1, 14, 3 * 4 + 5 * 2)):
        counts: dict[int, scan.ProducerMinute] = {}
        window = scan.Window(io.BytesIO(segment), len(segment))
        count = functools.partial(_count, into=counts)
        result = scan.scan_range(window, 0, start, len(segment), count)
        assert not result.corrupt and result.records == messages
        assert sum(c.messages for c in counts.values()) == messages
        assert sum(c.payload_bytes for c in counts.values()) == payload, "metas are not payload"


def _count(buf: bytes, i: int, header: fmt.BatchHeader, into: dict) -> None:
    scan.count_records(buf, i, header, into)


@pytest.mark.parametrize("share", [False, True])
def test_the_analytics_scan_and_the_log_resynchronise_onto_a_v2_batch(tmp_path, share):
    with Log(tmp_path, flush_policy=OS) as log:
        log.append(v2_batch(seq=0, count=2))
        second = log.append(v2_batch(seq=2, count=2, share=share))
        assert log.next_sound_batch(1) == second
        read = log.read(second, 1 << 20)
        assert read.status is ReadStatus.BATCHES
        assert [r.header("trace") for r in fmt.iter_records(read.data)] == [b"t" * 32] * 2
    segment = (tmp_path / "00000000000000000000.log").read_bytes()
    window = scan.Window(io.BytesIO(segment), len(segment))
    assert scan.resync(window, 0, 1) == second


# --- the publisher's buffers ------------------------------------------------------------------


@pytest.fixture
def shared():
    context = new_context()
    woken = open_socket(context, Kind.PAIR)
    woken.bind("inproc://format-v2-test")
    handover = _Handover("t", PRODUCER, batch_bytes=10**6, linger_s=60, buffer_bytes=10**7,
                         block_s=None)  # fmt: skip
    handover.wake = open_socket(context, Kind.PAIR)
    connect(handover.wake, "inproc://format-v2-test")
    yield handover
    handover.wake.close(0)
    woken.close(0)
    context.term()


def _sealed(shared: _Handover) -> list[bytes]:
    with shared.lock:
        for key, buffer in list(shared.buffers.items()):
            shared._seal(key, buffer, poke=False)
    return [item.batch for item in shared.outq if item.batch is not None]


def test_a_publisher_buffer_turns_v2_when_a_message_has_meta_and_sizes_stay_exact(shared):
    meta = fmt.encode_meta({"h": b"v"})
    with shared.lock:
        shared.append(b"k", b"plain", 1)
        shared.append(b"k", b"with", 2, meta)
        shared.append(b"k", b"plain again", 3)
        size = shared.buffers[b"k"].size
        shared.append_run(b"v1", [b"a", b"b"], [9, 18], 0, 4)
    batches = _sealed(shared)
    header = fmt.validate_batch(batches[0])
    assert header.version == 2 and size == header.size - fmt.HEADER_BYTES - 1
    records = list(fmt.iter_records(batches[0]))
    assert [r.headers for r in records] == [(), (("h", b"v"),), ()]
    assert fmt.validate_batch(batches[1]).version == 1


def test_send_many_with_headers_seals_a_v1_run_first_and_shares_one_meta(shared):
    meta = fmt.encode_meta({"h": b"v"})
    with shared.lock:
        shared.append_run(b"k", [b"a", b"b"], [9, 18], 0, 4)
        shared.append_run(b"k", [b"c", b"d"], [9, 18], 0, 5, meta)  # no meta in the run's ends
        shared.append_run(b"k", [b"e"], [9], 0, 6, meta)  # the same meta: the same batch
        size = shared.buffers[b"k"].size
    first, second = _sealed(shared)
    assert fmt.validate_batch(first).version == 1
    header = fmt.validate_batch(second)
    assert header.version == 2 and header.shared_meta == meta and header.count == 3
    assert size == header.size - fmt.HEADER_BYTES - 1, "the buffer counts the meta once"
    assert [r.header("h") for r in fmt.iter_records(second)] == [b"v", b"v", b"v"]


def test_a_shared_meta_buffer_is_sealed_before_another_meta_joins_it(shared):
    """Sized with its meta once, a buffer would outgrow its size if it turned per-record: a
    message with another meta (or none) starts a batch of its own."""
    meta, other = fmt.encode_meta({"h": b"v"}), fmt.encode_meta({"h": b"w"})
    with shared.lock:
        shared.append_run(b"k", [b"a", b"b"], [9, 18], 0, 4, meta)
        shared.append(b"k", b"c", 5, meta)  # the same meta: joins
        shared.append(b"k", b"d", 6, other)
        shared.append_run(b"k", [b"e"], [9], 0, 7, meta)  # a run into a per-record buffer
        shared.append(b"k", b"f", 8)
    batches = _sealed(shared)
    headers = [fmt.validate_batch(batch) for batch in batches]
    assert [h.count for h in headers] == [3, 1, 1, 1]
    assert [h.shared_meta for h in headers] == [meta, b"", b"", b""]
    assert [h.version for h in headers] == [2, 2, 2, 1]
    read = [[r.header("h") for r in fmt.iter_records(b)] for b in batches]
    assert read == [[b"v", b"v", b"v"], [b"w"], [b"v"], [None]]
