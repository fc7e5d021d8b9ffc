"""Where roq's latency at 5,000 msg/s goes: each end of one exchange, raw or roq's client.

A "raw" publisher is one pyzmq DEALER in one thread, sending pre-encoded record batches straight
to the exchange's front port; roq's is a `Publisher` (caller thread + I/O thread) at linger 0.
A "raw" subscriber is one pyzmq SUB on the exchange's back port that reads every record's
timestamp; roq's is a `Subscriber`. All four pairs run through the same exchange, paced like
`roq bench` (each millisecond's 5 messages together), so the differences are the clients'.
`--relay` runs the raw pair through a 20-line pyzmq ROUTER→XPUB relay instead of an exchange:
the least a Python exchange can cost on the machine. The queue must exist and have one exchange
(the raw ends talk to the exchange a publisher is placed on).

    python benchmarks/latency_hops.py --gcm 127.0.0.1:22000 -q lat1 --rounds 2
    python benchmarks/latency_hops.py --relay --rounds 3

Prints one JSON line per run: the pair and the latency percentiles (ms) of every record after
the first tenth of the run (warm-up).
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

RATE, PER_TICK, PAYLOAD = 5000, 5, b"x" * 100
RELAY_PORT = 29000
QUIET_S = 1.0


def _paced(seconds: float, send_tick: Any) -> None:
    """Each millisecond's PER_TICK messages at once, then sleep: roq bench's pacing."""
    started = time.monotonic()
    sent = 0
    while (now := time.monotonic()) < started + seconds:
        if sent >= RATE * (now - started):
            time.sleep(0.001)
            continue
        send_tick()
        sent += PER_TICK


def raw_pub(front: str, seconds: float, ready: Any, go: Any, _client: dict[str, Any]) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(front)
    producer, seq = uuid.uuid4().bytes, [0]

    def tick() -> None:
        stamps = [time.time_ns() // 1000] * PER_TICK
        batch = batchfmt.encode_batch(producer, seq[0], b"", [PAYLOAD] * PER_TICK, stamps)
        dealer.send_multipart([dataplane.BATCH, batch])
        seq[0] += PER_TICK

    ready.set()
    go.wait()
    _paced(seconds, tick)
    time.sleep(0.5)
    dealer.close(1000)


def roq_pub(_front: str, seconds: float, ready: Any, go: Any, client: dict[str, Any]) -> None:
    from roq.client.publisher import Publisher

    publisher = Publisher(client["queue"], gcm=client["gcm"], linger_ms=0)

    def tick() -> None:
        for _ in range(PER_TICK):
            publisher.send(PAYLOAD)

    ready.set()
    go.wait()
    _paced(seconds, tick)
    publisher.close()


def raw_sub(back: str, seconds: float, ready: Any, out: Any, _client: dict[str, Any]) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(back)
    ready.set()
    latency: list[float] = []
    deadline = time.monotonic() + seconds + 10
    while time.monotonic() < deadline:
        if not sub.poll(int(QUIET_S * 1000)):
            if latency:
                break
            continue
        frames = sub.recv_multipart()
        now = time.time_ns() // 1000
        latency += [(now - r.timestamp_us) / 1000 for r in batchfmt.iter_records(frames[-1])]
    out.put(latency)
    sub.close(0)


def roq_sub(_back: str, seconds: float, ready: Any, out: Any, client: dict[str, Any]) -> None:
    from roq.client.subscriber import Subscriber, records

    subscriber = Subscriber(client["queue"], gcm=client["gcm"])
    ready.set()
    latency: list[float] = []
    deadline, heard = time.monotonic() + seconds + 10, 0.0
    while time.monotonic() < deadline:
        deliveries = subscriber.poll(50)
        if not deliveries:
            if latency and time.monotonic() - heard > QUIET_S:
                break
            continue
        heard = time.monotonic()
        now = time.time_ns() // 1000
        for delivery in deliveries:
            latency += [(now - r.timestamp_us) / 1000 for r in records(delivery)]
    subscriber.close()
    out.put(latency)


def relay(ready: Any) -> None:
    """The least a Python exchange does: ROUTER in, XPUB out, one poll loop."""
    context = zmq.Context()
    front, back = context.socket(zmq.ROUTER), context.socket(zmq.XPUB)
    front.bind(f"tcp://127.0.0.1:{RELAY_PORT}")
    back.bind(f"tcp://127.0.0.1:{RELAY_PORT + 1}")
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    ready.set()
    while True:
        events = dict(poller.poll(100))
        while front in events:
            try:
                frames = front.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            back.send_multipart([b"", frames[-1]])
        if back in events:
            back.recv()  # a subscription: ZeroMQ applied it already


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def run(pub: str, sub: str, ends: tuple[str, str], seconds: float, client: dict[str, Any]) -> None:
    ctx = mp.get_context("fork")
    pub_ready, sub_ready, go, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    subscriber = ctx.Process(
        target=raw_sub if sub == "raw" else roq_sub, args=(ends[1], seconds, sub_ready, out, client)
    )
    subscriber.start()
    sub_ready.wait(30)
    publisher = ctx.Process(
        target=raw_pub if pub == "raw" else roq_pub, args=(ends[0], seconds, pub_ready, go, client)
    )
    publisher.start()
    pub_ready.wait(30)
    time.sleep(1.0)  # subscriptions travel to the exchange
    go.set()
    latency = out.get(timeout=seconds + 60)
    publisher.join(10)
    subscriber.join(10)
    latency = latency[len(latency) // 10 :]
    quantiles = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999}
    result = {k: percentile(latency, q) for k, q in quantiles.items()} if latency else {}
    print(json.dumps({"pub": pub, "sub": sub, "via": client.get("via"), "n": len(latency),
                      "latency_ms": result}), flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gcm", default="127.0.0.1:22000")
    parser.add_argument("-q", "--queue", default="lat1")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--relay", action="store_true", help="raw pair through a bare relay")
    args = parser.parse_args(argv)
    client = {"gcm": args.gcm, "queue": args.queue, "via": "relay" if args.relay else "exchange"}
    if args.relay:
        ready = mp.get_context("fork").Event()
        server = mp.get_context("fork").Process(target=relay, args=(ready,), daemon=True)
        server.start()
        ready.wait(10)
        ends = (f"tcp://127.0.0.1:{RELAY_PORT}", f"tcp://127.0.0.1:{RELAY_PORT + 1}")
        pairs = [("raw", "raw")]
    else:
        from roq.client.publisher import Publisher

        probe = Publisher(args.queue, gcm=args.gcm)  # the exchange the monitor places us on
        front = probe.exchange or ""
        probe.close()
        ends = (front, sibling(front, ExchangePort.FRONT, ExchangePort.BACK))
        pairs = [("raw", "raw"), ("raw", "roq"), ("roq", "raw"), ("roq", "roq")]
    for _ in range(args.rounds):
        for pub, sub in pairs:
            run(pub, sub, ends, args.seconds, client)


if __name__ == "__main__":
    main(sys.argv[1:])
