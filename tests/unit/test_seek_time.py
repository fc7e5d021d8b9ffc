"""A seek by time on a real multi-segment log: the first batch at or after T, found by reading
segment heads newest first (a recent T touches the last segments only)."""

from __future__ import annotations

from pathlib import Path

from logutil import batch

from roq.exchange.logserver import LogServer
from roq.log import FlushPolicy, Log

T0 = 1_700_000_000_000_000


class CountingLog(Log):
    """A Log that counts the bytes its reads returned: how much of the log a seek touched."""

    bytes_read = 0

    def read(self, offset: int, max_bytes: int):  # type: ignore[no-untyped-def]
        result = super().read(offset, max_bytes)
        self.bytes_read += len(result.data)
        return result


def _log_of(tmp_path: Path, batches: int) -> tuple[CountingLog, list[int]]:
    log = CountingLog(tmp_path, max_file_size=1000, flush_policy=FlushPolicy("os"), memory_bytes=0)
    # batch i is stamped T0 + 1000 i (its records 1 µs apart)
    offsets = [log.append(batch(i * 3, ts_us=T0 + 1000 * i)) for i in range(batches)]
    return log, offsets


def test_a_seek_finds_the_first_batch_at_or_after_the_time(tmp_path: Path):
    log, offsets = _log_of(tmp_path, 200)
    with log:
        assert len(log.segments) > 20
        for i in (0, 1, 57, 100, 199):
            assert LogServer._seek(log, T0 + 1000 * i) == offsets[i]
            assert LogServer._seek(log, T0 + 1000 * i - 500) == offsets[i]  # between batches
        assert LogServer._seek(log, T0 - 10**9) == offsets[0]  # before everything: the start
        assert LogServer._seek(log, T0 + 10**9) == log.end_offset  # after everything: the end


def test_a_seek_for_a_recent_time_reads_only_the_newest_segments(tmp_path: Path):
    log, offsets = _log_of(tmp_path, 200)
    with log:
        log.bytes_read = 0
        assert LogServer._seek(log, T0 + 1000 * 198) == offsets[198]
        # the heads of the last segments, then the scan of the newest one that starts before T
        assert log.bytes_read <= 3 * 1000, f"{log.bytes_read} of {log.end_offset} bytes read"
