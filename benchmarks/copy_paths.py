"""CPU per batch of the exchange's relay step, receive → writable copy → stamp → forward, by the
way the bytes are held (issue 35, "fewer copies per byte"). A child process floods a ROUTER in
this process with pre-encoded frames of --size bytes; this process relays each to a PUB that a
second child drains, for --seconds per variant, variants interleaved over --rounds. CPU is this
process's, every thread's (Python, libzmq's I/O thread, pyzmq's zero-copy garbage collector),
per relayed batch; plain ZeroMQ, no CURVE.

    python benchmarks/copy_paths.py --sizes 66000,1100,160 --rounds 3

Variants:
    bytes+bytearray   what the exchange did before issue 35: a copying receive (bytes), a
                      bytearray copy to stamp, a zero-copy send (pyzmq's gc thread frees it)
    frame+bytearray   a zero-copy receive (a Frame), the bytearray copy, a zero-copy send
    frame+frame       a zero-copy receive, one copy into a new ZeroMQ message (a Frame, which
                      is writable), stamped in place, sent as that Frame (ZeroMQ's reference
                      count: no gc thread)
    bytes+copysend    a copying receive, the bytearray copy, a copying send
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import struct
import sys
import time
from typing import Any

import zmq

FRONT, BACK = 21810, 21811
STAMP = struct.Struct("<Q")


def flood(size: int, stop: Any) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.set_hwm(1000)
    dealer.connect(f"tcp://127.0.0.1:{FRONT}")
    frame = b"\x01" + bytes(size - 1)
    while not stop.is_set():
        try:
            dealer.send_multipart([b"B", frame], zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.0005)
    dealer.close(0)
    context.term()


def drain(stop: Any) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.set_hwm(100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{BACK}")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    while not stop.is_set():
        try:
            sub.recv_multipart(copy=False)
        except zmq.Again:
            pass
    sub.close(0)
    context.term()


def relay_one(variant: str, frames: list[Any], back: Any) -> None:
    if variant == "frame+frame":
        out = zmq.Frame(frames[-1], copy=True)
        STAMP.pack_into(out, 4, 7)
        back.send_multipart([b"k", out], copy=False)
        return
    stamped = bytearray(frames[-1])
    STAMP.pack_into(stamped, 4, 7)
    back.send_multipart([b"k", stamped], copy=variant != "bytes+copysend")


def measure(variant: str, front: Any, back: Any, seconds: float) -> float:
    copy = variant.startswith("bytes")
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    done, start_cpu = 0, time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not poller.poll(100):
            continue
        for _ in range(100):
            try:
                frames = front.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                break
            relay_one(variant, frames, back)
            done += 1
    return (time.process_time() - start_cpu) / max(done, 1) * 1e6


VARIANTS = ("bytes+bytearray", "frame+bytearray", "frame+frame", "bytes+copysend")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="66000,1100,160")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    context = zmq.Context()
    front, back = context.socket(zmq.ROUTER), context.socket(zmq.PUB)
    front.set_hwm(1000)
    back.set_hwm(100_000)
    front.bind(f"tcp://127.0.0.1:{FRONT}")
    back.bind(f"tcp://127.0.0.1:{BACK}")
    for size in (int(s) for s in args.sizes.split(",")):
        stop = mp.Event()
        children = [
            mp.Process(target=flood, args=(size, stop)),
            mp.Process(target=drain, args=(stop,)),
        ]
        for child in children:
            child.start()
        time.sleep(1.0)  # connections up and the queues full before the first variant
        results: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for turn in range(args.rounds):
            order = VARIANTS if turn % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                results[variant].append(measure(variant, front, back, args.seconds))
        stop.set()
        for child in children:
            child.join(10)
        base = statistics.median(results[VARIANTS[0]])
        for variant, runs in results.items():
            line = {
                "size": size,
                "variant": variant,
                "us_cpu_per_batch": round(statistics.median(runs), 2),
                "runs": [round(r, 2) for r in runs],
                "ratio_to_before": round(statistics.median(runs) / base, 3),
            }
            print(json.dumps(line), flush=True)
    front.close(0)
    back.close(0)
    context.term()


if __name__ == "__main__":
    main(sys.argv[1:])
