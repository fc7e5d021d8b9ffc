"""Cost of each step of the exchange's and the clients' per-batch work, without sockets.

Times, per batch, what `Exchange._accept` does (check_batch: header + CRC; the bytearray copy
for the log; Log.append: pwrite + memory log; the two LoadMeter.add calls) and what the
publisher (`encode_batch`) and subscriber (`read_header`, `iter_records`) do, for a batch of
100 records and a batch of 1 record, 100 B and 1 KiB payloads. One process, one core.

    python benchmarks/hotpath_micro.py [--log-dir /tmp/roq-micro]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roq.exchange.service import LoadMeter
from roq.log import Log, LogSettings
from roq.log import format as batchfmt
from roq.log.log import FlushPolicy

REPEAT = 5


def per_call_us(fn: Callable[[], Any], number: int) -> float:
    """Best of REPEAT runs of `number` calls, in µs per call (best: least disturbed by others)."""
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number * 1e6


def one_case(count: int, payload: int, log_dir: Path) -> dict[str, Any]:
    pid = uuid.uuid4().bytes
    payloads = [b"x" * payload] * count
    stamps = [time.time_ns() // 1000 + i for i in range(count)]
    batch = batchfmt.encode_batch(pid, 0, b"test", payloads, stamps)
    view = memoryview(batch)
    header = batchfmt.check_batch(view)
    number = max(200, 200_000 // count)
    meter = LoadMeter()
    directory = Path(tempfile.mkdtemp(dir=log_dir))
    log = Log.open(directory, LogSettings(flush=FlushPolicy("os")), name="micro")
    try:
        steps = {
            "encode_batch (publisher)": per_call_us(
                lambda: batchfmt.encode_batch(pid, 0, b"test", payloads, stamps), number
            ),
            "read_header": per_call_us(lambda: batchfmt.read_header(view), number),
            "check_batch (header + CRC)": per_call_us(lambda: batchfmt.check_batch(view), number),
            "bytearray copy": per_call_us(lambda: bytearray(view), number),
            "Log.append (pwrite + memory log, flush=os)": per_call_us(
                lambda: log.append(bytearray(view), header), number
            ),
            "2 x LoadMeter.add": per_call_us(
                lambda: (meter.add(pid, count, payload), meter.add(pid, count, payload)), number
            ),
            "iter_records (subscriber, all records)": per_call_us(
                lambda: sum(1 for _ in batchfmt.iter_records(view)), number
            ),
        }
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "records_per_batch": count,
        "payload": payload,
        "batch_bytes": len(batch),
        "us_per_batch": {k: round(v, 2) for k, v in steps.items()},
        "us_per_message": {k: round(v / count, 3) for k, v in steps.items()},
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    for count in (100, 1):
        for payload in (100, 1024):
            print(json.dumps(one_case(count, payload, Path(args.log_dir))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
