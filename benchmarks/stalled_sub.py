"""A subscriber that connects to an exchange's outbound (PUB) port and never reads.

    python benchmarks/stalled_sub.py tcp://127.0.0.1:20001 --seconds 200

It subscribes to every key and then sleeps: its receive queue fills, then the kernel's socket
buffers, then the exchange's per-subscriber send queue (`exchange.subscriber.hwm` batches), after
which ZeroMQ drops that subscriber's batches. Used to check that the exchange's memory stays
bounded (docs/benchmarks.md §4). Reads nothing; at the end it prints how many frames it could
still read without blocking (bounded by its own receive HWM), to show what was queued for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import zmq

RCVHWM = 1000  # the same default as a roq subscriber's data socket


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--seconds", type=float, default=180)
    args = parser.parse_args(argv)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.set_hwm(RCVHWM)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(args.endpoint)
    time.sleep(args.seconds)
    queued = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            sub.recv(zmq.NOBLOCK)
        except zmq.Again:
            break
        queued += 1
    print(
        json.dumps(
            {"endpoint": args.endpoint, "stalled_s": args.seconds, "frames_readable_at_end": queued}
        )
    )
    sub.close(0)
    context.term()


if __name__ == "__main__":
    main(sys.argv[1:])
