"""The message log on real files: offsets are byte positions, segments roll, reads are whole
batches, the memory log mirrors the disk, retention evicts whole segments, flush policies."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from logutil import batch, seqs, torn

from roq import config, limits
from roq.errors import CorruptRecord, InvalidOffset, LogUnavailable
from roq.log import (
    FlushPolicy,
    Log,
    LogSettings,
    MemoryLog,
    ReadStatus,
    Retention,
    janitor,
    log_directory,
    parse_segment_name,
    segment_name,
)
from roq.log import format as fmt
from roq.testing.cluster import wait_for

OS = FlushPolicy("os")


def fill(log: Log, count: int, records: int = 3, start_seq: int = 0) -> list[int]:
    return [log.append(batch(start_seq + i * records, records)) for i in range(count)]


def read_all(log: Log, offset: int, max_bytes: int = 4096) -> bytes:
    parts = []
    for _ in range(100_000):
        result = log.read(offset, max_bytes)
        if result.status is not ReadStatus.BATCHES:
            break
        parts.append(result.data)
        offset = result.next_offset
    return b"".join(parts)


def test_segment_names_are_the_zero_padded_base_offset():
    assert segment_name(4096) == "00000000000000004096.log"
    assert parse_segment_name("00000000000000004096.log") == 4096
    assert parse_segment_name("4096.log") is None
    assert parse_segment_name("00000000000000004096.idx") is None
    assert parse_segment_name("²" * 20 + ".log") is None  # a digit to isdigit(), not to int()


def test_offsets_are_byte_positions_and_reads_round_trip_across_rolls(tmp_path):
    with Log(tmp_path, max_file_size=1000, flush_policy=OS) as log:
        offsets = fill(log, 40)
        sizes = [len(batch(0))] * 40
        assert offsets == [sum(sizes[:i]) for i in range(40)]
        assert log.end_offset == sum(sizes)
        segments = log.segments
        assert len(segments) > 5
        for segment in segments:
            assert segment.path.name == segment_name(segment.base)
            assert segment.size <= 1000
            assert segment.path.stat().st_size == segment.size
        assert seqs(read_all(log, 0)) == list(range(120))
        # A read may start at any batch and spans segment boundaries.
        assert seqs(log.read(offsets[7], 10**6).data) == list(range(21, 120))
        first = log.read(offsets[3], 1).data
        assert fmt.check_batch(first).base_offset == offsets[3] and len(first) == sizes[3]


def test_stamped_offsets_match_positions_and_bytearrays_are_stamped_in_place(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        fill(log, 2)
        buf = bytearray(batch(6))
        offset = log.append(buf)
        assert fmt.check_batch(buf).base_offset == offset
        assert log.read(offset, 10**6).data == bytes(buf)


def test_reopen_continues_where_the_log_ended(tmp_path):
    with Log(tmp_path, max_file_size=700, flush_policy=OS) as log:
        fill(log, 10)
        end = log.end_offset
    with Log(tmp_path, max_file_size=700, flush_policy=OS) as log:
        assert log.end_offset == end and log.recovered_bytes_dropped == 0
        assert log.append(batch(30)) == end
        assert seqs(read_all(log, 0)) == list(range(33))


def test_corrupt_input_is_refused_and_nothing_is_written(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        good = bytearray(batch(0))
        good[-1] ^= 0xFF
        with pytest.raises(CorruptRecord):
            log.append(good)
        with pytest.raises(CorruptRecord):
            log.append(b"\x00" * 100)
        assert log.end_offset == 0
        assert log.segments[0].path.stat().st_size == 0


def test_a_batch_with_torn_records_is_refused_and_nothing_is_written(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        with pytest.raises(CorruptRecord, match="record 1 of batch"):
            log.append(torn(batch(0)))
        assert log.end_offset == 0 and log.segments[0].path.stat().st_size == 0


def test_offsets_beyond_any_log_are_refused_on_restart_and_on_open(tmp_path):
    with Log(tmp_path / "a", flush_policy=OS) as log:
        with pytest.raises(InvalidOffset, match="cannot restart at"):
            log.restart_at(2**63 + 5)
        log.restart_at(limits.log_offset_max - 1)  # the largest plausible start
    beyond = tmp_path / "b"
    beyond.mkdir()
    (beyond / segment_name(2**63 + 5)).touch()
    with pytest.raises(CorruptRecord, match="lies beyond any log"):
        Log(beyond, flush_policy=OS)


def test_a_batch_damaged_on_disk_ends_a_read_and_readers_can_skip_it(tmp_path):
    with Log(tmp_path, flush_policy=OS, memory_bytes=0) as log:
        offsets = fill(log, 5)
        path = log.segments[0].path
        data = bytearray(path.read_bytes())
        for damaged in (1, 2, 4):  # the last payload byte of each: their CRCs fail
            data[offsets[damaged] + len(batch(0)) - 1] ^= 0xFF
        path.write_bytes(data)
        first = log.read(0, 10**6)
        assert first.next_offset == offsets[1] and seqs(first.data) == [0, 1, 2]
        with pytest.raises(CorruptRecord, match="CRC mismatch"):
            log.read(offsets[1], 10**6)
        assert log.next_sound_batch(offsets[1]) == offsets[3]  # past batches 1 and 2
        assert seqs(log.read(offsets[3], 10**6).data) == [9, 10, 11]  # ends before batch 4
        assert log.next_sound_batch(offsets[4]) == log.end_offset  # nothing sound follows
        assert log.next_sound_batch(offsets[1]) == offsets[3]  # asked again: the same


def test_read_answers_no_message_yet_evicted_and_invalid(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        empty = log.read(0, 100)
        assert empty.status is ReadStatus.NO_MESSAGE_YET and empty.next_offset == 0
        offsets = fill(log, 3)
        tail = log.read(log.end_offset, 100)
        assert tail.status is ReadStatus.NO_MESSAGE_YET and tail.data == b""
        with pytest.raises(InvalidOffset, match="past the end"):
            log.read(log.end_offset + 1, 100)
        with pytest.raises(InvalidOffset, match="not the start of a batch"):
            Log.read(log, offsets[1] + 3, 100)


def test_invalid_offset_inside_a_batch_is_refused_on_disk_too(tmp_path):
    with Log(tmp_path, flush_policy=OS, memory_bytes=0) as log:
        offsets = fill(log, 3)
        for bad in (1, offsets[1] - 1, offsets[1] + 4, offsets[2] + 16):
            with pytest.raises(InvalidOffset):
                log.read(bad, 1000)


def test_retention_by_bytes_deletes_whole_closed_segments(tmp_path):
    size = len(batch(0))
    retention = Retention(bytes=5 * size)
    with Log(
        tmp_path, max_file_size=2 * size, flush_policy=OS, retention=retention, memory_bytes=10**6
    ) as log:
        offsets = fill(log, 20)
        assert log.memory.start_offset == log.start_offset  # the ring forgot evicted batches
        assert log.end_offset - log.start_offset >= 5 * size
        assert log.end_offset - log.start_offset < 5 * size + 2 * (2 * size)
        assert log.start_offset > 0
        assert log.read(0, 100).status is ReadStatus.EVICTED
        evicted = log.read(offsets[1], 100)
        assert evicted.status is ReadStatus.EVICTED and evicted.next_offset == log.start_offset
        assert log.read(log.end_offset, 100).status is ReadStatus.NO_MESSAGE_YET
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names[0] == segment_name(log.start_offset)
        kept = seqs(read_all(log, log.start_offset))
        assert kept == list(range(kept[0], 60))


def test_retain_from_deletes_the_whole_segments_its_readers_no_longer_need(tmp_path):
    """An HTTP gateway's floor (Log.retain_from): every closed segment that ends at or before
    it goes, the one holding it stays, and it only grows (a lower floor later deletes nothing
    more and keeps nothing back); later rolls apply it too, with no other retention set."""
    size = len(batch(0))
    with Log(tmp_path, max_file_size=2 * size, flush_policy=OS) as log:
        offsets = fill(log, 20)  # 2 batches per segment
        assert log.retain_from(offsets[5]) == 2  # segments [0, 1] and [2, 3]; 5 is in [4, 5]
        assert log.start_offset == offsets[4]
        assert log.read(offsets[4], 100).status is ReadStatus.BATCHES
        assert log.retain_from(offsets[1]) == 0 and log.start_offset == offsets[4]
        assert seqs(read_all(log, log.start_offset)) == list(range(12, 60))
        floor = log.end_offset
        log.retain_from(floor + 10**6)  # past the end: held at the end
        assert log.consumed_before == floor
        fill(log, 4, start_seq=60)  # the rolls apply the floor: everything before it goes
        assert log.start_offset == floor
        assert seqs(read_all(log, log.start_offset)) == list(range(60, 72))


def test_retention_by_record_count_keeps_at_least_n_records(tmp_path):
    size = len(batch(0))
    retention = Retention(records=10)
    with Log(tmp_path, max_file_size=2 * size, flush_policy=OS, retention=retention) as log:
        fill(log, 20)  # 60 records, 2 batches (6 records) per segment
        kept = seqs(read_all(log, log.start_offset))
        assert 10 <= len(kept) < 10 + 6 + 3
        assert kept == list(range(60 - len(kept), 60))


def test_retention_by_age_uses_the_newest_batch_timestamp(tmp_path):
    size = len(batch(0))
    now_us = time.time_ns() // 1000
    with Log(
        tmp_path, max_file_size=2 * size, flush_policy=OS, retention=Retention(ms=60_000)
    ) as log:
        offsets = [log.append(batch(i * 3, ts_us=now_us - 7_200_000_000)) for i in range(6)]
        offsets += [log.append(batch(i * 3, ts_us=now_us)) for i in range(6, 9)]
        # Rolling into the fifth segment dropped the three segments written two hours ago.
        assert log.start_offset == offsets[6]
        assert log.read(offsets[5], 100).status is ReadStatus.EVICTED
        assert seqs(read_all(log, log.start_offset)) == list(range(18, 27))
        assert log.enforce_retention(now_us=now_us) == 0
        assert log.enforce_retention(now_us=now_us + 61_000_000) == 1
        assert log.start_offset == offsets[8]


def test_retention_counts_survive_a_reopen(tmp_path):
    size = len(batch(0))
    with Log(tmp_path, max_file_size=2 * size, flush_policy=OS) as log:
        fill(log, 20)
    with Log(
        tmp_path, max_file_size=2 * size, flush_policy=OS, retention=Retention(records=10)
    ) as log:
        assert log.enforce_retention() > 0
        assert len(seqs(read_all(log, log.start_offset))) >= 10


def test_roll_starts_a_segment_unless_the_active_one_is_empty(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        assert log.roll() == 0 and len(log.segments) == 1  # an empty segment is kept
        offsets = fill(log, 2)
        assert log.roll() == log.end_offset and len(log.segments) == 2
        assert log.roll() == log.end_offset and len(log.segments) == 2
        offsets += fill(log, 1, start_seq=6)
        assert log.segments[-1].base == offsets[2]
        assert seqs(read_all(log, 0)) == list(range(9))


def test_drop_before_deletes_closed_segments_ending_there_after_syncing_the_rest(tmp_path):
    size = len(batch(0))
    with Log(tmp_path, max_file_size=2 * size, flush_policy=OS) as log:
        offsets = fill(log, 7)  # segments of two batches, the active one holds the seventh
        with pytest.raises(InvalidOffset):
            log.drop_before(log.end_offset + 1)
        assert log.drop_before(offsets[1]) == 0  # inside the first segment: nothing ends there
        assert log.drop_before(offsets[3]) == 1 and log.start_offset == offsets[2]
        assert log.read(offsets[1], 100).status is ReadStatus.EVICTED
        assert log.durable_offset == log.end_offset  # made durable before anything went
        assert log.drop_before(log.end_offset) == 2  # the active segment stays
        assert log.start_offset == offsets[6] and len(log.segments) == 1
        assert seqs(read_all(log, log.start_offset)) == [18, 19, 20]
    with Log(tmp_path, max_file_size=2 * size, flush_policy=OS) as log:
        assert log.start_offset == offsets[6] and not log.gaps


def test_memory_log_is_bounded_and_serves_the_tail_identically_to_disk(tmp_path):
    size = len(batch(0))
    with Log(tmp_path / "m", max_file_size=3 * size, flush_policy=OS, memory_bytes=4 * size) as mem:
        offsets = fill(mem, 12)
        assert mem.memory.bytes <= 4 * size and len(mem.memory) == 4
        assert mem.memory.start_offset == offsets[-4]
        with Log(tmp_path / "m2", max_file_size=3 * size, flush_policy=OS) as disk:
            fill(disk, 12)
            for offset in offsets:
                for max_bytes in (1, size, 2 * size + 1, 10 * size):
                    from_mem = mem.read(offset, max_bytes)
                    from_disk = disk.read(offset, max_bytes)
                    assert from_mem.data == from_disk.data
                    assert from_mem.next_offset == from_disk.next_offset
                    assert not from_disk.from_memory
                    assert from_mem.from_memory == (offset >= offsets[-4])


def test_memory_ring_evicts_oldest_and_skips_oversized_batches():
    ring = MemoryLog(100)
    ring.append(0, b"a" * 40)
    ring.append(40, b"b" * 40)
    ring.append(80, b"c" * 40)
    assert len(ring) == 2 and ring.bytes == 80 and ring.start_offset == 40
    assert ring.read(0, 100) is None and ring.read(41, 100) is None
    assert ring.read(40, 1) == b"b" * 40
    assert ring.read(40, 80) == b"b" * 40 + b"c" * 40
    ring.append(120, b"d" * 101)
    assert len(ring) == 0 and ring.read(120, 1000) is None
    for i in range(1000):  # compaction keeps lookups right
        ring.append(221 + 10 * i, bytes([i % 256]) * 10)
    assert len(ring) == 10 and ring.read(221 + 10 * 995, 10) == bytes([995 % 256]) * 10


class StepClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_flush_policies_move_the_durable_offset(tmp_path):
    with Log(tmp_path / "a", flush_policy=FlushPolicy("every-batch")) as log:
        fill(log, 3)
        assert log.durable_offset == log.end_offset
    clock = StepClock()
    with Log(tmp_path / "b", flush_policy=FlushPolicy("interval", 50), clock=clock) as log:
        fill(log, 3)
        assert log.durable_offset == 0
        clock.now += 0.02
        log.tick()
        assert log.durable_offset == 0
        clock.now += 0.04
        log.tick()
        assert log.durable_offset == log.end_offset
        clock.now += 0.06
        log.append(batch(9))  # the interval had passed: the append itself flushes
        assert log.durable_offset == log.end_offset
    with Log(tmp_path / "c", flush_policy=OS) as log:
        fill(log, 3)
        log.tick()
        assert log.durable_offset == 0
        log.flush()
        assert log.durable_offset == log.end_offset


def _tick_until_durable(log: Log, clock: StepClock, bound_s: float = 5.0) -> None:
    def durable() -> bool:
        if log.durable_offset == log.end_offset:
            return True
        clock.now += 0.001
        log.tick()
        return False

    wait_for(durable, bound_s, "the background sync to complete", interval_s=0.001)


def test_background_flush_moves_the_durable_offset_off_the_owner_thread(tmp_path):
    clock = StepClock()
    policy = FlushPolicy("interval", 50)
    with Log(tmp_path / "a", flush_policy=policy, clock=clock, background_flush=True) as log:
        fill(log, 3)
        clock.now += 0.06
        assert log.maybe_flush(), "the interval passed: a sync is asked for"
        assert log.durable_offset == 0, "the owner does not wait for the sync"
        _tick_until_durable(log, clock)
        end = log.end_offset
        fill(log, 2)  # past the sync asked for: not durable until the next one
        assert log.durable_offset == end
        clock.now += 0.06
        _tick_until_durable(log, clock)
    with Log(tmp_path / "a", flush_policy=OS) as reopened:
        assert reopened.end_offset == log.end_offset  # close() synced the rest and stopped


def test_a_background_sync_asked_before_a_truncation_does_not_count(tmp_path):
    clock = StepClock()
    policy = FlushPolicy("interval", 50)
    with Log(tmp_path / "a", flush_policy=policy, clock=clock, background_flush=True) as log:
        offsets = fill(log, 4)
        clock.now += 0.06
        assert log.maybe_flush()
        log.truncate_to(offsets[2])
        flusher = log._flusher
        wait_for(lambda: flusher is None or flusher.idle(), 5, "the sync asked for", 0.001)
        log.tick()
        assert log.durable_offset <= offsets[2], (
            "a stale sync must not move the offset past the cut"
        )


def test_flush_policy_parsing():
    assert FlushPolicy.parse("interval:25") == FlushPolicy("interval", 25)
    assert FlushPolicy.parse("every-batch") == FlushPolicy("every-batch", 200)
    with pytest.raises(config.ConfigError):
        FlushPolicy.parse("sometimes")
    with pytest.raises(config.ConfigError):
        FlushPolicy.parse("os:5")


def test_settings_from_hcm_properties(tmp_path):
    path = tmp_path / "HCM.properties"
    path.write_text(
        "maxFileSize=8192\nlog.flush=every-batch\nlog.retention.records=77\nlog.memory.bytes=0\n"
    )
    settings = config.log_settings(config.load_hcm(path))
    assert settings == LogSettings(8192, FlushPolicy("every-batch"), Retention(records=77), 0)
    with pytest.raises(config.ConfigError, match=r"log\.flush"):
        config.load_hcm(None, {"log.flush": "never"})
    assert log_directory("/d", "q1", "x2") == Path("/d/q1/x2")


def test_unwritable_directory_raises_log_unavailable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LogUnavailable, match="cannot use directory") as caught:
        Log(blocker / "q1" / "x1")
    assert caught.value.exit_code == 73


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_disk_full_raises_log_unavailable_and_writes_nothing(tmp_path):
    # The active segment is a link to /dev/full: every write to it fails with ENOSPC.
    os.symlink("/dev/full", tmp_path / segment_name(0))
    with Log(tmp_path, flush_policy=OS, memory_bytes=10**6) as log:
        for _ in range(2):
            with pytest.raises(LogUnavailable, match="No space left") as caught:
                log.append(batch(0))
            assert caught.value.exit_code == 73
            assert log.end_offset == 0
            assert log.read(0, 100).status is ReadStatus.NO_MESSAGE_YET


def test_the_worked_example_in_the_format_doc_is_what_the_code_writes():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "log-format.md").read_text()
    block = doc.split("### Worked example", 1)[1].split("```", 2)[1]
    shown = bytes.fromhex("".join(line[6:] for line in block.strip().splitlines()))
    made = bytearray(
        fmt.encode_batch(
            bytes(range(16)),
            7,
            b"k",
            [b"hi", b"yo!"],
            [1_700_000_000_000_000, 1_700_000_000_000_250],
        )
    )
    fmt.stamp_offset(made, 4096)
    assert shown == bytes(made)
    assert [r.payload for r in fmt.iter_records(shown)] == [b"hi", b"yo!"]


def test_truncate_to_cuts_back_across_segments_and_appends_continue(tmp_path):
    with Log(tmp_path, max_file_size=3 * 145, flush_policy=OS, memory_bytes=10**6) as log:
        offsets = fill(log, 10)
        assert len(batch(0)) == 145
        log.truncate_to(offsets[4])
        assert log.end_offset == offsets[4] and len(log.segments) == 2
        assert sorted(p.name for p in tmp_path.iterdir())[-1] == segment_name(offsets[3])
        assert log.read(offsets[4], 10).status is ReadStatus.NO_MESSAGE_YET
        assert log.append(batch(12), expect_offset=offsets[4]) == offsets[4]
        assert seqs(read_all(log, 0)) == list(range(15))
        with pytest.raises(InvalidOffset, match="log ends at"):
            log.append(batch(15), expect_offset=offsets[4])
        with pytest.raises(InvalidOffset):
            log.truncate_to(offsets[2] + 1)
        log.truncate_to(offsets[3])  # a segment's base: it stays, empty, as the active one
        assert log.end_offset == offsets[3] and log.segments[-1].size == 0
    with Log(tmp_path, flush_policy=OS) as log:
        assert log.end_offset == offsets[3] and log.recovered_bytes_dropped == 0


def test_a_frame_with_bytes_after_its_batch_is_refused(tmp_path):
    with Log(tmp_path, flush_policy=OS) as log:
        with pytest.raises(CorruptRecord, match="bytes given for one batch"):
            log.append(batch(0) + b"junk")
        assert log.end_offset == 0


def test_background_retention_renames_at_once_and_the_janitor_deletes(tmp_path):
    """With `background_delete` (the exchange's logs), retention takes a segment out of the log
    at once (renamed `.deleted`) and the janitor thread unlinks it: an unlink can block for
    40 ms on a discard-mounted disk (janitor.py)."""
    size = len(batch(0))
    retention = Retention(bytes=5 * size)
    shared = janitor.shared()
    before = shared.deleted
    with Log(tmp_path, 2 * size, OS, retention, background_delete=True) as log:
        fill(log, 20)
        assert log.start_offset > 0 and log.read(0, 100).status is ReadStatus.EVICTED
        wait_for(shared.idle, 10, "the janitor's deletions", interval_s=0.01)
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names[0] == segment_name(log.start_offset), "a retired segment was left behind"
        assert not [n for n in names if n.endswith(janitor.DELETED_SUFFIX)]
        assert shared.deleted > before, "the janitor, not the appending thread, unlinked them"
        assert seqs(read_all(log, log.start_offset))[-1] == 59


def test_a_segment_retired_before_a_crash_is_removed_on_open(tmp_path):
    with Log(tmp_path, 2 * len(batch(0)), OS) as log:
        fill(log, 6)
        end = log.end_offset
    head = tmp_path / segment_name(0)
    head.rename(head.with_name(head.name + janitor.DELETED_SUFFIX))
    with Log(tmp_path, 2 * len(batch(0)), OS) as log:
        assert log.start_offset > 0 and log.end_offset == end
        assert not list(tmp_path.glob("*" + janitor.DELETED_SUFFIX))


def test_the_janitor_deletes_inline_when_too_many_files_wait(tmp_path):
    idle = janitor.Janitor()  # not started: nothing is taken off its queue
    files = [tmp_path / f"f{i}" for i in range(janitor.PENDING_MAX + 1)]
    for file in files:
        file.write_bytes(b"x")
        idle.discard(file)
    assert all(file.exists() for file in files[:-1]), "queued, waiting for the thread"
    assert not files[-1].exists(), "past the bound the caller deletes it itself"


def test_room_for_writes_a_scratch_file_and_leaves_nothing(tmp_path):
    """How an exchange that refused appends learns that the disk takes them again."""
    with Log(tmp_path, max_file_size=1000, flush_policy=OS) as log:
        fill(log, 2)
        before = sorted(p.name for p in tmp_path.iterdir())
        assert log.room_for(3 * 65536 + 7) == ""
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        (tmp_path / f"room-probe{janitor.DELETED_SUFFIX}").write_bytes(b"left by a crash")
    with Log(tmp_path, max_file_size=1000, flush_policy=OS) as log:
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # removed at the open
    assert "closed" in log.room_for(1)
