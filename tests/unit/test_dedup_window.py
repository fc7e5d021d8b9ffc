"""The de-duplication window of message ids (log/dedup.py) and reading a batch's ids
(log/format.py `message_ids`): bounds, expiry by time, eviction past the bound."""

from __future__ import annotations

import pytest

from roq.log import format as batchfmt
from roq.log.dedup import IdWindow


def ident(n: int) -> bytes:
    return n.to_bytes(16, "big")


def test_an_id_is_a_duplicate_within_the_window_and_new_after_it():
    window = IdWindow(window_ms=2_000, bucket_ms=100)
    assert window.add(ident(1), now_ms=10_000)
    assert not window.add(ident(1), now_ms=11_000)  # within: a duplicate
    assert window.seen(ident(1), now_ms=11_999)
    # its first time stays its time: the duplicate at 11,000 did not refresh it
    assert not window.seen(ident(1), now_ms=12_100 + 100)
    assert window.add(ident(1), now_ms=12_300)  # outside: new again
    assert len(window) == 1


def test_expiry_goes_a_whole_bucket_at_a_time_and_forgets_the_set_too():
    window = IdWindow(window_ms=1_000, bucket_ms=100)
    for n in range(50):
        window.add(ident(n), now_ms=5_000 + n * 10)  # five buckets of 10 ids
    window.expire(6_100)  # the first bucket [5000, 5100) is wholly older than 1 s
    assert len(window) == 40
    assert not window.seen(ident(0), 6_100) and window.seen(ident(10), 6_100)
    window.expire(10_000)
    assert len(window) == 0 and window.forgotten_early == 0


def test_past_its_bound_the_oldest_ids_are_forgotten_early_and_counted():
    window = IdWindow(window_ms=60_000, ids_max=100, bucket_ms=1_000)
    for n in range(100):
        window.add(ident(n), now_ms=1_000 + n)  # bucket 1000
    for n in range(100, 150):
        window.add(ident(n), now_ms=2_000 + n)  # bucket 2000: the first one pushes out 1000
    assert len(window) <= 100
    assert window.forgotten_early == 100
    assert not window.seen(ident(5), 3_000)  # forgotten: a duplicate of it would pass as new
    assert all(window.seen(ident(n), 3_000) for n in range(100, 150))


def test_a_burst_larger_than_the_bound_in_one_bucket_keeps_its_latest_ids():
    window = IdWindow(window_ms=60_000, ids_max=1_000, bucket_ms=1_000)
    for n in range(10_000):
        window.add(ident(n), now_ms=1_000)
    assert len(window) <= 1_000
    assert window.forgotten_early == 10_000 - len(window)
    assert window.seen(ident(9_999), 1_000) and not window.seen(ident(0), 1_000)


def test_a_window_of_zero_is_off():
    window = IdWindow(window_ms=0)
    assert not window.enabled
    assert window.add(ident(1), 0) and window.add(ident(1), 0)
    assert len(window) == 0


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="window of -1 ms"):
        IdWindow(window_ms=-1)


def test_message_ids_reads_each_records_id_and_none_for_records_without():
    metas = [
        batchfmt.encode_meta(message_id=ident(7)),
        b"",
        batchfmt.encode_meta({"a": b"xyz", "bb": b""}, message_id=ident(8), expires_at_us=5),
        batchfmt.encode_meta({"c": b"1"}),
    ]
    batch = batchfmt.encode_batch(b"p" * 16, 0, b"k", [b"m0", b"m1", b"m2", b"m3"],
                                  [1, 2, 3, 4], metas)  # fmt: skip
    header = batchfmt.validate_batch(batch)
    assert batchfmt.message_ids(batch, header) == [ident(7), None, ident(8), None]
    assert batchfmt.message_ids(memoryview(batch), header) == [ident(7), None, ident(8), None]


def test_a_v1_batch_has_no_ids_and_costs_no_walk():
    batch = batchfmt.encode_batch(b"p" * 16, 0, b"k", [b"a", b"b"], [1, 2])
    assert batchfmt.message_ids(batch, batchfmt.validate_batch(batch)) == []


def test_message_ids_agrees_with_the_decoder_at_an_offset_in_a_buffer():
    metas = [batchfmt.encode_meta({"h": b"v" * n}, message_id=ident(n)) for n in range(5)]
    batch = batchfmt.encode_batch(b"q" * 16, 3, b"key", [b"x" * n for n in range(5)],
                                  list(range(5)), metas)  # fmt: skip
    buf = b"\0" * 13 + batch
    header = batchfmt.validate_batch(buf, 13)
    decoded = [record.message_id for record in batchfmt.iter_records(buf, 13)]
    assert batchfmt.message_ids(buf, header, 13) == decoded == [ident(n) for n in range(5)]


def test_a_copy_tells_its_owner_of_the_batches_it_appended(tmp_path):
    """The exchange's window learns the ids of the batches it copies (`ReplicaStore.copied`):
    told once per write that was appended, with each batch's position in the frame."""
    from roq.log import LogSettings
    from roq.replication import OK, WRITE, ReplicaStore

    told: list[list[bytes | None]] = []

    def copied(frame, checked):
        told.extend(batchfmt.message_ids(frame, header, at) for at, header in checked)

    leader = "127.0.0.1-6000-aaaaaa"
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0),
                         copied=copied)  # fmt: skip
    store.accept((leader,))
    v1 = batchfmt.encode_batch(b"p" * 16, 0, b"k", [b"a"], [1])
    v2 = batchfmt.encode_batch(b"p" * 16, 1, b"k", [b"b", b"c"], [2, 3],
                               [batchfmt.encode_meta(message_id=ident(9)), b""])  # fmt: skip
    frames = [WRITE, leader.encode(), (0).to_bytes(8, "little"), v1 + v2]
    assert store.handle(frames)[2] == OK
    assert told == [[], [ident(9), None]]
    behind = [WRITE, leader.encode(), (10**6).to_bytes(8, "little"), v2]
    assert store.handle(behind)[2] != OK and len(told) == 2  # not appended: not told
    store.close()


def test_add_all_takes_a_batch_of_ids_at_once_and_keeps_the_bound():
    window = IdWindow(window_ms=60_000, ids_max=1_000, bucket_ms=1_000)
    assert window.add_all([ident(n) for n in range(10)] * 2, 1_000) == 10  # repeats count once
    assert window.all_seen([ident(3), ident(9)], 1_500)
    assert not window.all_seen([ident(3), ident(10)], 1_500)
    assert window.add_all([ident(n) for n in range(5, 15)], 1_600) == 5
    assert window.add_all([ident(n) for n in range(100, 3_100)], 2_000) == 3_000
    assert len(window) <= 1_000 and window.forgotten_early == 3_015 - len(window)
    assert window.all_seen([ident(3_099)], 2_000)
    window.expire(200_000)
    assert len(window) == 0 and not window.all_seen([ident(3_099)], 200_000)
    assert IdWindow(window_ms=0).add_all([ident(1)], 0) == 0


def test_message_ids_of_records_alike_are_read_by_stride():
    """A send_many batch: every record has the same sizes and meta shape (the strided path)."""
    metas = [batchfmt.encode_meta({"type": b"json"}, message_id=ident(n)) for n in range(50)]
    batch = batchfmt.encode_batch(b"s" * 16, 0, b"k", [b"x" * 7] * 50, [5] * 50, metas)
    header = batchfmt.validate_batch(batch)
    decoded = [record.message_id for record in batchfmt.iter_records(batch)]
    assert batchfmt.message_ids(batch, header) == decoded == [ident(n) for n in range(50)]
    plain = [batchfmt.encode_meta({"type": b"json"})] * 3
    batch = batchfmt.encode_batch(b"s" * 16, 0, b"k", [b"x"] * 3, [5] * 3, plain)
    assert batchfmt.message_ids(batch, batchfmt.validate_batch(batch)) == [None] * 3
