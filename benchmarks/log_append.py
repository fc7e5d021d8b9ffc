"""Append and read throughput of the message log (roq.log.Log) on this machine's disk.

Each append is one batch of 100 records of 100 B (≈10.9 KB), as the exchange appends them: the
batch arrives as immutable bytes (a ZeroMQ frame), is checked (bounds + CRC) and appended. Runs
each case several times in a fresh directory and prints the median.

    .venv/bin/python benchmarks/log_append.py [--runs 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from roq.log import FlushPolicy, Log, ReadStatus
from roq.log import format as fmt

RECORDS = 100
PAYLOAD = 100


def make_batches(count: int) -> list[bytes]:
    producer = os.urandom(16)
    now = time.time_ns() // 1000
    payload = os.urandom(PAYLOAD)
    return [
        fmt.encode_batch(producer, i * RECORDS, b"bench", [payload] * RECORDS, [now] * RECORDS)
        for i in range(count)
    ]


def time_appends(directory: Path, policy: FlushPolicy, batches: list[bytes]) -> float:
    with Log(directory, 64 * 1024 * 1024, policy, memory_bytes=64 * 1024 * 1024) as log:
        start = time.perf_counter()
        for data in batches:
            log.append(data)
        log.flush()
        return time.perf_counter() - start


def time_reads(directory: Path, memory: bool, max_bytes: int) -> tuple[float, int]:
    with Log(directory, 64 * 1024 * 1024, FlushPolicy("os"), memory_bytes=0) as log:
        if memory:  # refill the ring with what is on disk, as a running exchange has it
            log.memory.bytes_max = 1 << 40
            offset = 0
            while (result := log.read(offset, 1 << 20)).status is ReadStatus.BATCHES:
                for at, header in fmt.iter_batches(result.data):
                    log.memory.append(offset + at, result.data[at : at + header.size])
                offset = result.next_offset
        start = time.perf_counter()
        offset, total = 0, 0
        while (result := log.read(offset, max_bytes)).status is ReadStatus.BATCHES:
            total += len(result.data)
            offset = result.next_offset
        return time.perf_counter() - start, total


def median_of(runs: int, root: Path, case: Callable[[Path], float]) -> float:
    times = []
    for _ in range(runs):
        directory = Path(tempfile.mkdtemp(dir=root))
        try:
            times.append(case(directory))
        finally:
            shutil.rmtree(directory)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    root = Path(args.dir)
    counts = {"every-batch": 2_000, "interval": 20_000, "os": 20_000}
    batch_bytes = len(make_batches(1)[0])
    print(f"batch: {RECORDS} records x {PAYLOAD} B = {batch_bytes} B; median of {args.runs} runs")
    for kind, count in counts.items():
        batches = make_batches(count)
        policy = FlushPolicy(kind, 200)
        seconds = median_of(args.runs, root, lambda d, p=policy, b=batches: time_appends(d, p, b))
        print(
            f"append {kind:12s}: {count / seconds:10.0f} batches/s "
            f"{count * RECORDS / seconds / 1e6:6.2f} M msg/s "
            f"{count * batch_bytes / seconds / 1e6:8.1f} MB/s"
        )
    batches = make_batches(20_000)
    for memory in (False, True):
        for max_bytes in (batch_bytes, 1 << 20):

            def case(d: Path, m: bool = memory, mb: int = max_bytes) -> float:
                time_appends(d, FlushPolicy("os"), batches)
                seconds, total = time_reads(d, m, mb)
                assert total == len(batches) * batch_bytes
                return seconds

            seconds = median_of(args.runs, root, case)
            where = "memory" if memory else "disk  "
            print(
                f"read {where} max_bytes={max_bytes:8d}: "
                f"{len(batches) / seconds:10.0f} batches/s "
                f"{len(batches) * batch_bytes / seconds / 1e6:8.1f} MB/s"
            )


if __name__ == "__main__":
    main()
