"""The exchange's own ceiling: a raw pyzmq DEALER floods a running exchange's front port F with
pre-encoded record batches (no roq Publisher in the way), and a raw SUB on its back port F+1
counts what comes out. This separates the exchange's cost from the Python publisher's, which
is the bottleneck of `roq bench` (docs/benchmarks.md, Profile).

    python benchmarks/exchange_flood.py tcp://127.0.0.1:20008 --records 1 --payload 100 \
        --seconds 5

Prints one JSON line: batches/s and msg/s sent and forwarded. The DEALER's send queue is
bounded (HWM 1000 batches), so the sender is held back by the exchange, never dropped; the
SUB may miss batches if it falls behind (counted as `not_forwarded`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import uuid
from typing import Any

import zmq

from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.ports import ExchangePort, sibling

QUIET_S = 1.5


def count(back: str, ready: Any, results: Any) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.set_hwm(100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(back)
    ready.set()
    frames, records = 0, 0
    first = last = 0.0
    while sub.poll(int(QUIET_S * 1000)) or not frames:
        for _ in range(1000):
            try:
                parts = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            frames += 1
            records += batchfmt.read_header(parts[1]).count
        last = time.perf_counter()
        first = first or last
        if not frames and last == 0 and time.perf_counter() > 60:
            break
    results.put(
        {"forwarded_batches": frames, "forwarded_msgs": records, "seconds": max(1e-9, last - first)}
    )
    sub.close(0)
    context.term()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("front", help="tcp://HOST:F, the exchange's front port")
    parser.add_argument("--records", type=int, default=1, help="records per batch")
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    back = sibling(args.front, ExchangePort.FRONT, ExchangePort.BACK)
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    counter = ctx.Process(target=count, args=(back, ready, results))
    counter.start()
    ready.wait(10)
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.set_hwm(1000)
    dealer.connect(args.front)
    time.sleep(1.0)
    pid = uuid.uuid4().bytes
    payloads = [b"x" * args.payload] * args.records
    seq, sent = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for _ in range(100):
            stamps = [time.time_ns() // 1000] * args.records
            batch = batchfmt.encode_batch(pid, seq, b"flood", payloads, stamps)
            dealer.send_multipart([dataplane.BATCH, batch])
            seq += args.records
            sent += 1
    wall = time.perf_counter() - started
    got = results.get(timeout=args.seconds + 60)
    counter.join(10)
    dealer.close(1000)
    context.term()
    print(
        json.dumps(
            {
                "records_per_batch": args.records,
                "payload": args.payload,
                "sent_batches_s": round(sent / wall),
                "sent_msgs_s": round(sent * args.records / wall),
                "forwarded_batches_s": round(got["forwarded_batches"] / got["seconds"]),
                "forwarded_msgs_s": round(got["forwarded_msgs"] / got["seconds"]),
                "not_forwarded_batches": sent - got["forwarded_batches"],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
