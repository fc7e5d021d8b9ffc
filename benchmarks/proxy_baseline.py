"""Baseline for roq's data plane: a bare pyzmq XSUB/XPUB proxy, one publisher, one subscriber.

Three processes on 127.0.0.1: a PUB that connects to the proxy's XSUB, the proxy
(`zmq.proxy(xsub, xpub)`), and a SUB that connects to the proxy's XPUB. This is the least a
Python broker built on pyzmq can cost; roq's exchange adds batch checks, the log, stats and
back-pressure on top.

Messages carry their send time (ns) and a sequence number in their first 16 bytes. "Batched"
concatenates `--batch` messages into one ZeroMQ frame (what roq's publisher does with linger >
0); "unbatched" sends one message per frame.

    python benchmarks/proxy_baseline.py throughput --payload 100 --batch 100 --seconds 5
    python benchmarks/proxy_baseline.py latency --payload 100 --rate 5000 --seconds 10

Each run prints one JSON line: sent and delivered msg/s, lost, and latency percentiles (ms).
Throughput runs send as fast as possible; ZeroMQ PUB drops at its high-water mark, so
`delivered_msg_s` is the number that counts. Latency runs pace the publisher at `--rate`, in
one of two ways. `--pacing tick` (the default) is how `roq bench` paces: each millisecond's
messages are sent together, then the publisher sleeps until the next tick. `--pacing spin`
sends each message at its own due time, sleeping until 50 µs before it and spinning the rest:
the spinning keeps a CPU awake, and on a VM that hides most wake-up costs, so its latencies
are lower than the same proxy's under tick pacing (docs/benchmarks.md §2 has both).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import struct
import sys
import time
from typing import Any

import zmq

HEAD = struct.Struct("<qq")  # send time (ns, CLOCK_REALTIME), sequence number
HWM = 100_000  # frames queued per peer (bounded; PUB drops past it, which is counted as loss)
QUIET_S = 1.0  # the subscriber stops after the run once nothing arrived for this long
DRAIN_MAX_S = 10.0
LATENCY_SAMPLES_MAX = 200_000
BURST = 1000  # frames received per poll


def proxy(front: int, back: int, ready: Any) -> None:
    context = zmq.Context()
    xsub = context.socket(zmq.XSUB)
    xsub.set_hwm(HWM)
    xsub.bind(f"tcp://127.0.0.1:{front}")
    xpub = context.socket(zmq.XPUB)
    xpub.set_hwm(HWM)
    xpub.bind(f"tcp://127.0.0.1:{back}")
    ready.set()
    try:
        zmq.proxy(xsub, xpub)
    except (zmq.ContextTerminated, KeyboardInterrupt):
        pass


def publisher(
    front: int, payload: int, batch: int, seconds: float, rate: int, pacing: str, results: Any
) -> None:
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.set_hwm(HWM)
    pub.connect(f"tcp://127.0.0.1:{front}")
    time.sleep(1.0)  # let the subscription travel sub → proxy → publisher
    filler = b"x" * (payload - HEAD.size)
    sent = 0
    started = time.perf_counter()
    end = started + seconds
    while (now := time.perf_counter()) < end:
        if rate and pacing == "tick" and sent >= rate * (now - started):
            time.sleep(0.001)  # the tick's messages are out: sleep, as roq bench does
            continue
        if rate and pacing == "spin":
            due = started + sent / rate
            if now < due:
                if due - now > 5e-5:
                    time.sleep(due - now - 5e-5)
                continue
        stamp = time.time_ns()
        if batch == 1:
            pub.send(HEAD.pack(stamp, sent) + filler)
        else:
            pub.send(b"".join(HEAD.pack(stamp, sent + i) + filler for i in range(batch)))
        sent += batch
    results.put(("pub", {"sent": sent, "seconds": time.perf_counter() - started}))
    pub.close(linger=2000)
    context.term()


def subscriber(
    back: int, payload: int, batch: int, seconds: float, ready: Any, results: Any
) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.set_hwm(HWM)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{back}")
    ready.set()
    got = 0
    first = last = 0.0
    latencies: list[float] = []
    deadline = time.perf_counter() + 1.0 + seconds + DRAIN_MAX_S
    while time.perf_counter() < deadline:
        if not sub.poll(int(QUIET_S * 1000)):
            if got:
                break
            continue
        for _ in range(BURST):  # drain without a poll per frame (a poll costs as much)
            try:
                frame = sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            got += len(frame) // payload
            if len(latencies) < LATENCY_SAMPLES_MAX:
                stamp, _ = HEAD.unpack_from(frame, 0)  # a batch's messages share one send time
                latencies.append((time.time_ns() - stamp) / 1e6)
        last = time.perf_counter()
        first = first or last
    results.put(
        ("sub", {"delivered": got, "seconds": max(1e-9, last - first), "latency_ms": latencies})
    )
    sub.close(0)
    context.term()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def run(
    payload: int, batch: int, seconds: float, rate: int, port: int, pacing: str = "tick"
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    proxy_ready, sub_ready, results = ctx.Event(), ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=proxy, args=(port, port + 1, proxy_ready), daemon=True)]
    workers[0].start()
    proxy_ready.wait(10)
    workers.append(
        ctx.Process(target=subscriber, args=(port + 1, payload, batch, seconds, sub_ready, results))
    )
    workers[1].start()
    sub_ready.wait(10)
    workers.append(
        ctx.Process(target=publisher, args=(port, payload, batch, seconds, rate, pacing, results))
    )
    workers[2].start()
    got = dict(results.get(timeout=seconds + 30) for _ in range(2))
    for worker in workers[1:]:
        worker.join(10)
    workers[0].terminate()
    workers[0].join(5)
    pub, sub = got["pub"], got["sub"]
    lat = sub["latency_ms"]
    return {
        "system": "pyzmq XSUB/XPUB proxy",
        "payload": payload,
        "batch": batch,
        "rate": rate,
        "pacing": pacing if rate else None,
        "seconds": seconds,
        "sent": pub["sent"],
        "sent_msg_s": round(pub["sent"] / pub["seconds"]),
        "delivered": sub["delivered"],
        "delivered_msg_s": round(sub["delivered"] / sub["seconds"]),
        "lost": pub["sent"] - sub["delivered"],
        "latency_ms": {
            "p50": percentile(lat, 0.5),
            "p99": percentile(lat, 0.99),
            "p99.9": percentile(lat, 0.999),
        },
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("throughput", "latency"))
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1, help="messages per frame")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=5000, help="msg/s (latency mode)")
    parser.add_argument("--port", type=int, default=21500)
    parser.add_argument(
        "--pacing",
        choices=("tick", "spin"),
        default="tick",
        help="latency mode: 1 ms ticks like roq bench, or spin to each due time",
    )
    args = parser.parse_args(argv)
    if args.payload < HEAD.size:
        parser.error(f"--payload must be at least {HEAD.size}")
    rate = args.rate if args.mode == "latency" else 0
    print(json.dumps(run(args.payload, args.batch, args.seconds, rate, args.port, args.pacing)))


if __name__ == "__main__":
    main(sys.argv[1:])
