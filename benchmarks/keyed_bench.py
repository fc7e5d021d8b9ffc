"""Key-ordered consumer groups (issue 33 item 5; docs/benchmarks.md, "Key-ordered groups"):
throughput with 1 and 4 consumers on a queue of two exchanges, beside an ordered group (which
runs each exchange's log on one consumer at a time, so at most two consumers work).

    PYTHONPATH=appliance .venv/bin/python benchmarks/keyed_bench.py [--messages 4000] \
        [--keys 200] [--job-ms 2] [--rounds 2] [--consumers 1,4] [--modes ordered,keyed]

Each measurement has a queue of its own with two exchanges and two publishers, one on each;
--messages messages of 100 B over --keys routing keys are published first (not timed), then
C consumer processes of a new group start together. Each message costs --job-ms of sleep
before its ack (an application's work; 0: acked at once). Acked msg/s is --messages over the
time from the first delivery to the last ack, on the consumers' CLOCK_MONOTONIC (one clock for
the machine). Every process (ZooKeeper, GCM, host, exchanges, monitor, consumers) runs on this
machine: on 2 cores, the consumers' own CPU competes with the monitor's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roq.client.publisher import Publisher
from roq.local.zkserver import ZooKeeperServer
from roq.system.spawn import child_environment
from roq.testing.cluster import LocalCluster, PortBlocks, wait_for

SETTINGS = {"exchange.max.perhost": 8, "exchange.warmup": 200, "scaling.policy": "null"}

# A consumer until `stop` exists; then one line: first delivery, last ack, messages acked.
CONSUMER = """
import os, sys, time
from roq.client.consumer import Consumer
queue, gcm, mode, job_s, out, stop = sys.argv[1:7]
first, last, count = 0.0, 0.0, 0
with Consumer(queue, "g", gcm=gcm, ordered=mode == "ordered",
              key_ordered=mode == "keyed") as consumer:
    while not os.path.exists(stop):
        delivery = consumer.next(timeout_s=0.2)
        if delivery is None:
            continue
        first = first or time.monotonic()
        if float(job_s):
            time.sleep(float(job_s))
        delivery.ack()
        last, count = time.monotonic(), count + 1
    consumer.flush()
with open(out, "w") as lines:
    lines.write(f"{first} {last} {count}\\n")
"""


def _queue(cluster: LocalCluster, name: str) -> list[Publisher]:
    """A queue with two exchanges, and a publisher on each."""
    with cluster.admin() as admin:
        admin.create_queue(name, host="h1")
    first = Publisher(name, gcm=cluster.gcm, acks="leader")
    with cluster.admin() as admin:
        admin.create_exchange(name, f"tx-{name}")
    time.sleep(1.5)  # past its warm-up: placeable
    second = Publisher(name, gcm=cluster.gcm, acks="leader")
    if first.exchange == second.exchange:
        raise RuntimeError(f"{name}: both publishers on {first.exchange}")
    return [first, second]


def _consumer(cluster: LocalCluster, name: str, mode: str, out: Path,
              args: argparse.Namespace) -> subprocess.Popen[bytes]:  # fmt: skip
    command = [sys.executable, "-c", CONSUMER, name, cluster.gcm, mode, str(args.job_ms / 1000),
               str(out), str(out.parent / "stop")]  # fmt: skip
    return subprocess.Popen(command, env=child_environment())


def measure(cluster: LocalCluster, name: str, mode: str, consumers: int,
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    publishers = _queue(cluster, name)
    for n in range(args.messages):
        key = b"k%d" % (n % args.keys)
        publishers[n % 2].send(b"%d" % n + b"." * 96, key)
    for publisher in publishers:
        publisher.close()
    tmp = cluster.tmp / name
    tmp.mkdir()
    procs = [_consumer(cluster, name, mode, tmp / f"c{c}.out", args) for c in range(consumers)]

    def acked() -> int:
        with cluster.admin(timeout_ms=2000, retries=1) as admin:
            return int(admin.get_group(name, "g").acked)

    try:
        wait_for(lambda: acked() >= args.messages, 600, f"{name}: every message acked", 0.5)
    finally:
        (tmp / "stop").touch()
        for proc in procs:
            proc.wait(timeout=60)
    rows = [(tmp / f"c{c}.out").read_text().split() for c in range(consumers)]
    firsts = [float(r[0]) for r in rows if float(r[0])]
    span = max(float(r[1]) for r in rows) - min(firsts)
    counts = sorted((int(r[2]) for r in rows), reverse=True)
    return {"mode": mode, "consumers": consumers, "msg_s": round(args.messages / span),
            "seconds": round(span, 2), "counts": counts}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--job-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--consumers", default="1,4")
    parser.add_argument("--modes", default="ordered,keyed")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roq-keyed-"))
    ports = PortBlocks(46000, 48000)
    zk = ZooKeeperServer(tmp / "zk", ports.take(1))
    zk.start()
    runs: list[dict[str, Any]] = []
    try:
        cluster = LocalCluster(tmp, zk.connect_string, ports)
        cluster.start_gcm()
        cluster.start_host("h1", **SETTINGS)
        cluster.wait_ready()
        n = 0
        for _ in range(args.rounds):  # interleaved: each round measures every case
            for mode in args.modes.split(","):
                for consumers in (int(c) for c in args.consumers.split(",")):
                    n += 1
                    runs.append(measure(cluster, f"k{n}", mode, consumers, args))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
                    with cluster.admin() as admin:
                        admin.delete_queue(f"k{n}")
        cluster.stop()
    finally:
        zk.stop()
    medians = {}
    for run in runs:
        key = f"{run['mode']}/{run['consumers']}"
        medians.setdefault(key, []).append(run["msg_s"])
    json.dump({"runs": runs, "median_msg_s": {k: statistics.median(v) for k, v in medians.items()},
               "args": vars(args)}, sys.stdout, indent=1)  # fmt: skip
    print()


if __name__ == "__main__":
    main()
