"""The memory of the HTTP gateway's index of places (issue 34): bytes per message kept, without
the texts (`http.cache.bytes` bounds those), measured in this process.

Fills a `roq.http.index.TopicIndex` (nothing held: cache 0) with --topics topics of --messages
messages each (the log offsets of real batches: one batch per --batch messages, 4 exchanges),
measuring with tracemalloc what the index allocated, and the process's VmRSS growth (/proc;
with --rss-only, without tracemalloc, whose own records would count).
Runs against whichever tree PYTHONPATH names, so that the index before and after a change can be
compared:

    PYTHONPATH=appliance .venv/bin/python benchmarks/http_index_memory.py --messages 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import tracemalloc
from pathlib import Path

from roq.http.index import TopicIndex


def rss_bytes() -> int:
    found = re.search(r"^VmRSS:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.M)
    return int(found.group(1)) * 1024 if found else 0


def fill(index: TopicIndex, args: argparse.Namespace) -> None:
    for t in range(args.topics):
        topic = f"topic-{t}"
        index.add(
            (topic, n, None, f"x{n % 4}", args.offset_base + (n // args.batch) * 4096, b"")
            for n in range(1, args.messages + 1)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1)
    parser.add_argument("--messages", type=int, default=100_000, help="per topic")
    parser.add_argument("--batch", type=int, default=1, help="messages per log batch")
    parser.add_argument("--max-queue-size", type=int, default=0, help="0: --messages")
    parser.add_argument("--offset-base", type=int, default=1_000_000, help="2**33: logs > 4 GiB")
    parser.add_argument("--rss-only", action="store_true", help="no tracemalloc (its own cost)")
    args = parser.parse_args()
    bound = args.max_queue_size or args.messages
    gc.collect()
    rss_before = rss_bytes()
    if not args.rss_only:
        tracemalloc.start()
    index = TopicIndex(bound, 0)
    fill(index, args)
    gc.collect()
    traced, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_grown = rss_bytes() - rss_before
    kept = index.count
    result = {
        "topics": args.topics,
        "messages_kept": kept,
        "traced_bytes": traced,
        "traced_bytes_per_message": round(traced / kept, 2),
        "traced_peak_bytes": peak,
        "rss_growth_bytes": rss_grown,
        "rss_growth_bytes_per_message": round(rss_grown / kept, 2),
    }
    if hasattr(index, "place_bytes"):
        result["place_bytes_per_message"] = round(index.place_bytes() / kept, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
