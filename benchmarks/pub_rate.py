"""How fast one `Publisher` accepts and sends messages, alone (no subscriber), in one process.

    python benchmarks/pub_rate.py --gcm 127.0.0.1:22000 -q pr --count 50000 --linger-ms 0

Prints one JSON line: msg/s from the first send() to the end of flush(), and the process's CPU
seconds per message. Used to isolate the publisher's cost from the exchange's and the
subscriber's (docs/benchmarks.md, Profile).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from roq.client.admin import AdminClient, AdminRefused
from roq.client.publisher import Publisher


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gcm", default="127.0.0.1:22000")
    parser.add_argument("-q", "--queue", default="pr")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--linger-ms", type=float, default=0.0)
    parser.add_argument("--many", type=int, default=0, help="use send_many with N per call")
    args = parser.parse_args(argv)
    with AdminClient(gcm=args.gcm) as admin:
        try:
            admin.create_queue(args.queue)
        except AdminRefused:  # it exists already
            pass
    payload = b"x" * args.payload
    publisher = Publisher(args.queue, gcm=args.gcm, linger_ms=args.linger_ms)
    try:
        cpu0, started = time.process_time(), time.perf_counter()
        if args.many:
            chunk = [payload] * args.many
            for _ in range(args.count // args.many):
                publisher.send_many(chunk, b"k")
        else:
            for _ in range(args.count):
                publisher.send(payload, b"k")
        publisher.flush()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        publisher.close()
    print(
        json.dumps(
            {
                "count": args.count,
                "payload": args.payload,
                "linger_ms": args.linger_ms,
                "msg_s": round(args.count / wall),
                "cpu_us_per_msg": round(cpu / args.count * 1e6, 2),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
