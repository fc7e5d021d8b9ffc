"""Benchmark of the analytics job's parsing: writes >= 1 GiB of log segments to a temporary
directory (deleted afterwards), then measures

1. the scanner alone in this process (one core): records parsed per second;
2. the whole Spark job through spark-submit on local[2]: wall time, and records per second per core.

    .venv/bin/python benchmarks/analytics_parse.py [--gib 1.0] [--payload 100] [--batch 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from roq.analytics import scan, submit
from roq.log import format as fmt

EXCHANGES = 4
SEGMENT_BYTES = 128 << 20
MINUTE = 60_000_000


def templates(payload: int, batch: int) -> list[bytes]:
    """Distinct batches (4 producers × 120 timestamps over 4 minutes); the offset is stamped later
    (outside the CRC), so one template is reused at many positions."""
    out = []
    t0 = 1_700_000_040_000_000
    for p in range(4):
        pid = uuid.uuid5(uuid.NAMESPACE_DNS, f"bench-{p}").bytes
        for k in range(120):
            ts = t0 + k * 2_000_000
            body = [bytes([k % 256]) * payload] * batch
            stamps = [ts + i for i in range(batch)]
            out.append(fmt.encode_batch(pid, k * batch, b"bench", body, stamps))
    return out


def write_log(root: Path, total_bytes: int, payload: int, batch: int) -> tuple[int, int]:
    """Segments under root/bench/x<i>/; returns (bytes, records) written."""
    batches = templates(payload, batch)
    written = records = 0
    per_exchange = total_bytes // EXCHANGES
    for x in range(EXCHANGES):
        directory = root / "bench" / f"x{x}"
        directory.mkdir(parents=True)
        base = size = n = 0
        out = open(directory / f"{base:020d}.log", "wb")  # noqa: SIM115  (rolled below)
        while base + size < per_exchange:
            one = bytearray(batches[n % len(batches)])
            n += 1
            if size + len(one) > SEGMENT_BYTES:
                out.close()
                base, size = base + size, 0
                out = open(directory / f"{base:020d}.log", "wb")  # noqa: SIM115
            fmt.stamp_offset(one, base + size)
            out.write(one)
            size += len(one)
            records += batch
        out.close()
        written += base + size
    return written, records


def scan_one_core(path: Path) -> tuple[int, float]:
    """Records parsed and seconds for one segment file, scanned as one range."""
    counts: dict[bytes, dict[int, scan.ProducerMinute]] = {}

    def handle(buf: bytes, i: int, header: fmt.BatchHeader) -> None:
        scan.count_records(buf, i, header, counts.setdefault(header.producer_id, {}))

    size = path.stat().st_size
    started = time.perf_counter()
    with open(path, "rb") as stream:
        result = scan.scan_range(scan.Window(stream, size), int(path.name[:20]), 0, size, handle)
    return result.records, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1, help="Spark job runs (median reported)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roq-analytics-bench-"))
    try:
        started = time.perf_counter()
        total, records = write_log(tmp / "log", int(args.gib * (1 << 30)), args.payload, args.batch)
        print(f"wrote {total / 2**20:,.0f} MiB, {records:,} records "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        first = sorted((tmp / "log/bench/x0").iterdir())[0]
        n, seconds = scan_one_core(first)
        print(f"scanner, 1 core: {n:,} records in {seconds:.2f} s = {n / seconds:,.0f} records/s, "
              f"{first.stat().st_size / seconds / 2**20:,.0f} MiB/s")  # fmt: skip
        walls = []
        for run in range(args.runs):
            out = tmp / f"out{run}"
            started = time.perf_counter()
            code = submit.run(str(tmp / "log"), str(out), "local[2]", [], "1g")
            walls.append(time.perf_counter() - started)
            assert code == 0, f"spark-submit exited with {code}"
        wall = statistics.median(walls)
        cores = 2
        print(f"spark job, local[{cores}]: wall {wall:.1f} s (runs: "
              f"{', '.join(f'{w:.1f}' for w in walls)}); {records / wall:,.0f} records/s, "
              f"{records / wall / cores:,.0f} records/s per core, "
              f"{total / wall / 2**20:,.0f} MiB/s")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"removed {tmp}", flush=True)
        os.sync()


if __name__ == "__main__":
    main()
