"""The de-duplication window's memory (issue 33 item 2: "a window of 2 minutes at 500 k msg/s
measured for memory"): 2 min x 500,000 ids/s = 60,000,000 ids.

Fills `roq.log.dedup.IdWindow` (and, for comparison, the representations it was chosen among)
with --ids random 16-byte ids spread over the window's buckets, and measures the bytes the
structure holds with tracemalloc (its own allocations, not the process's RSS), the bytes per
id, and the CPU time (process time: the machine may be shared) per `add` (the fill,
untraced) and per lookup. --ids 60000000 would measure the target itself (about 5 GiB per
representation); the default measures smaller fills and extrapolates linearly: a set's table
grows by steps, so the bytes per id at one size are within about a third of those at another
(two sizes are printed to show it). Writes JSON to --out; results in docs/benchmarks.md,
"De-dup window".

    PYTHONPATH=appliance .venv/bin/python benchmarks/dedup_window.py --ids 1000000 2000000
"""

from __future__ import annotations

import argparse
import array
import bisect
import collections
import json
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from roq.log import format as batchfmt
from roq.log.dedup import IdWindow

TARGET_IDS = 120 * 500_000
RATE_PER_S = 500_000


def _window(ids: list[bytes]) -> object:
    """IdWindow as the exchange uses it, at the target's rate: a bucket per second."""
    window = IdWindow(window_ms=120_000, ids_max=len(ids) + 1)
    for n, message_id in enumerate(ids):
        window.add(message_id, now_ms=n * 1000 // RATE_PER_S)
    return window


def _bytes_set(ids: list[bytes]) -> object:
    """The alternative: the ids as bytes objects, in a set and in per-second lists."""
    seen: set[bytes] = set()
    buckets: collections.deque[list[bytes]] = collections.deque([[]])
    for n, message_id in enumerate(ids):
        if n % RATE_PER_S == 0:
            buckets.append([])
        own = bytes(bytearray(message_id))  # an object of its own, as one sliced from a batch
        seen.add(own)
        buckets[-1].append(own)
    return seen, buckets


def _dict_times(ids: list[bytes]) -> object:
    """The naive one: id -> the time it was seen (expiry by a scan)."""
    return {bytes(bytearray(message_id)): n // RATE_PER_S for n, message_id in enumerate(ids)}


class SortedBuckets:
    """The compact one, not used by roq: each second's ids sorted into two arrays of 64-bit
    halves (16 bytes an id); a lookup bisects every bucket of the window (120 at 1 s)."""

    def __init__(self, ids: list[bytes]):
        self.buckets: list[tuple[array.array[int], array.array[int]]] = []
        for first in range(0, len(ids), RATE_PER_S):
            keys = sorted(ids[first : first + RATE_PER_S])
            high = array.array("Q", (int.from_bytes(k[:8], "big") for k in keys))
            low = array.array("Q", (int.from_bytes(k[8:], "big") for k in keys))
            self.buckets.append((high, low))

    def seen(self, message_id: bytes) -> bool:
        high, low = int.from_bytes(message_id[:8], "big"), int.from_bytes(message_id[8:], "big")
        for highs, lows in self.buckets:
            at = bisect.bisect_left(highs, high)
            while at < len(highs) and highs[at] == high:
                if lows[at] == low:
                    return True
                at += 1
        return False


SHAPES: dict[str, Callable[[list[bytes]], object]] = {
    "IdWindow (set of 128-bit ints, per-second buckets)": _window,
    "set of 16-byte bytes, per-second buckets": _bytes_set,
    "dict bytes -> time": _dict_times,
    "sorted 2 x 64-bit arrays per second (not used)": SortedBuckets,
}


def measure(count: int) -> dict[str, Any]:
    ids = [os.urandom(16) for _ in range(count)]
    out: dict[str, Any] = {"ids": count}
    for name, build in SHAPES.items():
        began = time.process_time()
        built = build(ids)  # timed without tracemalloc, which slows allocations many times
        took = time.process_time() - began
        del built
        tracemalloc.start()
        built = build(ids)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row = {"bytes": held, "peak_bytes": peak, "bytes_per_id": held / count,
               "fill_ns_per_id": took / count * 1e9,
               "target_gib": held / count * TARGET_IDS / 2**30}  # fmt: skip
        if isinstance(built, IdWindow | SortedBuckets):
            probe = ids[: min(count, 20_000)]
            began = time.process_time()
            found = sum(1 for message_id in probe if _seen(built, message_id))
            row["lookup_ns"] = (time.process_time() - began) / len(probe) * 1e9
            assert found == len(probe)
        if isinstance(built, SortedBuckets):  # a miss bisects all 120 buckets of the window
            row["lookup_ns_at_120_buckets"] = row["lookup_ns"] * 120 / len(built.buckets)
        out[name] = row
        del built
        lookup = row.get("lookup_ns_at_120_buckets", row.get("lookup_ns"))
        shown = "      —" if lookup is None else f"{lookup:7.0f}"
        print(f"{count:>11,} ids  {name:<52} {row['bytes_per_id']:6.1f} B/id  "
              f"{row['fill_ns_per_id']:5.0f} ns/add  {shown} ns/lookup  "
              f"60 M ids: {row['target_gib']:.2f} GiB", file=sys.stderr)  # fmt: skip
    return out


def batch_cost(batches: int = 2_000, records: int = 100) -> dict[str, float]:
    """What de-duplication adds to the exchange per record of a v2 batch with ids (the
    exchange's `_fresh_ids`, then `add_all` once appended): reading the ids, a lookup each,
    an add each. A v1 batch adds one comparison, not measured."""
    window = IdWindow(window_ms=120_000)
    frames = []
    for n in range(batches):
        metas = [batchfmt.encode_meta(message_id=os.urandom(16)) for _ in range(records)]
        batch = batchfmt.encode_batch(os.urandom(16), n, b"k", [b"x" * 100] * records,
                                      [0] * records, metas)  # fmt: skip
        frames.append((batch, batchfmt.validate_batch(batch)))
    began = time.process_time()
    for batch, header in frames:
        ids = [i for i in batchfmt.message_ids(batch, header) if i is not None]
        if not window.all_seen(ids, 1_000):
            window.add_all(ids, 1_000)
    took = time.process_time() - began
    began = time.process_time()  # the baseline: the check every batch already passes
    for batch, _ in frames:
        batchfmt.validate_batch(batch)
    checked = time.process_time() - began
    total = batches * records
    row = {"records": total, "ns_per_record": took / total * 1e9,
           "check_ns_per_record": checked / total * 1e9}  # fmt: skip
    print(f"v2 batches of {records} records with ids: {row['ns_per_record']:.0f} ns a record "
          f"(read ids, look up, add); the batch check itself: "
          f"{row['check_ns_per_record']:.0f} ns a record", file=sys.stderr)  # fmt: skip
    return row


def _seen(built: IdWindow | SortedBuckets, message_id: bytes) -> bool:
    return built.seen(message_id, 0) if isinstance(built, IdWindow) else built.seen(message_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, nargs="+", default=[1_000_000, 2_000_000])
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = {"target_ids": TARGET_IDS, "batch_cost": batch_cost(),
               "runs": [measure(count) for count in args.ids]}  # fmt: skip
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
