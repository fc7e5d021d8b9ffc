"""CPU per send of a batch-sized frame, zero-copy (copy=False: pyzmq hands the buffer to libzmq and
frees it through its garbage-collector thread) against copying, with CurveZMQ on and off (issue
35). A PUSH in this process sends to a PULL in a child process that drains it, so the sender is
held back by the receiver, never dropping. CPU is this process's, all threads: Python, libzmq's
I/O thread (where CURVE encrypts) and pyzmq's collector. Variants interleaved, --rounds rounds.

    python benchmarks/curve_send_copy.py --rounds 3 --sizes 66000,1100
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from typing import Any

import zmq

PORT = 21710


def drain(port: int, curve: tuple[bytes, bytes, bytes] | None, ready: Any) -> None:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.set_hwm(1000)
    if curve:
        pull.curve_serverkey, pull.curve_publickey, pull.curve_secretkey = curve
    pull.connect(f"tcp://127.0.0.1:{port}")
    ready.set()
    while pull.poll(3000):
        pull.recv(copy=False)
    pull.close(0)
    context.term()


def measure(size: int, copy: bool, curve: bool, seconds: float) -> dict[str, Any]:
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.set_hwm(1000)
    keys = None
    if curve:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        push.curve_server, push.curve_secretkey = True, server_secret
        keys = (server_public, client_public, client_secret)
    push.bind(f"tcp://127.0.0.1:{PORT}")
    ready = mp.get_context("spawn").Event()
    child = mp.get_context("spawn").Process(target=drain, args=(PORT, keys, ready))
    child.start()
    ready.wait(30)
    for _ in range(200):  # connected and past the handshake
        push.send(b"w")
    batch = bytearray(b"x" * size)
    sent = 0
    cpu0, started = time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(50):
            push.send(batch, copy=copy)
        sent += 50
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - started
    push.close(linger=2000)
    context.term()
    child.join(15)
    return {"size": size, "copy": copy, "curve": curve, "sends_s": round(sent / wall),
            "cpu_us_per_send": round(cpu / sent * 1e6, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="66000,1100")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    results: dict[tuple[int, bool, bool], list[float]] = {}
    for turn in range(args.rounds):
        for size in map(int, args.sizes.split(",")):
            variants = [(c, v) for c in (True, False) for v in (False, True)]
            for curve, copy in variants if turn % 2 == 0 else variants[::-1]:
                line = measure(size, copy, curve, args.seconds)
                print(json.dumps(line), flush=True)
                results.setdefault((size, curve, copy), []).append(line["cpu_us_per_send"])
    for (size, curve, copy), values in sorted(results.items()):
        print(f"size {size:6} curve {curve!s:5} copy {copy!s:5}: "
              f"median {statistics.median(values):7.2f} µs/send {sorted(values)}")  # fmt: skip


if __name__ == "__main__":
    main()
