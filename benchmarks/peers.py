"""roq beside NATS JetStream (file store) and Redis Streams (AOF, everysec), in one window
(issue 35): 1 publisher and 1 subscriber process per system, the systems interleaved round by
round (the order turns each round), at each payload size, as fast as the publisher goes; and,
with --rate, paced, for the subscriber's latency. One JSON line per run to --out.

    python benchmarks/peers.py run --rounds 3 --seconds 5 --payloads 100,1024 \
        --out benchmarks/results/2026-11-27-cost/peers.jsonl
    python benchmarks/peers.py run --rounds 3 --seconds 5 --payloads 100 --rate 5000 \
        --out benchmarks/results/2026-11-27-cost/peers-latency.jsonl
    python benchmarks/peers.py summarize benchmarks/results/2026-11-27-cost/peers.jsonl

roq: a `roq up` cluster of this tree, security on (the default), log on (R=1), acks=none, its
`roq bench` (a publisher and a subscriber process; linger 2 ms: `send_many` in runs of 1,000).
NATS: `nats-server -js` with a file-store stream; the publisher publishes to the stream's
subject without waiting for acknowledgements (the stream stores every message; its count is
checked after the run), the subscriber reads a push consumer without acks (flow control on)
through a plain subscription.
Redis: `redis-server --appendonly yes --appendfsync everysec`; the publisher pipelines XADD
1,000 at a time, the subscriber XREADs 1,000 at a time. Each message carries its send time
(8 bytes, in the payload) for the latency; delivered msg/s is what the subscriber received
divided by the time from the publisher's first send to the subscriber's last receive. A fresh
stream per run, deleted after it.

The servers are Debian packages (`apt-get install nats-server redis-server`; no systemd unit is
needed: the script starts its own on --nats-port and --redis-port in temporary directories);
the clients are roq's `bench` extra (`pip install -e .[bench]`: nats-py, redis). Benchmark only,
not in `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from upcluster import UpCluster

TREE = Path(__file__).resolve().parent.parent
STAMP = struct.Struct("<q")  # the send time, ns since the epoch, at the start of each payload
END = b"END!"  # the publisher's last message: the subscriber stops there
CHUNK = 1000  # messages per publisher call (a pipeline, a send_many) and per subscriber read
IDLE_S = 20.0  # a subscriber that hears nothing this long gives up (and reports what it has)
SYSTEMS = ("roq", "nats", "redis")


# --- workers: one process each, started by the runner; one JSON line on stdout ------------------
def _payloads(size: int) -> bytes:
    return bytes(max(0, size - STAMP.size))


def _paced(rate: float, started: float, sent: int) -> float:
    """Seconds to wait before message `sent` at `rate` msg/s (0: as fast as possible)."""
    return max(0.0, started + sent / rate - time.monotonic()) if rate else 0.0


async def nats_pub(args: argparse.Namespace) -> dict[str, Any]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{args.port}", pending_size=8 * 1024 * 1024)
    pad, sent, started = _payloads(args.payload), 0, time.monotonic()
    start_ns, deadline = time.time_ns(), started + args.seconds
    while time.monotonic() < deadline:
        step = CHUNK if not args.rate else max(1, int(args.rate / 1000))
        for _ in range(step):
            await nc.publish(args.subject, STAMP.pack(time.time_ns()) + pad)
        sent += step
        wait = _paced(args.rate, started, sent)
        if wait:
            await nc.flush()
            await asyncio.sleep(wait)
    await nc.publish(args.subject, END)
    await nc.flush(timeout=60)
    await nc.close()
    return {"sent": sent, "start_ns": start_ns}


async def nats_sub(args: argparse.Namespace) -> dict[str, Any]:
    """A push consumer without acks, delivered to an inbox read by a plain subscription: a
    pull consumer's fetch (1,000 at a time, as in the first version of this script) read only
    ~5 k msg/s, a request and its wait per batch. Flow control keeps the server from
    overrunning the subscription (its requests are answered here); the idle heartbeats it
    needs are skipped like them."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(f"nats://127.0.0.1:{args.port}")
    tally, inbox = _Tally(), nc.new_inbox()

    async def on_message(msg: Any) -> None:
        if msg.headers and msg.headers.get("Status") == "100":  # flow control or heartbeat
            if msg.reply:
                await nc.publish(msg.reply, b"")
            return
        tally.add([msg.data])

    await nc.subscribe(inbox, cb=on_message, pending_msgs_limit=1_000_000,
                       pending_bytes_limit=1 << 30)  # fmt: skip
    config = ConsumerConfig(
        deliver_subject=inbox,
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        flow_control=True,
        idle_heartbeat=5.0,
    )
    await nc.jetstream().add_consumer(args.stream, config)
    print("ready", flush=True)
    while not tally.done and time.monotonic() - tally.heard < IDLE_S:
        await asyncio.sleep(0.05)
    await nc.close()
    return tally.result()


def redis_pub(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    client = redis.Redis(host="127.0.0.1", port=args.port)
    pad, sent, started = _payloads(args.payload), 0, time.monotonic()
    start_ns, deadline = time.time_ns(), started + args.seconds
    while time.monotonic() < deadline:
        step = CHUNK if not args.rate else max(1, int(args.rate / 1000))
        pipe = client.pipeline(transaction=False)
        for _ in range(step):
            pipe.xadd(args.stream, {b"d": STAMP.pack(time.time_ns()) + pad})
        pipe.execute()
        sent += step
        time.sleep(_paced(args.rate, started, sent))
    client.xadd(args.stream, {b"d": END})
    return {"sent": sent, "start_ns": start_ns}


def redis_sub(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    client = redis.Redis(host="127.0.0.1", port=args.port)
    last, tally = b"0", _Tally()
    print("ready", flush=True)
    while not tally.done and time.monotonic() - tally.heard < IDLE_S:
        answer = client.xread({args.stream: last}, count=CHUNK, block=1000)
        if not answer:
            continue
        entries = answer[0][1]
        last = entries[-1][0]
        tally.add([fields[b"d"] for _, fields in entries])
    return tally.result()


class _Tally:
    def __init__(self) -> None:
        self.count, self.done = 0, False
        self.heard = time.monotonic()
        self.last_ns = 0
        self.latencies_us: list[float] = []

    def add(self, payloads: list[bytes]) -> None:
        now = time.time_ns()
        self.heard = time.monotonic()
        for data in payloads:
            if data == END:
                self.done = True
                continue
            self.count += 1
            if self.count % 10 == 0:  # a sample: the list stays small at a million messages
                self.latencies_us.append((now - STAMP.unpack_from(data)[0]) / 1000)
        self.last_ns = now

    def result(self) -> dict[str, Any]:
        lat = sorted(self.latencies_us)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 1)) if lat else None
        return {
            "received": self.count,
            "last_ns": self.last_ns,
            "complete": self.done,
            "p50_us": pick(0.5) if pick else None,
            "p99_us": pick(0.99) if pick else None,
        }


def worker(args: argparse.Namespace) -> None:
    run = {
        "nats-pub": nats_pub,
        "nats-sub": nats_sub,
        "redis-pub": redis_pub,
        "redis-sub": redis_sub,
    }[args.role]
    result = asyncio.run(run(args)) if args.role.startswith("nats") else run(args)
    print(json.dumps(result), flush=True)


# --- servers ----------------------------------------------------------------------------------
class Server:
    def __init__(self, command: list[str], directory: Path) -> None:
        self.directory = directory
        self.process = subprocess.Popen(
            command,
            cwd=directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(20)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_nats(port: int) -> Server:
    directory = Path(tempfile.mkdtemp(prefix="peers-nats-"))
    server = Server(
        ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(directory)], directory
    )
    _wait_port(port)
    return server


def start_redis(port: int) -> Server:
    directory = Path(tempfile.mkdtemp(prefix="peers-redis-"))
    server = Server(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
        ],
        directory,
    )
    _wait_port(port)
    return server


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


# --- the runner -------------------------------------------------------------------------------
def _spawn(role: str, extra: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "worker", "--role", role, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _pair(kind: str, extra: list[str], seconds: float) -> dict[str, Any]:
    """A subscriber, then a publisher; the rate from the publisher's first send to the
    subscriber's last receive."""
    sub = _spawn(f"{kind}-sub", extra)
    assert sub.stdout is not None
    if sub.stdout.readline().strip() != "ready":
        raise SystemExit(f"{kind} subscriber did not start")
    pub = _spawn(f"{kind}-pub", extra)
    pub_out, _ = pub.communicate(timeout=seconds + 120)
    sub_out, _ = sub.communicate(timeout=IDLE_S + 120)
    sent, got = json.loads(pub_out.splitlines()[-1]), json.loads(sub_out.splitlines()[-1])
    span_s = max(1e-9, (got["last_ns"] - sent["start_ns"]) / 1e9)
    return {
        "sent": sent["sent"],
        "received": got["received"],
        "lost": sent["sent"] - got["received"],
        "delivered_msg_s": round(got["received"] / span_s),
        "p50_us": got["p50_us"],
        "p99_us": got["p99_us"],
        "complete": got["complete"],
    }


def run_nats(args: argparse.Namespace, payload: int, turn: int) -> dict[str, Any]:
    stream, subject = f"PEERS{turn}P{payload}", f"peers.{turn}.{payload}"

    async def admin(create: bool) -> None:
        import nats
        from nats.js.api import StorageType

        nc = await nats.connect(f"nats://127.0.0.1:{args.nats_port}")
        js = nc.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
        else:
            await js.delete_stream(stream)
        await nc.close()

    asyncio.run(admin(True))
    try:
        extra = ["--port", str(args.nats_port), "--stream", stream, "--subject", subject]
        return _pair("nats", [*extra, *_common(args, payload)], args.seconds)
    finally:
        asyncio.run(admin(False))


def run_redis(args: argparse.Namespace, payload: int, turn: int) -> dict[str, Any]:
    import redis

    stream = f"peers:{turn}:{payload}"
    try:
        extra = ["--port", str(args.redis_port), "--stream", stream]
        return _pair("redis", [*extra, *_common(args, payload)], args.seconds)
    finally:
        redis.Redis(host="127.0.0.1", port=args.redis_port).delete(stream)


def run_roq(cluster: UpCluster, args: argparse.Namespace, payload: int) -> dict[str, Any]:
    rate = ["--rate", str(args.rate)] if args.rate else []
    result = cluster.bench(
        [
            "--queue",
            f"peers{payload}",
            "--seconds",
            str(args.seconds),
            "--payload",
            str(payload),
            *rate,
        ]
    )
    latency = result.get("latency_ms", {})
    return {
        "sent": result.get("published"),
        "lost": result.get("lost"),
        "duplicated": result.get("duplicated"),
        "delivered_msg_s": result["delivered_msg_s"],
        "p50_us": _us(latency.get("p50")),
        "p99_us": _us(latency.get("p99")),
    }


def _us(ms: float | None) -> float | None:
    return None if ms is None else round(ms * 1000, 1)


def _common(args: argparse.Namespace, payload: int) -> list[str]:
    return ["--payload", str(payload), "--seconds", str(args.seconds), "--rate", str(args.rate)]


def run(args: argparse.Namespace) -> None:
    systems = [s for s in args.systems.split(",") if s]
    servers: list[Server] = []
    cluster = None
    try:
        if "nats" in systems:
            servers.append(start_nats(args.nats_port))
        if "redis" in systems:
            servers.append(start_redis(args.redis_port))
        if "roq" in systems:
            defines = [
                f"zk.servers=127.0.0.1:{args.zk_port}",
                "http.enabled=false",
                "scaling.policy=null",
                "zk.namespace=/roq-peers",
            ]
            cluster = UpCluster.start(TREE, args.base, "peers-roq", defines)
        with Path(args.out).open("a") as out:
            for turn in range(args.rounds):
                order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
                for payload in (int(p) for p in args.payloads.split(",")):
                    for system in order:
                        if system == "roq":
                            assert cluster is not None
                            result = run_roq(cluster, args, payload)
                        elif system == "nats":
                            result = run_nats(args, payload, turn)
                        else:
                            result = run_redis(args, payload, turn)
                        line = {
                            "system": system,
                            "payload": payload,
                            "round": turn,
                            "rate": args.rate,
                            **result,
                            "load1": os.getloadavg()[0],
                        }
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(json.dumps(line), file=sys.stderr)
    finally:
        if cluster is not None:
            cluster.stop()
        for server in servers:
            server.stop()


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for payload in sorted({r["payload"] for r in rows}):
        mine = [r for r in rows if r["payload"] == payload]
        rate = {(r["system"], r["round"]): r["delivered_msg_s"] for r in mine}
        print(f"{payload} B")
        for system in dict.fromkeys(r["system"] for r in mine):
            runs = [r for r in mine if r["system"] == system]
            p50 = [r["p50_us"] for r in runs if r.get("p50_us") is not None]
            p99 = [r["p99_us"] for r in runs if r.get("p99_us") is not None]
            lost = sum(r.get("lost") or 0 for r in runs)
            line = (
                f"  {system}: median {statistics.median(r['delivered_msg_s'] for r in runs):,.0f}"
                f" msg/s {sorted(r['delivered_msg_s'] for r in runs)}, lost {lost}"
            )
            if p50:
                line += (
                    f", p50 {statistics.median(p50):,.0f} µs, p99 {statistics.median(p99):,.0f} µs"
                )
            if system != "roq":
                ratios = [
                    rate[("roq", t)] / rate[(system, t)]
                    for (s, t) in rate
                    if s == system and ("roq", t) in rate and rate[(system, t)]
                ]
                if ratios:
                    line += f"; roq/{system} per round: median {statistics.median(ratios):.2f}"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run")
    runner.add_argument("--systems", default=",".join(SYSTEMS))
    runner.add_argument("--rounds", type=int, default=3)
    runner.add_argument("--seconds", type=float, default=5.0)
    runner.add_argument("--payloads", default="100,1024")
    runner.add_argument("--rate", type=float, default=0.0, help="msg/s; 0: as fast as possible")
    runner.add_argument("--base", type=int, default=3000, help="roq's ports.base")
    runner.add_argument("--zk-port", type=int, default=2999)
    runner.add_argument("--nats-port", type=int, default=4422)
    runner.add_argument("--redis-port", type=int, default=4479)
    runner.add_argument("--out", default="peers.jsonl")
    commands.add_parser("summarize").add_argument("path", type=Path)
    work = commands.add_parser("worker")
    work.add_argument("--role", required=True)
    work.add_argument("--port", type=int, required=True)
    work.add_argument("--stream", required=True)
    work.add_argument("--subject", default="")
    work.add_argument("--payload", type=int, default=100)
    work.add_argument("--seconds", type=float, default=5.0)
    work.add_argument("--rate", type=float, default=0.0)
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    elif args.command == "summarize":
        summarize(args.path)
    else:
        worker(args)


if __name__ == "__main__":
    main()
