"""Recovery on open: the last segment is checked batch by batch and cut at the first bad one;
one named test per way a crash or a disk can damage the tail (style R15)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logutil import batch, seqs, torn

from roq.log import FlushPolicy, Log, ReadStatus, segment_name
from roq.log import format as fmt

OS = FlushPolicy("os")
SIZE = len(batch(0))


def write_log(directory: Path, batches: int = 5, max_file_size: int = 10**6) -> list[int]:
    with Log(directory, max_file_size=max_file_size, flush_policy=OS) as log:
        return [log.append(batch(i * 3)) for i in range(batches)]


def last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def reopen_and_check(directory: Path, good_batches: int, caplog, dropped: int) -> None:
    """The log reopens with exactly `good_batches` batches, says what it dropped, and appends."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="roq.log.log"):
        log = Log(directory, flush_policy=OS)
    with log:
        assert log.end_offset == good_batches * SIZE
        assert log.recovered_bytes_dropped == dropped
        if dropped:
            warning = caplog.records[-1].getMessage()
            assert last_segment(directory).name in warning
            assert f"offset {good_batches * SIZE}" in warning
            assert f"dropping {dropped} bytes" in warning
        assert last_segment(directory).stat().st_size == log.segments[-1].size
        offset = log.append(batch(good_batches * 3))
        assert offset == good_batches * SIZE
        data = log.read(0, 10**6).data
        assert seqs(data) == list(range(3 * good_batches + 3))
    with Log(directory, flush_policy=OS) as again:  # and the repaired log is clean
        assert again.recovered_bytes_dropped == 0
        assert again.end_offset == (good_batches + 1) * SIZE


def test_a_batch_with_torn_records_is_kept_counted_and_the_rest_recovers(tmp_path, caplog):
    """Its CRC holds, so its length is sound: cutting there would drop every later batch.
    It is kept (readers skip it) and named in a warning."""
    write_log(tmp_path)
    path = last_segment(tmp_path)
    path.write_bytes(torn(path.read_bytes(), 2 * SIZE))
    with (
        caplog.at_level(logging.WARNING, logger="roq.log.log"),
        Log(tmp_path, flush_policy=OS) as log,
    ):
        assert log.end_offset == 5 * SIZE and log.recovered_bytes_dropped == 0
        assert log.corrupt_batches == 1
        assert f"the batch at offset {2 * SIZE}" in caplog.text and "kept" in caplog.text
        data = log.read(3 * SIZE, 10**6).data
        assert seqs(data) == list(range(9, 15))


def test_clean_log_recovers_nothing(tmp_path, caplog):
    write_log(tmp_path)
    reopen_and_check(tmp_path, 5, caplog, dropped=0)


def test_torn_header(tmp_path, caplog):
    write_log(tmp_path)
    with open(last_segment(tmp_path), "ab") as file:
        file.write(batch(15)[:30])  # the crash came while the header was being written
    reopen_and_check(tmp_path, 5, caplog, dropped=30)


def test_torn_payload(tmp_path, caplog):
    write_log(tmp_path)
    with open(last_segment(tmp_path), "ab") as file:
        file.write(batch(15)[: SIZE - 7])
    reopen_and_check(tmp_path, 5, caplog, dropped=SIZE - 7)


def test_crc_mismatch(tmp_path, caplog):
    write_log(tmp_path)
    path = last_segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[3 * SIZE + 70] ^= 0x01  # one flipped bit in the fourth batch's payload
    path.write_bytes(data)
    reopen_and_check(tmp_path, 3, caplog, dropped=2 * SIZE)
    assert "CRC mismatch" in caplog.text


def test_length_past_end_of_file(tmp_path, caplog):
    write_log(tmp_path)
    path = last_segment(tmp_path)
    data = bytearray(path.read_bytes())
    fmt.LENGTH.pack_into(data, 4 * SIZE, SIZE + 1000)  # the last batch claims more than exists
    path.write_bytes(data)
    reopen_and_check(tmp_path, 4, caplog, dropped=SIZE)


def test_zeroed_tail(tmp_path, caplog):
    write_log(tmp_path)
    with open(last_segment(tmp_path), "ab") as file:
        file.write(b"\0" * 4096)  # the file grew but its blocks were never written
    reopen_and_check(tmp_path, 5, caplog, dropped=4096)
    assert "zeroed" in caplog.text


def test_stamped_offset_that_does_not_match_its_position(tmp_path, caplog):
    write_log(tmp_path)
    path = last_segment(tmp_path)
    data = bytearray(path.read_bytes())
    fmt.stamp_offset(data, 12345, at=2 * SIZE)  # outside the CRC: only the position check sees it
    path.write_bytes(data)
    reopen_and_check(tmp_path, 2, caplog, dropped=3 * SIZE)


def test_only_the_last_segment_is_repaired_and_a_missing_middle_is_reported(tmp_path, caplog):
    offsets = write_log(tmp_path, batches=8, max_file_size=2 * SIZE)
    files = sorted(tmp_path.glob("*.log"))
    assert len(files) == 4
    files[1].unlink()  # a middle segment lost
    with open(files[-1], "ab") as file:
        file.write(b"\xff" * 10)
    with caplog.at_level(logging.WARNING, logger="roq.log.log"), Log(tmp_path) as log:
        assert "missing" in caplog.text and files[0].name in caplog.text
        assert log.gaps == [(offsets[2], offsets[4])]
        assert log.recovered_bytes_dropped == 10
        assert seqs(log.read(0, 10**6).data) == list(range(6))  # a read stops at the gap
        assert seqs(log.read(offsets[4], 10**6).data) == list(range(12, 24))
        assert log.read(log.end_offset, 10).status is ReadStatus.NO_MESSAGE_YET


def test_empty_last_segment_left_by_a_crash_after_a_roll(tmp_path, caplog):
    write_log(tmp_path)
    (tmp_path / segment_name(5 * SIZE)).touch()
    reopen_and_check(tmp_path, 5, caplog, dropped=0)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8), cut=st.integers(0, 10**4))
def test_any_truncation_recovers_to_a_prefix_of_the_written_batches(tmp_path_factory, sizes, cut):
    directory = tmp_path_factory.mktemp("cut")
    written = []
    with Log(directory, flush_policy=OS) as log:
        seq = 0
        for count in sizes:
            buf = bytearray(batch(seq, records=count, size=count * 7))
            log.append(buf)
            written.append(bytes(buf))
            seq += count
    path = last_segment(directory)
    total = path.stat().st_size
    keep = cut % (total + 1)
    os.truncate(path, keep)
    with Log(directory, flush_policy=OS) as log:
        data = log.read(0, 10**6).data if log.end_offset else b""
        prefix = 0
        for size in map(len, written):
            if prefix + size > keep:
                break
            prefix += size
        assert log.end_offset == prefix
        assert data == b"".join(written)[:prefix]


WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from logutil import batch
from roq.log import FlushPolicy, Log
log = Log(sys.argv[1], max_file_size=4096, flush_policy=FlushPolicy(sys.argv[3]))
for i in range(10**6):
    offset = log.append(batch(i * 3, records=3, size=50))
    print(offset, flush=True)
"""


def test_sigkill_mid_append_loses_no_appended_batch(tmp_path):
    """A writer process is killed while appending: every batch whose append returned is there
    after recovery, in order, and the log takes appends again."""
    here = str(Path(__file__).parent)
    for policy in ("os", "every-batch"):
        directory = tmp_path / policy
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), here, policy],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        acknowledged = [int(child.stdout.readline()) for _ in range(300)]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        with Log(directory, max_file_size=4096, flush_policy=OS) as log:
            assert log.end_offset > acknowledged[-1]
            data = b"".join(
                log.read(o, 1).data for o in acknowledged
            )  # each acknowledged offset is a batch boundary holding the batch written there
            assert seqs(data) == list(range(900))
            log.append(batch(10**7))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6), where=st.integers(0, 10**4))
def test_any_flipped_byte_recovers_to_the_batches_before_it(tmp_path_factory, sizes, where):
    directory = tmp_path_factory.mktemp("flip")
    ends = []
    with Log(directory, flush_policy=OS) as log:
        for index, count in enumerate(sizes):
            log.append(batch(index * 10, records=count, size=9))
            ends.append(log.end_offset)
    path = last_segment(directory)
    data = bytearray(path.read_bytes())
    position = where % len(data)
    data[position] ^= 0x5A
    path.write_bytes(data)
    with Log(directory, flush_policy=OS) as log:
        assert log.end_offset == max([0] + [end for end in ends if end <= position])


def test_overlapping_segments_are_reported_and_the_later_file_wins(tmp_path, caplog):
    offsets = write_log(tmp_path, batches=4, max_file_size=2 * SIZE)
    first, second = sorted(tmp_path.glob("*.log"))
    (tmp_path / segment_name(offsets[1])).write_bytes(  # a stale file that overlaps `first`
        first.read_bytes()[SIZE:] + second.read_bytes()
    )
    second.unlink()
    with caplog.at_level(logging.WARNING, logger="roq.log.log"), Log(tmp_path) as log:
        assert log.gaps == [] and log.end_offset == offsets[3] + SIZE
        assert seqs(log.read(0, 10**6).data) == list(range(12))
    assert "overlap" in caplog.text
