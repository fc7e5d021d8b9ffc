"""The batch format's hot steps, compiled (roq.log._native, mypyc) against pure Python (issue 35):
encode_batch, check_records (a batch of equal records, and one whose sizes vary), iter_records,
and check_batch (header and CRC, the same code both ways) for batches of 600 x 100 B and
64 x 1 KiB (a publisher's usual batches at linger 2 ms), and of one record. Sides interleaved,
round by round; µs per batch, the median and the least of the rounds.

    python benchmarks/native_micro.py --rounds 9 [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from roq.log import format as fmt

PRODUCER = b"p" * 16
KEY = b"bench"
TS = 1_700_000_000_000_000


def timed(step: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        step()
    return (time.perf_counter() - start) / repeat * 1e6


def steps(size: int, count: int) -> dict[str, Callable[[], object]]:
    payloads = [os.urandom(size) for _ in range(count)]
    varied = [os.urandom(size + index % 7) for index in range(count)]
    stamps = [TS + index for index in range(count)]
    batch = fmt.encode_batch(PRODUCER, 1, KEY, payloads, stamps)
    uneven = fmt.encode_batch(PRODUCER, 1, KEY, varied, stamps)
    header, uneven_header = fmt.read_header(batch), fmt.read_header(uneven)
    return {
        "encode_batch": lambda: fmt.encode_batch(PRODUCER, 1, KEY, payloads, stamps),
        "check_records": lambda: fmt.check_records(batch, header),
        "check_records_varied": lambda: fmt.check_records(uneven, uneven_header),
        "iter_records": lambda: list(fmt.iter_records(batch)),
        "check_batch": lambda: fmt.check_batch(batch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    native = fmt._native
    if native is None:
        raise SystemExit("roq.log._native is not compiled: run packaging/build_native.py first")
    rows = []
    for size, count in ((100, 600), (1024, 64), (100, 1)):
        plan = steps(size, count)
        repeat = max(20, 20_000 // count)
        times: dict[tuple[str, str], list[float]] = {}
        for turn in range(args.rounds):
            sides = [("compiled", native), ("pure", None)]
            for side, module in sides if turn % 2 else sides[::-1]:
                fmt._native = module
                for name, step in plan.items():
                    times.setdefault((name, side), []).append(timed(step, repeat))
        fmt._native = native
        for name in plan:
            pure, compiled = times[(name, "pure")], times[(name, "compiled")]
            row = {"size": size, "count": count, "step": name,
                   "pure_median_us": statistics.median(pure), "pure_min_us": min(pure),
                   "compiled_median_us": statistics.median(compiled),
                   "compiled_min_us": min(compiled),
                   "load1": os.getloadavg()[0]}  # fmt: skip
            rows.append(row)
            print(f"{count:>4} x {size:>5} B  {name:<22} pure {row['pure_median_us']:8.1f} µs"
                  f"  compiled {row['compiled_median_us']:8.1f} µs"
                  f"  ({row['pure_median_us'] / row['compiled_median_us']:.2f}x)")  # fmt: skip
    if args.out:
        with args.out.open("a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
