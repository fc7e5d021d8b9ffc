"""CPU per send of the exchange's forward step, `PUB.send_multipart([key, batch])`, zero-copy
(what exchange.py does: copy=False) against copying, for batch sizes seen on the hot path.

A PUB socket in this process sends to a SUB in a child process that drains it. CPU is this
process's (all threads: Python, libzmq's I/O thread and pyzmq's zero-copy garbage collector).

    python benchmarks/zmq_send_copy.py
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from typing import Any

import zmq

PORT = 21700
SECONDS = 3.0


def drain(port: int, ready: Any) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.set_hwm(100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    ready.set()
    while sub.poll(3000):
        sub.recv_multipart()
    sub.close(0)
    context.term()


def measure(size: int, copy: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.set_hwm(100_000)
    pub.bind(f"tcp://127.0.0.1:{PORT}")
    child = ctx.Process(target=drain, args=(PORT, ready))
    child.start()
    ready.wait(10)
    time.sleep(0.5)
    batch = bytearray(b"x" * size)
    sent = 0
    cpu0, started = time.process_time(), time.perf_counter()
    while time.perf_counter() - started < SECONDS:
        for _ in range(100):
            pub.send_multipart([b"test", batch], copy=copy)
        sent += 100
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - started
    pub.close(linger=1000)
    context.term()
    child.join(15)
    return {
        "batch_bytes": size,
        "copy": copy,
        "sends_s": round(sent / wall),
        "cpu_us_per_send": round(cpu / sent * 1e6, 2),
    }


def main() -> None:
    for size in (170, 10_862, 66_000):
        for copy in (False, True):
            print(json.dumps(measure(size, copy)), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
