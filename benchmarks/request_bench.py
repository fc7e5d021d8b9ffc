"""Request/response: roq's Requester/Worker beside NATS request-reply and RabbitMQ RPC, interleaved.

For each system and each number of workers (--workers, separate processes that echo the 100 B
payload back), a round measures:

- latency: --rate requests/s in total for --seconds s, paced (open loop), from --clients client
  processes of --lanes lanes each; a lane takes the next scheduled send time, waits for it, and
  times submit → result (the round trip; a lane that falls behind sends at once, nothing is sent
  after --seconds, and the achieved rate is reported beside);
- maximum: the same lanes unpaced (closed loop, clients × lanes requests in flight) for
  --seconds s: completed requests/s.

The systems: roq (`Requester.call` → `Worker`; the request is a message of the queue published
with acks=all, the task's record and result are stored durably: in the monitor's state log,
`delivery.state=log`, the default), roq-zk (the same with `delivery.state=zookeeper`: znodes),
NATS core request-reply (a queue group of responders; nothing stored), RabbitMQ RPC with direct
reply-to (`amq.rabbitmq.reply-to`; a non-durable request queue, transient messages, manual acks,
prefetch 100; nothing stored) and rabbitmq-durable (the same RPC over a durable request queue,
persistent requests, the requester's publish confirmed: the request is stored, the reply not).
Servers are started and stopped by workqueue_bench.py's helpers.

    PYTHONPATH=appliance .venv/bin/python benchmarks/request_bench.py run --rounds 2 \\
        --out benchmarks/results/request.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workqueue_bench import Nats, Rabbit, Roq  # the servers: started and stopped as there

PAYLOAD = b"x" * 100
SYSTEMS = ("roq", "roq-zk", "nats", "rabbitmq", "rabbitmq-durable")


def _kind(system: str) -> str:
    """The client and worker code a system runs: roq's, NATS's or RabbitMQ's."""
    return system.split("-")[0]


SERVICE = "bench"  # roq's service; NATS's subject; RabbitMQ's request queue


# --- workers (separate processes) ----------------------------------------------------------------
def _ready() -> None:
    print("ready", flush=True)


def worker_roq(args: argparse.Namespace) -> None:
    from roq.client.requests import Worker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bounds = {"concurrency": args.concurrency, "prefetch": args.prefetch or None}
    with Worker(args.queue, SERVICE, lambda payload: payload, gcm=args.gcm, **bounds) as worker:
        _ready()
        worker.run(stop)


def worker_rabbitmq(args: argparse.Namespace) -> None:
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)

    def answer(ch: Any, method: Any, props: Any, body: bytes) -> None:
        reply = pika.BasicProperties(correlation_id=props.correlation_id)  # direct reply-to
        ch.basic_publish("", props.reply_to, body, reply)
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(args.queue, answer)
    _ready()
    channel.start_consuming()


async def _nats_worker(args: argparse.Namespace) -> None:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{args.port}")

    async def answer(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(SERVICE, queue="workers", cb=answer)
    await nc.flush()
    _ready()
    await asyncio.Event().wait()  # until SIGTERM


# --- clients (separate processes) ----------------------------------------------------------------
class Schedule:
    """Send times shared by a process's lanes: `count` at `rate`/s (0: as fast as they go)."""

    def __init__(self, rate: float, seconds: float) -> None:
        self.rate, self.seconds = rate, seconds
        self.start = time.monotonic() + 0.2
        self.count = int(rate * seconds) if rate else 0
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """The next send time, or None when done."""
        with self._lock:
            n, self._next = self._next, self._next + 1
        now = time.monotonic()
        if now > self.start + self.seconds:  # a system behind the rate sends fewer, not longer
            return None
        if self.rate:
            return None if n >= self.count else self.start + n / self.rate
        return max(now, self.start)


class Tally:
    def __init__(self) -> None:
        self.rtts: list[float] = []
        self.failed = 0
        self.first, self.last = 0.0, 0.0
        self._lock = threading.Lock()

    def note(self, sent: float, ok: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if not self.first:
                self.first = sent
            self.last = now
            if ok:
                self.rtts.append((now - sent) * 1000)
            else:
                self.failed += 1

    def result(self) -> dict[str, Any]:
        return {"rtts": self.rtts, "failed": self.failed, "first": self.first, "last": self.last}


def _lane(schedule: Schedule, tally: Tally, call: Callable[[], bool]) -> None:
    while (at := schedule.take()) is not None:
        ahead = at - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        sent = time.monotonic()
        tally.note(sent, call())


def _roq_call(args: argparse.Namespace) -> Callable[[], bool]:
    from roq.client.requests import Requester
    from roq.errors import RoqError

    requester = Requester(args.queue, gcm=args.gcm)  # this lane's thread's own

    def call() -> bool:
        try:
            return requester.call(SERVICE, PAYLOAD, timeout_s=30) == PAYLOAD
        except RoqError:
            return False

    return call


def _rabbit_call(args: argparse.Namespace) -> Callable[[], bool]:
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.port))
    channel = connection.channel()
    got: list[bytes] = []

    def on_reply(_ch: Any, _method: Any, props: Any, body: bytes) -> None:
        if props.correlation_id == wanted[0]:
            got.append(body)

    wanted = [""]
    channel.basic_consume("amq.rabbitmq.reply-to", on_reply, auto_ack=True)
    durable = args.system == "rabbitmq-durable"
    if durable:
        channel.confirm_delivery()  # basic_publish returns once the broker has the request

    def call() -> bool:
        wanted[0], got[:] = uuid.uuid4().hex, []
        props = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=wanted[0],
                                     delivery_mode=2 if durable else 1)  # fmt: skip
        channel.basic_publish("", args.queue, PAYLOAD, props)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            connection.process_data_events(time_limit=1)
        return got == [PAYLOAD]

    return call


def _threaded_client(args: argparse.Namespace, schedule: Schedule, tally: Tally) -> None:
    """Lanes on threads, each connecting on its own thread (roq's sockets, pika's connection
    belong to it) before the clock starts."""
    make = _roq_call if _kind(args.system) == "roq" else _rabbit_call
    connected, go = threading.Barrier(args.lanes + 1), threading.Barrier(args.lanes + 1)

    def lane() -> None:
        call = make(args)
        connected.wait()
        go.wait()
        _lane(schedule, tally, call)

    threads = [threading.Thread(target=lane) for _ in range(args.lanes)]
    for thread in threads:
        thread.start()
    connected.wait(timeout=120)
    print("ready", flush=True)
    sys.stdin.readline()
    schedule.start = time.monotonic() + 0.2
    go.wait(timeout=120)
    for thread in threads:
        thread.join()


async def _nats_client(args: argparse.Namespace, schedule: Schedule, tally: Tally) -> None:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{args.port}")
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    schedule.start = time.monotonic() + 0.2

    async def lane() -> None:
        while (at := schedule.take()) is not None:
            ahead = at - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            sent = time.monotonic()
            try:
                ok = (await nc.request(SERVICE, PAYLOAD, timeout=30)).data == PAYLOAD
            except Exception:  # a timeout or a lost connection: a failed request
                ok = False
            tally.note(sent, ok)

    await asyncio.gather(*(lane() for _ in range(args.lanes)))
    await nc.close()


def client_main(args: argparse.Namespace) -> None:
    schedule, tally = Schedule(args.rate, args.seconds), Tally()
    if _kind(args.system) == "nats":
        asyncio.run(_nats_client(args, schedule, tally))
    else:
        _threaded_client(args, schedule, tally)
    print("result " + json.dumps(tally.result()), flush=True)


def child_main(args: argparse.Namespace) -> None:
    if args.mode == "client":
        client_main(args)
    elif _kind(args.system) == "roq":
        worker_roq(args)
    elif _kind(args.system) == "rabbitmq":
        worker_rabbitmq(args)
    else:
        asyncio.run(_nats_worker(args))


# --- the parent ----------------------------------------------------------------------------------
def _spawn(mode: str, system: str, target: list[str], *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, mode, "--system", system, *target, *extra]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    line = process.stdout.readline() if process.stdout else ""
    if line.strip() != "ready":
        process.kill()
        raise SystemExit(f"{system} {mode} did not start: {line!r}")
    return process


def _measure(system: str, target: list[str], args: argparse.Namespace, rate: float) -> Any:
    """One latency (rate > 0) or maximum (rate 0) run; its merged client results."""
    extra = ["--rate", str(rate / args.clients), "--seconds", str(args.seconds),
             "--lanes", str(args.lanes)]  # fmt: skip
    clients = [_spawn("client", system, target, *extra) for _ in range(args.clients)]
    for client in clients:
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
    results = []
    for client in clients:
        text, _ = client.communicate(timeout=args.seconds + 120)
        [line] = [x for x in text.splitlines() if x.startswith("result ")]
        results.append(json.loads(line[len("result ") :]))
    rtts = sorted(r for result in results for r in result["rtts"])
    took = max(r["last"] for r in results) - min(r["first"] for r in results if r["first"])
    out = {"done": len(rtts), "failed": sum(r["failed"] for r in results),
           "req_s": round(len(rtts) / took) if took > 0 else 0}  # fmt: skip
    if rtts:
        out |= {"p50_ms": round(statistics.median(rtts), 2),
                "p99_ms": round(rtts[max(int(len(rtts) * 0.99) - 1, 0)], 2)}  # fmt: skip
    return out


def _target(system: Any, queue: str) -> list[str]:
    if _kind(system.name) == "roq":
        return ["--gcm", system.cluster.gcm, "--queue", queue]
    return ["--port", str(system.port), "--queue", queue]


def _request_queue(system: Any) -> str:
    if _kind(system.name) == "roq":
        return str(system.new_queue())
    if _kind(system.name) == "rabbitmq":
        durable = system.name == "rabbitmq-durable"
        queue = f"{SERVICE}-durable" if durable else SERVICE
        connection, channel = system._channel()
        channel.queue_declare(queue, durable=durable)  # transient RPC: transient like replies
        channel.queue_purge(queue)
        connection.close()
        return queue
    return SERVICE


def round_of(system: Any, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for count in (int(w) for w in args.workers.split(",")):
        queue = _request_queue(system)
        target = _target(system, queue)
        extra = ("--concurrency", str(args.concurrency), "--prefetch", str(args.prefetch))
        workers = [_spawn("worker", system.name, target, *extra) for _ in range(count)]
        try:
            for name, rate in (("latency", args.rate), ("max", 0.0)):
                out[f"{name}_{count}"] = _measure(system.name, target, args, rate)
                print(system.name, f"{name}_{count}", out[f"{name}_{count}"], flush=True)
        finally:
            for worker in workers:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=30)
        if _kind(system.name) == "roq":
            system.delete(queue)
    return out


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for name in SYSTEMS:
        runs = [r[name] for r in rounds if name in r]
        if runs:
            best[name] = {
                f"{key}_{field}": statistics.median(run[key].get(field, 0) for run in runs)
                for key in runs[0]
                for field in ("p50_ms", "p99_ms", "req_s")
            }
    return best


class _Variant:
    """A second name on a server another system started (and stops)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.server, attribute)

    def start(self, visibility_s: float) -> None:
        pass

    def stop(self) -> None:
        pass


class _RoqHost(_Variant):
    """roq with other host settings: a second host of the same cluster (a process acts as the
    admin of one cluster only: its keys are process-wide), whose queues are created there, so
    their monitors run with its settings (`delivery.state`)."""

    def __init__(self, server: Any, name: str, host: str, settings: dict[str, str]) -> None:
        super().__init__(server)
        self.name, self.host, self.settings = name, host, settings

    def start(self, visibility_s: float) -> None:
        cluster = self.server.cluster
        cluster.start_host(self.host, **{"work.lease.ms": int(visibility_s * 1000)},
                           **self.settings)  # fmt: skip
        self.server.hosts_started = getattr(self.server, "hosts_started", 0) + 1
        cluster.wait_ready(self.server.hosts_started)

    def new_queue(self) -> str:
        self.server.queues += 1
        name = f"wq{self.server.queues}"
        with self.server.cluster.admin() as admin:
            admin.create_queue(name, host=self.host)
        return name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run")
    run.add_argument("--rounds", type=int, default=2)
    run.add_argument("--rate", type=float, default=1000.0)
    run.add_argument("--seconds", type=float, default=5.0)
    run.add_argument("--workers", default="1,4")
    run.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests a roq worker runs at once (the peers' take one at a time)",
    )
    run.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="requests a roq worker holds handed out (0: the group's work.inflight)",
    )
    run.add_argument("--clients", type=int, default=2, help="client processes")
    run.add_argument("--lanes", type=int, default=32, help="requests in flight per client")
    run.add_argument("--systems", default=",".join(SYSTEMS))
    run.add_argument("--port-base", type=int, default=43000, help="2,000 ports from here")
    run.add_argument("--out", type=Path)
    for mode in ("worker", "client"):
        child = sub.add_parser(mode)
        child.add_argument("--system", choices=SYSTEMS, required=True)
        child.add_argument("--queue", required=True)
        child.add_argument("--gcm", default="")
        child.add_argument("--port", type=int, default=0)
        child.add_argument("--rate", type=float, default=0.0)
        child.add_argument("--seconds", type=float, default=5.0)
        child.add_argument("--lanes", type=int, default=1)
        child.add_argument("--concurrency", type=int, default=1)
        child.add_argument("--prefetch", type=int, default=0)
    return parser


class _Systems:
    """The systems asked for, built on shared servers: one RabbitMQ node for both RabbitMQ
    variants (its node name is fixed), one roq cluster for both roq stores (h1 keeps the state
    log, h2 ZooKeeper); `stop` ends every server."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.servers: list[Any] = []
        self._rabbit: Any = None
        self._roq: Any = None
        self.systems = [self._make(name) for name in args.systems.split(",")]

    def _make(self, name: str) -> Any:
        if name in ("roq", "roq-zk"):
            if self._roq is None:
                self._roq = Roq(self.args.port_base, {})
                self.servers.append(self._roq)
            if name == "roq":
                return _RoqHost(self._roq, name, "h1", {})
            return _RoqHost(self._roq, name, "h2", {"delivery.state": "zookeeper"})
        if name.startswith("rabbitmq"):
            if self._rabbit is None:
                self._rabbit = Rabbit(self.args.port_base + 901)
                self.servers.append(self._rabbit)
            variant = _Variant(self._rabbit)
            variant.name = name
            return variant
        nats = Nats(self.args.port_base + 903)
        self.servers.append(nats)
        return nats

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def main() -> None:
    args = _parser().parse_args()
    if args.mode != "run":
        child_main(args)
        return
    built = _Systems(args)
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        for system in built.systems:
            system.start(30.0)  # roq's work.lease.ms: 30 s (no worker is killed here)
        for number in range(args.rounds):
            # interleaved: each round runs every system in turn, so drift hits them alike
            rounds.append({s.name: round_of(s, args) for s in built.systems})
            print(f"round {number + 1} done", flush=True)
    finally:
        built.stop()
    result = {"settings": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds,
              "summary": summary(rounds)}  # fmt: skip
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
