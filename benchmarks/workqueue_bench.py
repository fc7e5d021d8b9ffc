"""Work queues: roq consumer groups beside RabbitMQ and NATS JetStream, in one run, interleaved.

For each system (roq: a consumer group of a queue; RabbitMQ: a durable classic queue, persistent
messages, manual acks, prefetch 1000; NATS JetStream: a work-queue stream with file storage, a
durable pull consumer, explicit acks, fetches of up to 1000), each round measures:

- throughput: --messages messages of 100 B are published first (not timed), then 1, 2 and 4
  consumer processes start together and ack every message (the application acks each one;
  roq batches the acks on the wire, pika and nats-py write one ack frame per message into their
  socket buffers): acknowledged msg/s from the first delivery to the last ack;
- latency: one consumer process while a publisher sends --rate msg/s for --seconds s; each
  payload carries its publish time (time.time()), the consumer takes ack time − publish time;
- redelivery: a consumer process takes 100 messages and never acks; it is killed with -9 and
  the time until a second, running consumer gets the first of them again is measured. roq's
  lease (work.lease.ms) and JetStream's ack_wait are both set to --visibility-s; RabbitMQ
  redelivers when the connection closes;
- burst (issue 29's sharing targets): two consumer processes, already waiting, then small
  messages published at once: (share) 1,000, each acked as soon as it comes: each consumer's
  count; (jobs) 40, each taking a 0.1 s job before its ack: the time from the first publish to
  the 40th ack, and each consumer's count. roq's consumers are `roq work QUEUE --group g` as a
  user runs them (its default --prefetch: 100, and 1 with --exec; the job is `--exec 'sleep
  0.1'`), the messages one batch (one slot), the acks counted by the monitor (`roq group
  show`'s numbers, polled); the other two run this script's worker with the settings above
  (prefetch 1000; fetch(1000), max_ack_pending 100,000) and time.sleep(0.1) before each ack.

Clients are the systems' Python clients (pika, nats-py; `pip install -e '.[bench]'`), the
servers the Debian packages (`apt-get install rabbitmq-server nats-server`): benchmark only, not
part of `make test`. Every process runs on this machine: the numbers compare the three on the
same cores and Python, not absolute capacity.

    PYTHONPATH=appliance .venv/bin/python benchmarks/workqueue_bench.py run --rounds 3 \
        --port-base 49000 --parts latency,redelivery,burst \
        --out benchmarks/results/2026-11-26/workqueue.json

--port-base: 1,000 ports from there; below the kernel's ephemeral range (32768-60999 on Linux)
no outgoing connection of another program can hold one of them (docs/benchmarks.md, "Work
queues on the state log").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAYLOAD = 100
SYSTEMS = ("roq", "rabbitmq", "nats")
BURST_SHARE = 1000  # messages of the burst shared by two idle consumers
BURST_JOBS = 40  # messages of the burst of slow jobs
JOB_S = 0.1  # each slow job


def _small(count: int) -> list[bytes]:
    """A burst's messages: small, distinct and without a newline (`roq work` prints lines)."""
    return [b"b%d" % n for n in range(count)]


def _payload() -> bytes:
    return struct.pack("<d", time.time()).ljust(PAYLOAD, b"x")


def _sent_at(payload: bytes) -> float:
    return float(struct.unpack_from("<d", payload)[0])


# --- workers (separate processes) ----------------------------------------------------------------
class Tally:
    """What a worker saw: first delivery, last ack, count, latencies, first redelivery."""

    def __init__(self, latencies: bool) -> None:
        self.count, self.first, self.last = 0, 0.0, 0.0
        self.latencies: list[float] | None = [] if latencies else None
        self.redelivered_at = 0.0

    def got(self, payload: bytes, redelivered: bool) -> None:
        now = time.time()
        if not self.first:
            self.first = now
        if redelivered and not self.redelivered_at:
            self.redelivered_at = now

    def acked(self, payload: bytes) -> None:
        self.count += 1
        self.last = time.time()
        if self.latencies is not None:
            self.latencies.append((self.last - _sent_at(payload)) * 1000)

    def result(self) -> dict[str, Any]:
        return {
            "count": self.count, "first": self.first, "last": self.last,
            "latencies": self.latencies or [], "redelivered_at": self.redelivered_at,
        }  # fmt: skip


def _job(args: argparse.Namespace) -> None:
    if args.job_s:
        time.sleep(args.job_s)  # the application's work on the message, before its ack


def _ready_then_go(hold: bool) -> None:
    print("ready", flush=True)
    if not hold:
        sys.stdin.readline()  # the parent says go once every worker is connected


def worker_roq(args: argparse.Namespace, tally: Tally) -> None:
    from roq.client.consumer import Consumer

    with Consumer(args.queue, "bench", gcm=args.gcm) as consumer:
        _ready_then_go(args.hold)
        held = 0
        while True:
            delivery = consumer.next(timeout_s=args.idle_s)
            if delivery is None:
                break
            tally.got(delivery.payload, delivery.deliveries > 1)
            if args.hold:
                held += 1
                if held == 1:
                    print("held", flush=True)
                continue
            _job(args)
            delivery.ack()
            tally.acked(delivery.payload)
        consumer.flush()


def worker_rabbitmq(args: argparse.Namespace, tally: Tally) -> None:
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    _ready_then_go(args.hold)
    told = False
    for method, _props, body in channel.consume(args.queue, inactivity_timeout=args.idle_s):
        if method is None:
            break
        tally.got(body, bool(method.redelivered))
        if args.hold:
            if not told:
                print("held", flush=True)
                told = True
            continue
        _job(args)
        channel.basic_ack(method.delivery_tag)
        tally.acked(body)
    connection.close()


async def _nats_worker(args: argparse.Namespace, tally: Tally) -> None:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(f"nats://127.0.0.1:{args.port}")
    js = nc.jetstream()
    sub = await js.pull_subscribe(args.queue, durable="bench", stream=args.queue.upper())
    _ready_then_go(args.hold)
    told = False
    while True:
        try:
            messages = await sub.fetch(1000, timeout=args.idle_s)
        except (NatsTimeout, TimeoutError):
            break
        for msg in messages:
            tally.got(msg.data, msg.metadata.num_delivered > 1)
            if args.hold:
                if not told:
                    print("held", flush=True)
                    told = True
                continue
            if args.job_s:
                await asyncio.sleep(args.job_s)
            await msg.ack()
            tally.acked(msg.data)
    await nc.flush()
    await nc.close()


def worker_main(args: argparse.Namespace) -> None:
    tally = Tally(latencies=args.latencies)
    profile = os.environ.get("WQBENCH_PROFILE")  # a path: the worker runs under cProfile
    if profile:
        import cProfile

        cProfile.runctx("_work(args, tally)", globals(), locals(), f"{profile}.{os.getpid()}")
    else:
        _work(args, tally)
    print("result " + json.dumps(tally.result()), flush=True)


def _work(args: argparse.Namespace, tally: Tally) -> None:
    if args.system == "roq":
        worker_roq(args, tally)
    elif args.system == "rabbitmq":
        worker_rabbitmq(args, tally)
    else:
        asyncio.run(_nats_worker(args, tally))


# --- the systems, as seen by the parent ----------------------------------------------------------
class Roq:
    name = "roq"

    def __init__(self, port_base: int, settings: dict[str, int | str]) -> None:
        from roq.local.zkserver import ZooKeeperServer
        from roq.testing.cluster import LocalCluster, PortBlocks

        ports = PortBlocks(port_base, port_base + 900)
        self.zk = ZooKeeperServer(Path(tempfile.mkdtemp(prefix="wqbench-zk-")), ports.take(1))
        self.zk.start()
        self.cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="wqbench-")),
                                    self.zk.connect_string, ports)  # fmt: skip
        self.cluster.start_gcm()
        self.settings = settings  # HCM.properties overrides (work.slot.messages, ...)
        self.queues = 0
        self.port_waits = 0

    def start(self, visibility_s: float) -> None:
        self.cluster.start_host("h1", **{"work.lease.ms": int(visibility_s * 1000)},
                                **self.settings)  # fmt: skip
        self.cluster.wait_ready(1)

    def new_queue(self) -> str:
        """A queue on h1. Its monitor needs one of the host's 10 monitor port blocks (the test
        cluster's `ports.max.perkind`) that can be bound now: a port of --port-base's range
        may be the local end of another program's connection in TIME_WAIT (the kernel's
        ephemeral range, 32768-60999 here, covers it) for 60 s. Such a refusal is waited out
        (5 s apart, at most 120 s) and counted in `port_waits`."""
        from roq.client.admin import AdminRefused

        self.queues += 1
        name = f"wq{self.queues}"
        deadline = time.monotonic() + 120
        with self.cluster.admin() as admin:
            while True:
                try:
                    admin.create_queue(name, host="h1")
                    return name
                except AdminRefused as error:
                    if "no free" not in str(error) or time.monotonic() > deadline:
                        raise
                    self.port_waits += 1
                    print(f"roq: {name}: {error}; waiting 5 s", flush=True)
                    time.sleep(5)

    def worker_args(self, queue: str) -> list[str]:
        return ["--gcm", self.cluster.gcm, "--queue", queue]

    def publish(self, queue: str, count: int, rate: float = 0.0) -> None:
        from roq.client.publisher import Publisher

        with Publisher(queue, gcm=self.cluster.gcm, acks="leader") as publisher:
            _paced(lambda: publisher.send(_payload()), count, rate)
            publisher.flush(timeout_s=120)

    def burst(self, queue: str, payloads: list[bytes]) -> None:
        """At once, in one batch (so one slot of the group): the case the issue describes."""
        from roq.client.publisher import Publisher

        with Publisher(queue, gcm=self.cluster.gcm, acks="leader", linger_ms=1000) as publisher:
            for payload in payloads:
                publisher.send(payload)
            publisher.flush(timeout_s=60)

    def work(self, queue: str, *extra: str) -> subprocess.Popen[str]:
        """`roq work QUEUE --group g` as a user runs it (its own process, default settings)."""
        command = [sys.executable, "-m", "roq", "work", queue, "--group", "g",
                   "--gcm", self.cluster.gcm, *extra]  # fmt: skip
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip

    @staticmethod
    def group(admin: Any, queue: str) -> Any:
        """Group g of the queue as its monitor sees it (None before its first consumer)."""
        from roq.errors import RoqError

        try:
            return admin.get_group(queue, "g")
        except RoqError:
            return None

    def delete(self, queue: str) -> None:
        with self.cluster.admin() as admin:
            admin.delete_queue(queue)

    def stop(self) -> None:
        self.cluster.stop()
        self.zk.stop()


class Rabbit:
    name = "rabbitmq"

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="wqbench-rabbit-"))
        os.chmod(self.dir, 0o777)  # the Debian wrapper runs the broker as user rabbitmq
        # the broker starts Erlang's port mapper (epmd) unless one runs: stopped with it if so
        found = subprocess.run(["epmd", "-names"], check=False, capture_output=True, timeout=10)
        self.own_epmd = found.returncode != 0  # "cannot connect to local epmd"
        env = {**os.environ, "HOME": str(self.dir), "RABBITMQ_NODENAME": "wqbench@localhost",
               "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(port + 1),
               "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
               "RABBITMQ_LOG_BASE": str(self.dir / "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "plugins"),
               "RABBITMQ_FEATURE_FLAGS_FILE": str(self.dir / "feature_flags"),
               "RABBITMQ_PID_FILE": str(self.dir / "pid")}  # fmt: skip
        with (self.dir / "out.txt").open("wb") as out:
            self.process = subprocess.Popen(
                ["rabbitmq-server"], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.queues = 0
        try:
            _wait(self._connects, 60, "rabbitmq-server")
        except SystemExit:  # e.g. its port still held (TIME_WAIT) by an earlier run: see out.txt
            self.stop()
            raise

    def _connects(self) -> bool:
        import pika

        try:
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port)).close()
            return True
        except pika.exceptions.AMQPError:
            return False

    def start(self, visibility_s: float) -> None:
        pass  # redelivery follows the connection's close

    def _channel(self) -> tuple[Any, Any]:
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        return connection, connection.channel()

    def new_queue(self) -> str:
        self.queues += 1
        name = f"wq{self.queues}"
        connection, channel = self._channel()
        channel.queue_declare(name, durable=True)
        connection.close()
        return name

    def worker_args(self, queue: str) -> list[str]:
        return ["--port", str(self.port), "--queue", queue]

    def publish(self, queue: str, count: int, rate: float = 0.0) -> None:
        import pika

        connection, channel = self._channel()
        persistent = pika.BasicProperties(delivery_mode=2)
        _paced(lambda: channel.basic_publish("", queue, _payload(), persistent), count, rate)
        deadline = time.monotonic() + 120
        while rate == 0 and time.monotonic() < deadline:  # prefill: all queued before the clock
            if channel.queue_declare(queue, passive=True).method.message_count >= count:
                break
            time.sleep(0.1)
        connection.close()

    def burst(self, queue: str, payloads: list[bytes]) -> None:
        import pika

        connection, channel = self._channel()
        persistent = pika.BasicProperties(delivery_mode=2)
        for payload in payloads:
            channel.basic_publish("", queue, payload, persistent)
        connection.close()

    def delete(self, queue: str) -> None:
        connection, channel = self._channel()
        channel.queue_delete(queue)
        connection.close()

    def stop(self) -> None:
        """The wrapper `su`s to user rabbitmq (a session of its own): the broker's pid file
        names the Erlang VM, whose process group is stopped."""
        try:
            broker = int((self.dir / "pid").read_text().split()[0])
            os.killpg(os.getpgid(broker), signal.SIGTERM)
        except (OSError, ValueError, IndexError) as error:
            print(f"rabbitmq: no pid file ({error}); stopping the wrapper only")
        with contextlib.suppress(ProcessLookupError):  # the wrapper may have ended
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)
        deadline = time.monotonic() + 20
        while self.own_epmd and time.monotonic() < deadline:  # it refuses while the VM is named
            told = subprocess.run(["epmd", "-kill"], capture_output=True, text=True, timeout=10,
                                  check=False)  # fmt: skip
            if "Killed" in told.stdout or "Cannot connect" in told.stdout + told.stderr:
                break  # gone now, or none any more
            time.sleep(0.5)


class Nats:
    name = "nats"

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="wqbench-nats-"))
        self.process = subprocess.Popen(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.queues = 0
        self.visibility_s = 30.0
        time.sleep(1.0)

    def start(self, visibility_s: float) -> None:
        self.visibility_s = visibility_s

    async def _js(self, work: Callable[[Any, Any], Any]) -> Any:
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        try:
            return await work(nc, nc.jetstream())
        finally:
            await nc.close()

    def new_queue(self) -> str:
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy

        self.queues += 1
        name = f"wq{self.queues}"

        async def create(_nc: Any, js: Any) -> None:
            await js.add_stream(name=name.upper(), subjects=[name],
                                retention=RetentionPolicy.WORK_QUEUE)  # fmt: skip
            await js.add_consumer(name.upper(), ConsumerConfig(
                durable_name="bench", ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.visibility_s, max_ack_pending=100_000,
            ))  # fmt: skip

        asyncio.run(self._js(create))
        return name

    def worker_args(self, queue: str) -> list[str]:
        return ["--port", str(self.port), "--queue", queue]

    def publish(self, queue: str, count: int, rate: float = 0.0) -> None:
        async def send(nc: Any, js: Any) -> None:
            start = time.monotonic()
            for n in range(count):  # core publishes into the stream's subject, paced
                await nc.publish(queue, _payload())
                if rate:
                    ahead = start + (n + 1) / rate - time.monotonic()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await nc.flush()
            deadline = time.monotonic() + 120
            while rate == 0 and time.monotonic() < deadline:
                info = await js.stream_info(queue.upper())
                if info.state.messages >= count:
                    break
                await asyncio.sleep(0.1)

        asyncio.run(self._js(send))

    def burst(self, queue: str, payloads: list[bytes]) -> None:
        async def send(nc: Any, _js: Any) -> None:
            for payload in payloads:
                await nc.publish(queue, payload)
            await nc.flush()

        asyncio.run(self._js(send))

    def delete(self, queue: str) -> None:
        async def drop(_nc: Any, js: Any) -> None:
            await js.delete_stream(queue.upper())

        asyncio.run(self._js(drop))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _setting(text: str) -> tuple[str, int | str]:
    key, _, value = text.partition("=")
    return key, int(value) if value.lstrip("-").isdigit() else value


def _paced(send: Callable[[], object], count: int, rate: float) -> None:
    start = time.monotonic()
    for n in range(count):
        send()
        if rate:
            ahead = start + (n + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up in {timeout_s} s")
        time.sleep(0.5)


# --- the measurements ----------------------------------------------------------------------------
def _spawn(system: Any, queue: str, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "worker", "--system", system.name,
               *system.worker_args(queue), *extra]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    line = process.stdout.readline() if process.stdout else ""
    if line.strip() != "ready":
        raise SystemExit(f"{system.name} worker did not start: {line!r}")
    return process


def _results(workers: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for worker in workers:
        text, _ = worker.communicate(timeout=600)
        [line] = [x for x in text.splitlines() if x.startswith("result ")]
        out.append(json.loads(line[len("result ") :]))
    return out


def throughput(system: Any, consumers: int, messages: int, idle_s: float) -> dict[str, Any]:
    queue = system.new_queue()
    system.publish(queue, messages)
    workers = [_spawn(system, queue, "--idle-s", str(idle_s)) for _ in range(consumers)]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    results = _results(workers)
    system.delete(queue)
    acked = sum(r["count"] for r in results)
    took = max(r["last"] for r in results) - min(r["first"] for r in results if r["first"])
    return {"acked": acked, "seconds": round(took, 3), "msg_s": round(acked / took),
            "shares": [r["count"] for r in results]}  # fmt: skip


def latency(system: Any, rate: float, seconds: float, idle_s: float) -> dict[str, Any]:
    queue = system.new_queue()
    [worker] = [_spawn(system, queue, "--idle-s", str(idle_s), "--latencies")]
    assert worker.stdin is not None
    worker.stdin.write("go\n")
    worker.stdin.flush()
    system.publish(queue, int(rate * seconds), rate)
    [result] = _results([worker])
    system.delete(queue)
    values = sorted(result["latencies"])
    if not values:
        return {"acked": 0}
    return {"acked": len(values), "p50_ms": round(statistics.median(values), 2),
            "p99_ms": round(values[int(len(values) * 0.99) - 1], 2)}  # fmt: skip


def redelivery(system: Any, visibility_s: float) -> dict[str, Any]:
    queue = system.new_queue()
    system.publish(queue, 100)
    holder = _spawn(system, queue, "--hold", "--idle-s", "600")
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "held":
        raise SystemExit(f"{system.name}: the holder got nothing")
    taker = _spawn(system, queue, "--idle-s", str(visibility_s + 5))
    assert taker.stdin is not None
    taker.stdin.write("go\n")
    taker.stdin.flush()
    time.sleep(0.5)  # the taker is asking
    killed = time.time()
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    [result] = _results([taker])
    system.delete(queue)
    at = result["redelivered_at"]
    return {"redelivered": result["count"], "delay_s": round(at - killed, 3) if at else None}


def _go(workers: list[subprocess.Popen[str]]) -> None:
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()


def _end(workers: list[subprocess.Popen[str]]) -> None:
    """Kill -9 what is still running (a measurement that failed midway)."""
    for worker in workers:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def burst(system: Any, messages: int, job_s: float) -> dict[str, Any]:
    """Two consumers already waiting, then `messages` small ones published at once, each
    acked after a job of `job_s`: from the first publish to the last ack, and who acked what."""
    queue = system.new_queue()
    payloads = _small(messages)
    if system.name == "roq":
        return _burst_roq(system, queue, payloads, job_s)
    idle_s = 3.0 + job_s * messages  # longer than the wait before the burst
    workers = [_spawn(system, queue, "--idle-s", str(idle_s), "--job-s", str(job_s))
               for _ in range(2)]  # fmt: skip
    try:
        _go(workers)
        time.sleep(1.0)  # both consuming (basic.consume sent; a pull request waiting)
        start = time.time()
        system.burst(queue, payloads)
        results = _results(workers)
    finally:
        _end(workers)
    system.delete(queue)
    acked = sum(r["count"] for r in results)
    last = max(r["last"] for r in results)
    return {"acked": acked, "seconds": round(last - start, 3) if acked else None,
            "counts": [r["count"] for r in results]}  # fmt: skip


def _burst_roq(system: Any, queue: str, payloads: list[bytes], job_s: float) -> dict[str, Any]:
    """`roq work` consumers; the time and counts are the monitor's (the acks it holds, per
    consumer), polled every 20 ms (from 80 % of the jobs' ideal time); without a job, what each
    printed is checked against what was sent."""
    job = ["--exec", f"sleep {job_s:g}"] if job_s else []
    timeout_s = 6.0  # each exits after so long without a message
    workers = [system.work(queue, *job, "--timeout", str(timeout_s)) for _ in range(2)]
    try:
        with system.cluster.admin(timeout_ms=2000, retries=1) as admin:

            def joined() -> bool:
                group = system.group(admin, queue)
                return group is not None and len(group.consumers) == 2

            _wait(joined, 30, "two roq work consumers")
            time.sleep(1.0)  # both idle, asking for work
            start = time.time()
            system.burst(queue, payloads)
            published = time.time() - start
            deadline = time.monotonic() + 30 + job_s * len(payloads)
            # no polling (a GCM request and a monitor's answer each) while the jobs surely run
            time.sleep(max(0.0, 0.8 * job_s * len(payloads) / 2 - published))
            group = system.group(admin, queue)
            while (group is None or group.acked < len(payloads)) and time.monotonic() < deadline:
                time.sleep(0.02)
                group = system.group(admin, queue)
            took = time.time() - start
        outputs = [w.communicate(timeout=timeout_s + 30) for w in workers]
    finally:
        _end(workers)
    system.delete(queue)
    acked = group.acked if group else 0
    out: dict[str, Any] = {
        "acked": acked, "seconds": round(took, 3) if acked >= len(payloads) else None,
        "publish_s": round(published, 3),
        "counts": sorted((c.acked for c in group.consumers), reverse=True) if group else [],
        "exit_codes": [w.returncode for w in workers],
    }  # fmt: skip
    if job_s:  # what the jobs alone take, one after another: half of them, as `roq work` runs each
        begin = time.monotonic()
        for _ in range(len(payloads) // 2):
            subprocess.run(["/bin/sh", "-c", f"sleep {job_s:g}"], check=False)
        out["exec_floor_s"] = round(time.monotonic() - begin, 3)
    else:  # each printed line is a message it acked: every one once, none twice
        lines = [stdout.split() for stdout, _ in outputs]
        out["counts"] = [len(printed) for printed in lines]
        out["exact"] = sorted(m for printed in lines for m in printed) == sorted(
            p.decode() for p in payloads
        )
    if any(w.returncode for w in workers):
        out["stderr"] = [stderr[-500:] for _, stderr in outputs]
    return out


def round_of(system: Any, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for consumers in (int(c) for c in args.consumers.split(",")):
        out[f"throughput_{consumers}"] = throughput(system, consumers, args.messages, 2.0)
        print(system.name, consumers, out[f"throughput_{consumers}"], flush=True)
    if "latency" in args.parts:
        out["latency"] = latency(system, args.rate, args.seconds, 3.0)
        print(system.name, "latency", out["latency"], flush=True)
    if "redelivery" in args.parts:
        out["redelivery"] = redelivery(system, args.visibility_s)
        print(system.name, "redelivery", out["redelivery"], flush=True)
    if "burst" in args.parts:
        out["burst_share"] = burst(system, BURST_SHARE, 0.0)
        print(system.name, "burst_share", out["burst_share"], flush=True)
        out["burst_jobs"] = burst(system, BURST_JOBS, JOB_S)
        print(system.name, "burst_jobs", out["burst_jobs"], flush=True)
    return out


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for name in SYSTEMS:
        runs = [r[name] for r in rounds if name in r]
        if not runs:
            continue
        best[name] = {
            f"msg_s_{c}": statistics.median(r[f"throughput_{c}"]["msg_s"] for r in runs)
            for c in (1, 2, 4)
            if f"throughput_{c}" in runs[0]
        }
        if "latency" in runs[0]:
            best[name]["p50_ms"] = statistics.median(r["latency"].get("p50_ms", 0) for r in runs)
            best[name]["p99_ms"] = statistics.median(r["latency"].get("p99_ms", 0) for r in runs)
        if "redelivery" in runs[0]:
            best[name]["redelivery_s"] = statistics.median(
                r["redelivery"]["delay_s"] or 0 for r in runs
            )
        if "msg_s_1" in best[name] and "msg_s_4" in best[name]:
            best[name]["ratio_4_1"] = round(best[name]["msg_s_4"] / best[name]["msg_s_1"], 2)
        if "burst_share" in runs[0]:  # the smaller consumer's share of the 1,000, in %
            best[name]["burst_min_share_pct"] = statistics.median(
                100 * min(r["burst_share"]["counts"], default=0) / BURST_SHARE for r in runs
            )
            best[name]["burst_jobs_s"] = statistics.median(
                r["burst_jobs"]["seconds"] or float("inf") for r in runs
            )
            best[name]["burst_jobs_counts"] = [r["burst_jobs"]["counts"] for r in runs]
    if {"roq", "rabbitmq", "nats"} <= best.keys() and "msg_s_1" in best["roq"]:
        faster = max(best["rabbitmq"]["msg_s_1"], best["nats"]["msg_s_1"])
        best["ratio_1_consumer"] = round(best["roq"]["msg_s_1"] / faster, 2)
        best["ratio_1_consumer_nats"] = round(best["roq"]["msg_s_1"] / best["nats"]["msg_s_1"], 2)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run")
    run.add_argument("--rounds", type=int, default=2)
    run.add_argument("--messages", type=int, default=20_000)
    run.add_argument("--rate", type=float, default=5000.0)
    run.add_argument("--seconds", type=float, default=5.0)
    run.add_argument("--visibility-s", type=float, default=5.0)
    run.add_argument("--systems", default=",".join(SYSTEMS))
    run.add_argument("--consumers", default="1,2,4")
    run.add_argument("--parts", default="latency,redelivery", help="of latency,redelivery,burst")
    run.add_argument("--roq-set", action="append", default=[], metavar="KEY=VALUE",
                     help="a roq host setting, e.g. work.slot.messages=5000 or "
                          "delivery.state=zookeeper")  # fmt: skip
    run.add_argument("--port-base", type=int, default=43000, help="1,000 ports from here")
    run.add_argument("--out", type=Path)
    work = sub.add_parser("worker")
    work.add_argument("--system", choices=SYSTEMS, required=True)
    work.add_argument("--queue", required=True)
    work.add_argument("--gcm", default="")
    work.add_argument("--port", type=int, default=0)
    work.add_argument("--idle-s", type=float, default=2.0)
    work.add_argument("--hold", action="store_true")
    work.add_argument("--latencies", action="store_true")
    work.add_argument("--job-s", type=float, default=0.0, help="sleep so long before each ack")
    args = parser.parse_args()
    if args.mode == "worker":
        worker_main(args)
        return
    makers: dict[str, Callable[[], Any]] = {
        "roq": lambda: Roq(args.port_base, dict(_setting(kv) for kv in args.roq_set)),
        "rabbitmq": lambda: Rabbit(args.port_base + 901),
        "nats": lambda: Nats(args.port_base + 903),
    }
    systems: list[Any] = []
    rounds: list[dict[str, dict[str, Any]]] = []
    failed = ""
    try:
        for name in args.systems.split(","):
            systems.append(makers[name]())  # each one started is stopped below
        for system in systems:
            system.start(args.visibility_s)
        for number in range(args.rounds):
            # interleaved: each round runs every system in turn, so drift hits them alike
            try:
                rounds.append({s.name: round_of(s, args) for s in systems})
            except (Exception, SystemExit) as error:  # the rounds done so far are still written
                failed = f"round {number + 1}: {error!r}"
                print(failed, flush=True)
                break
            print(f"round {number + 1} done", flush=True)
    finally:
        for system in systems:
            system.stop()
    result = {"settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": None},
              "rounds": rounds, "summary": summary(rounds), "failed": failed,
              "roq_port_waits": sum(getattr(s, "port_waits", 0) for s in systems)}  # fmt: skip
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
