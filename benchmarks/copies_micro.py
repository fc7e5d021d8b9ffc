"""The per-batch steps issue 35 changed, without sockets, A (another tree's `log/format.py`, e.g.
main's) against B (this tree's), interleaved A, B, B, A, ... over --rounds, each the best of 5
`timeit` repeats, µs per batch:

- `encode_batch` (the publisher's seal), A's against B's;
- the exchange's receive-to-stamped step: both copy the received message out of ZeroMQ (bytes)
  and check it (`check_batch`, `check_records`); A copies it again into a bytearray to stamp
  (which its forward then hands to pyzmq's gc thread, not measured here: copy_paths.py), B into
  a new ZeroMQ message (`transport.writable_copy`), forwarded by reference;
- the check of a received message read through a memoryview (a zero-copy receive) against the
  same over bytes (`check_memoryview`, `check_bytes`).

    python benchmarks/copies_micro.py --a /work/wt-main --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import timeit
from pathlib import Path
from types import ModuleType

import zmq

from roq.log import format as fmt_b
from roq.transport import writable_copy


def load_format(tree: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("format_a", tree / "appliance/roq/log/format.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["format_a"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def cases() -> list[tuple[str, int, int]]:
    return [("600 x 100 B", 600, 100), ("64 x 1 KiB", 64, 1024), ("1 x 100 B", 1, 100)]


def best_us(step: object, number: int) -> float:
    return min(timeit.repeat(step, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


def measure(fmt_a: ModuleType, count: int, size: int) -> dict[str, float]:
    pid, payloads, stamps = os.urandom(16), [b"x" * size] * count, list(range(count))
    wire = bytes(fmt_b.encode_batch(pid, 0, b"k", payloads, stamps))
    received = zmq.Frame(wire)  # what a zero-copy receive hands over

    def exchange_a() -> None:
        data = bytes(memoryview(received))  # the copying receive
        header = fmt_a.check_batch(memoryview(data), 0)
        fmt_a.check_records(memoryview(data), header)
        stamped = bytearray(data)
        fmt_a.stamp_offset(stamped, 4096)

    def exchange_b() -> None:
        data = bytes(memoryview(received))
        header = fmt_b.check_batch(memoryview(data), 0)
        fmt_b.check_records(memoryview(data), header)
        stamped = writable_copy(memoryview(data))
        fmt_b.stamp_offset(memoryview(stamped), 4096)

    def check_memoryview() -> None:
        view = memoryview(received)
        fmt_b.check_records(view, fmt_b.check_batch(view, 0))

    def check_bytes() -> None:
        fmt_b.check_records(memoryview(wire), fmt_b.check_batch(memoryview(wire), 0))

    number = max(20, 20_000 // count)
    return {
        "encode_a": best_us(lambda: fmt_a.encode_batch(pid, 0, b"k", payloads, stamps), number),
        "encode_b": best_us(lambda: fmt_b.encode_batch(pid, 0, b"k", payloads, stamps), number),
        "exchange_a": best_us(exchange_a, number),
        "exchange_b": best_us(exchange_b, number),
        "check_memoryview": best_us(check_memoryview, number),
        "check_bytes": best_us(check_bytes, number),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True, help="tree A (its log/format.py)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    fmt_a = load_format(args.a)
    for name, count, size in cases():
        runs = [measure(fmt_a, count, size) for _ in range(args.rounds)]
        line: dict[str, object] = {"case": name, "load1": round(os.getloadavg()[0], 1)}
        for step in ("encode", "exchange"):
            a = [r[f"{step}_a"] for r in runs]
            b = [r[f"{step}_b"] for r in runs]
            line[f"{step}_a_us"] = round(statistics.median(a), 2)
            line[f"{step}_b_us"] = round(statistics.median(b), 2)
            line[f"{step}_b/a"] = round(
                statistics.median(y / x for x, y in zip(a, b, strict=False)), 3
            )
        for step in ("check_memoryview", "check_bytes"):
            line[f"{step}_us"] = round(statistics.median(r[step] for r in runs), 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
