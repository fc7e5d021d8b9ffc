"""Host loss: the time from a host's kill -9 to the first acknowledged publish on the survivors.

Each run starts a fresh cluster on 127.0.0.1 (one ZooKeeper for all runs, then per run its own
namespace, one GCM and --hosts hosts, as the integration tests do): queue q1 with its monitor
and first exchange on h1 and a second exchange on h2 (replicationFactor=2), and an
`acks="leader"` publisher placed on h1's exchange that has published and been acknowledged.
Then h1 is killed with SIGKILL, process group and all (its monitor and exchange die with it),
the publisher sends one more message, and the run's time is from the kill until `flush()`
returns: that message was acknowledged by a live exchange, through the re-placed monitor.

Two timing profiles (--profile):
- `default`: the shipped `zk.session.timeout` (6 s) and `host.loss.grace` (6 s), and the
  shipped heartbeat (500 ms) and stat periods;
- `tests`: the integration tests' short values (session 4 s, grace 500 ms, heartbeat 200 ms).

    PYTHONPATH=appliance .venv/bin/python benchmarks/hostloss_failover.py --profile tests \
        --runs 5 --out benchmarks/results/hostloss-tests.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from roq.client.admin import AdminClient
from roq.client.publisher import Publisher
from roq.local.zkserver import ZooKeeperServer
from roq.testing.cluster import LocalCluster, PortBlocks, wait_for

PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "default": {
        "gcm": {"zk.session.timeout": 6000, "host.loss.grace": 6000},
        "host": {"zk.session.timeout": 6000, "heartbeat.period": 500, "monitor.stat.period": 1000},
    },
    "tests": {
        "gcm": {"zk.session.timeout": 4000, "host.loss.grace": 500},
        "host": {"zk.session.timeout": 4000, "heartbeat.period": 200, "monitor.stat.period": 500},
    },
}


def _fronts(admin: AdminClient) -> dict[str, str]:
    queue = next(q for q in admin.status().queues if q.info.name == "q1")
    return {x.front: x.host for x in queue.exchanges if not x.lost}


def _publisher_on(cluster: LocalCluster, host: str) -> tuple[Publisher, list[Publisher]]:
    """A publisher the monitor placed on `host`'s exchange, and the others made on the way."""
    with cluster.admin() as admin:
        fronts = _fronts(admin)
    others = []
    for _ in range(12):
        pub = Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=1)
        if fronts.get(pub.exchange or "") == host:
            return pub, others
        others.append(pub)
    raise SystemExit(f"no publisher placed on {host}: {fronts}")


def one_run(zk: str, ports: PortBlocks, profile: dict[str, dict[str, Any]], hosts: int) -> float:
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="hostloss-")), zk, ports)
    pubs: list[Publisher] = []
    try:
        cluster.start_gcm(**profile["gcm"])
        extra = {"exchange.max.perhost": 4, "exchange.warmup": 500, **profile["host"]}
        daemons = [cluster.start_host(f"h{n}", **extra) for n in range(1, hosts + 1)]
        cluster.wait_ready(hosts=hosts)
        with cluster.admin() as admin:
            admin.create_queue("q1", "h1")
            admin.create_exchange("q1", "bench-tx-h2", host="h2")
            wait_for(lambda: len(_fronts(admin)) == 2, 15, "q1's two exchanges")
        time.sleep(1.5)  # past exchange.warmup: both exchanges take publishers
        victim, others = _publisher_on(cluster, "h1")
        pubs = [victim, *others]
        victim.send(b"before")
        victim.flush(timeout_s=20)
        cluster.kill(daemons[0])
        killed = time.monotonic()
        victim.send(b"after")
        victim.flush(timeout_s=120)
        took = time.monotonic() - killed
        if victim.moves < 1:
            raise SystemExit("the publisher did not move: the measurement is wrong")
        return took
    finally:
        for pub in pubs:
            try:
                pub.close(timeout_s=5)
            except Exception as error:  # a publisher of the dead host: closing is best effort
                print(f"closing a publisher: {error}")
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="tests")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=3, choices=(2, 3))
    parser.add_argument("--port-base", type=int, default=43000, help="3,000 ports from here")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ports = PortBlocks(args.port_base, args.port_base + 3000)
    server = ZooKeeperServer(Path(tempfile.mkdtemp(prefix="hostloss-zk-")), ports.take(1))
    server.start()
    times = []
    try:
        for run in range(args.runs):
            took = one_run(server.connect_string, ports, PROFILES[args.profile], args.hosts)
            times.append(round(took, 2))
            print(f"run {run + 1}: acknowledged on a survivor {took:.2f} s after the kill")
    finally:
        server.stop()
    result = {"profile": args.profile, "hosts": args.hosts, "settings": PROFILES[args.profile],
              "runs_s": times, "median_s": statistics.median(times)}  # fmt: skip
    print(json.dumps(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
