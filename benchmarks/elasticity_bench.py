"""Elasticity benchmark (docs/elasticity.md): scale-out reaction time and throughput per exchange
count, on a real local cluster (ZooKeeper, `roq gcm`, `roq host`) on 127.0.0.1.

    .venv/bin/python benchmarks/elasticity_bench.py [--trials 5] [--seconds 8] [--publishers 6]

Prints one JSON document. Reaction: the load (two publishers at ~90 KB/s each, the implicit rule
at 100 KB/s per exchange) is above the threshold from its first message, so the crossing happens
within the first statistics period; the timings are measured from the first message to the scaling
decision (KPI event), to the new exchange running (KPI event) and to the first publisher sending
on the new exchange (the publisher's own state). Throughput: `roq bench` on queues with 1, 2 and 3
exchanges (scaling.policy=null, so nothing changes during a run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from roq.client.publisher import Publisher
from roq.local.zkserver import ZooKeeperServer
from roq.protocol import bsonmsg
from roq.protocol.commands import StatCommand
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, wait_for
from roq.transport import READABLE, Kind, Poller, connect, new_context, open_socket

FAST = {
    "exchange.warmup": 200,
    "exchange.max.throughput": 200_000,
    "scaling.highwater": 0.5,
    "scaling.window.ms": 1000,
    "scaling.cooldown.ms": 3000,
    "scaling.lowwater.ms": 600_000,
}
SHIPPED = {
    "heartbeat.period": 500,
    "monitor.stat.period": 1000,
    "scaling.window.ms": 2000,
    "exchange.warmup": 1000,
}


def _events(endpoint: str, out: list[dict[str, Any]], stop: threading.Event) -> None:
    context = new_context()
    sock = open_socket(context, Kind.SUB, subscribe=b"")
    connect(sock, endpoint)
    poller = Poller()
    poller.register(sock, READABLE)
    while not stop.is_set():
        if poller.poll(20):
            doc = bsonmsg.decode(sock.recv_multipart()[:1])
            if doc["CMD"] == StatCommand.SCALING_EVENT:
                out.append({**doc, "Seen": time.time()})
    sock.close(0)
    context.term()


def reaction_trial(cluster: LocalCluster, queue: str) -> dict[str, float]:
    with cluster.admin() as admin:
        admin.create_queue(queue)
        record = next(q.fields() for q in admin.list_queues() if q.name == queue)
    events: list[dict[str, Any]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_events, args=(record["Stat_Monitor_host"], events, stop))
    watcher.start()
    publishers = [Publisher(queue, gcm=cluster.gcm, linger_ms=1) for _ in range(2)]
    first = publishers[0].exchange
    time.sleep(0.3)
    started = time.time()
    moved_at = None
    while moved_at is None and time.time() - started < 30:
        for publisher in publishers:
            publisher.send(b"x" * 1000)
            publisher.send(b"x" * 1000)
        if any(p.exchange != first for p in publishers):
            moved_at = time.time()
        time.sleep(0.02)
    for publisher in publishers:
        publisher.close()
    stop.set()
    watcher.join()
    with cluster.admin() as admin:
        admin.delete_queue(queue)
    at = {e["Event"]: e["Time"] for e in reversed(events)}
    assert moved_at is not None and "scale_out" in at, events
    return {
        "decision_s": at["scale_out"] - started,
        "exchange_running_s": at["exchange_added"] - started,
        "first_publisher_on_new_s": moved_at - started,
    }


def throughput(cluster: LocalCluster, exchanges: int, args: argparse.Namespace) -> dict[str, Any]:
    queue = f"t{exchanges}"
    with cluster.admin() as admin:
        admin.create_queue(queue)
        for n in range(exchanges - 1):
            admin.create_exchange(queue, f"bench-{queue}-{n}")
        wait_for(
            lambda: (
                sum(len(q.exchanges) for q in admin.status().queues if q.info.name == queue)
                == exchanges
            ),
            30,
            "exchanges",
        )
    time.sleep(1.5)  # past the warm-up: publishers spread over every exchange
    command = ["bench", "--queue", queue, "--publishers", str(args.publishers)]
    command += ["--subscribers", "1", "--seconds", str(args.seconds), "--payload", "100"]
    command += ["--rate", str(args.rate)]
    run = subprocess.run(
        roq_command(*command, "--gcm", cluster.gcm),
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=args.seconds + 120,
        check=True,
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    with cluster.admin() as admin:
        admin.delete_queue(queue)
    keep = ("published_msg_s", "delivered_msg_s", "delivered_MB_s", "lost", "duplicated")
    return {"exchanges": exchanges, **{k: summary[k] for k in keep}, "p50_ms": summary[
        "latency_ms"]["p50"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--publishers", type=int, default=6)
    parser.add_argument("--rate", type=int, default=0, help="msg/s per publisher (0: flat out)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-reaction", action="store_true")
    parser.add_argument(
        "--shipped-timing",
        action="store_true",
        help="heartbeat 500 ms, stat period 1 s, window 2 s, warm-up 1 s (the shipped defaults)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roq-elasticity-"))
    ports = PortBlocks(41000, 45000)
    zk = ZooKeeperServer(tmp / "zk", ports.take(1))
    zk.start()
    result: dict[str, Any] = {}
    try:
        cluster = LocalCluster(tmp, zk.connect_string, ports)
        cluster.start_gcm()
        timing = SHIPPED if args.shipped_timing else {}
        cluster.start_host("h1", **{"exchange.max.perhost": 12, **FAST, **timing})
        cluster.wait_ready()
        if not args.skip_reaction:
            trials = [reaction_trial(cluster, f"r{n}") for n in range(args.trials)]
            result["reaction"] = {
                key: round(statistics.median(t[key] for t in trials), 3) for key in trials[0]
            }
            result["reaction_trials"] = trials
        cluster.stop()
        if not args.skip_throughput:
            print(json.dumps(result), file=sys.stderr, flush=True)  # kept if what follows fails
            (tmp / "tp").mkdir()
            bench = LocalCluster(tmp / "tp", zk.connect_string, ports)
            bench.start_gcm()
            bench.start_host("h2", **{"exchange.max.perhost": 6, "scaling.policy": "null"})
            bench.wait_ready()
            result["throughput"] = [throughput(bench, k, args) for k in (1, 2, 3)]
            bench.stop()
    finally:
        zk.stop()
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
