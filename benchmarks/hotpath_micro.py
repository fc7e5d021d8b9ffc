"""Cost of each step of the exchange's and the clients' per-batch work, without sockets.

Times, per batch, what `Exchange._accept` does (check_batch: header + CRC; check_records: the
records fill the batch; the bytearray copy for the log; Log.append: pwrite + memory log; the two
LoadMeter.add calls) and what the publisher (`encode_batch`) and subscriber (`read_header`,
`iter_records`) do, for a batch of 100 records and a batch of 1 record, 100 B and 1 KiB
payloads, and a 64 KiB batch of 100 B records (600). `--mixed` gives the records sizes of
payload ± 20 B instead of one size (check_records then walks the record heads). `--headers N`
writes log format v2: N headers of `--header-bytes` bytes of value on every record, the same
bytes on every record, or with `--distinct` values that differ per record (same lengths: the
strided check still applies; with `--mixed` too it walks and checks each meta). One process.

    python benchmarks/hotpath_micro.py [--log-dir /tmp/roq-micro] [--mixed] [--only-checks]
        [--headers 2 [--header-bytes 32] [--distinct]]
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


def _metas(count: int, args: argparse.Namespace) -> list[bytes] | None:
    """One meta per record (log format v2), or None (v1)."""
    if not getattr(args, "headers", 0):
        return None
    if not args.distinct:
        shared = {f"h{i}": b"v" * args.header_bytes for i in range(args.headers)}
        return [batchfmt.encode_meta(shared)] * count
    return [
        batchfmt.encode_meta(
            {f"h{i}": b"%0*d" % (args.header_bytes, n) for i in range(args.headers)}
        )
        for n in range(count)
    ]


def one_case(
    count: int, payload: int, log_dir: Path, mixed: bool, only_checks: bool,
    args: argparse.Namespace | None = None,
) -> dict[str, Any]:  # fmt: skip
    pid = uuid.uuid4().bytes
    payloads = [b"x" * (payload + (i * 7 % 41 - 20 if mixed else 0)) for i in range(count)]
    stamps = [time.time_ns() // 1000 + i for i in range(count)]
    metas = _metas(count, args) if args is not None else None
    extra = () if metas is None else (metas,)  # older trees: encode_batch without metas
    batch = batchfmt.encode_batch(pid, 0, b"test", payloads, stamps, *extra)
    view = memoryview(batch)
    header = batchfmt.check_batch(view)
    number = max(200, 200_000 // count)
    meter = LoadMeter()
    directory = Path(tempfile.mkdtemp(dir=log_dir))
    log = Log.open(directory, LogSettings(flush=FlushPolicy("os")), name="micro")
    calls: dict[str, Callable[[], Any]] = {
        "encode_batch (publisher)": lambda: batchfmt.encode_batch(
            pid, 0, b"test", payloads, stamps, *extra
        ),
        "read_header": lambda: batchfmt.read_header(view),
        "check_batch (header + CRC)": lambda: batchfmt.check_batch(view),
        "bytearray copy": lambda: bytearray(view),
        "Log.append (pwrite + memory log, flush=os)": lambda: log.append(bytearray(view), header),
        "2 x LoadMeter.add": lambda: (
            meter.add(pid, count, payload),
            meter.add(pid, count, payload),
        ),
        "iter_records (subscriber, all records)": lambda: sum(
            1 for _ in batchfmt.iter_records(view)
        ),
    }
    if hasattr(batchfmt, "check_records"):  # absent before issue 16: A/B against older trees
        calls["check_records"] = lambda: batchfmt.check_records(view, header)
        calls["exchange's check (check_batch + check_records)"] = lambda: batchfmt.check_records(
            view, batchfmt.check_batch(view)
        )
    if only_checks:
        calls = {name: call for name, call in calls.items() if "head" in name or "check" in name}
    try:
        steps = {name: per_call_us(call, number) for name, call in calls.items()}
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "records_per_batch": count,
        "payload": f"{payload} ± 20" if mixed else payload,
        "batch_bytes": len(batch),
        "us_per_batch": {k: round(v, 2) for k, v in steps.items()},
        "us_per_message": {k: round(v / count, 3) for k, v in steps.items()},
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    parser.add_argument("--mixed", action="store_true", help="payload sizes of payload ± 20 B")
    parser.add_argument(
        "--only-checks", action="store_true", help="time the header and batch checks only"
    )
    parser.add_argument("--headers", type=int, default=0, help="headers per record (v2)")
    parser.add_argument("--header-bytes", type=int, default=32, help="bytes of each value")
    parser.add_argument("--distinct", action="store_true", help="values differ per record")
    parser.add_argument("--cases", default="100x100,100x1024,1x100,1x1024,600x100",
                        help="records x payload bytes, comma-separated")  # fmt: skip
    args = parser.parse_args(argv)
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    for count, payload in cases:
        case = one_case(count, payload, Path(args.log_dir), args.mixed, args.only_checks, args)
        print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
