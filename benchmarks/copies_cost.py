"""The cost of copies (issue 30): the same `roq bench` on three one-machine clusters of this
tree, interleaved round by round, each with its own copy settings:

- `r1`: replicationFactor=1 (one exchange, no copy: acks=all is the leader's append);
- `r2-min1`: replicationFactor=2, min.insync.copies=1 (a copy is made, but acks=all confirms
  on the leader alone while the copy is out of sync: the behaviour before min.insync.copies);
- `r2`: replicationFactor=2 with the default min.insync.copies (= 2: acks=all confirms only
  once the copy holds the batch, and is refused rather than confirmed on fewer);
- `r2-follower`: replicationFactor=2, log.followers=1: the copy is held by a log follower, a
  process that takes no publishers, and the queue keeps one exchange.

Each cluster is `roq up` (upcluster.py) on its own ports, with a ZooKeeper of its own on
--zk-port plus its index. Before the rounds a warm-up bench
creates the queue on every cluster and, with replicationFactor 2, the copies floor gives it a
second exchange (on the same host here: one machine), whose copy of the first's log is in sync
before the rounds start (`roq status` shows "copies in sync 2"). Then each round runs every
mode on every cluster, the clusters' order rotating per round. One JSON line per run to --out;
`--summarize FILE` prints medians and the ratios to `r1` within each round.

    PYTHONPATH=appliance .venv/bin/python benchmarks/copies_cost.py --rounds 3 \\
        --out benchmarks/results/2026-11-26/copies_cost.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from upcluster import PYTHON, UpCluster

TREE = Path(__file__).resolve().parent.parent
CONFIGS: dict[str, list[str]] = {
    "r1": ["replicationFactor=1"],
    "r2-min1": ["replicationFactor=2", "min.insync.copies=1"],
    "r2": ["replicationFactor=2"],
    "r2-follower": ["replicationFactor=2", "log.followers=1"],
}
# the exchanges each cluster's queue keeps: its log followers hold copies in place of exchanges
EXCHANGES = {"r1": 1, "r2-min1": 2, "r2": 2, "r2-follower": 1}
# (name, bench arguments): flat out with acks=all and acks=leader, and acks=all at a fixed
# rate, unbatched, for the latency a confirmation costs
MODES: dict[str, list[str]] = {
    "all-flat": ["--acks", "all"],
    "leader-flat": ["--acks", "leader"],
    "all-5k": ["--acks", "all", "--rate", "5000", "--linger-ms", "0"],
}
QUEUE = "copies"
IN_SYNC_TIMEOUT_S = 60.0


def start(name: str, index: int, args: argparse.Namespace) -> UpCluster:
    # A ZooKeeper each: the one `roq up` starts takes TLS with its own cluster's certificates
    # only, so another cluster's `roq up` cannot use it (it probes, fails, and tries to start
    # a second one on the same port)
    zk_port = args.zk_port + index
    defines = [f"zk.namespace=/roq-copies-{name}", f"zk.servers=127.0.0.1:{zk_port}"]
    base = args.base + 2000 * index
    return UpCluster.start(TREE, base, f"copies-{name}", [*defines, *CONFIGS[name]])


def wait_in_sync(cluster: UpCluster, copies: int, exchanges: int) -> None:
    """Until `roq status` shows `exchanges` exchanges of the queue with `copies` copies in
    sync."""
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    status = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            [PYTHON, "-m", "roq", "status", "--gcm", f"127.0.0.1:{cluster.base}"],
            env=cluster.env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        status = done.stdout
        if status.count(f"copies in sync {copies}") >= exchanges:
            return
        time.sleep(0.5)
    raise SystemExit(f"{cluster.data}: not {copies} copies in sync within the bound:\n{status}")


def bench(cluster: UpCluster, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    more = ["--seconds", str(args.seconds), "--payload", str(args.payload), "-q", QUEUE]
    return cluster.bench([*more, *MODES[mode]])


def run(args: argparse.Namespace) -> None:
    clusters: dict[str, UpCluster] = {}
    try:
        for index, name in enumerate(CONFIGS):
            clusters[name] = start(name, index, args)
        for name, cluster in clusters.items():
            cluster.bench(["--seconds", "2", "-q", QUEUE, "--acks", "leader"])  # creates it
            if name != "r1":
                wait_in_sync(cluster, 2, EXCHANGES[name])
        names = list(CONFIGS)
        with Path(args.out).open("a") as out:
            for round_ in range(args.rounds):
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                for mode in MODES:
                    for name in order:
                        result = bench(clusters[name], mode, args)
                        line = {"config": name, "mode": mode, "round": round_, **result}
                        line["load1"] = os.getloadavg()[0]
                        line.pop("series", None)
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(round_, mode, name, result.get("delivered_msg_s"),
                              result.get("latency_ms", {}).get("p50"), file=sys.stderr)  # fmt: skip
    finally:
        for cluster in clusters.values():
            cluster.stop()


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for mode in MODES:
        print(f"{mode}:")
        base = {r["round"]: r["delivered_msg_s"] for r in rows
                if r["mode"] == mode and r["config"] == "r1"}  # fmt: skip
        for name in CONFIGS:
            mine = [r for r in rows if r["mode"] == mode and r["config"] == name]
            if not mine:
                continue
            rates = [r["delivered_msg_s"] for r in mine]
            p50 = [r["latency_ms"]["p50"] for r in mine]
            p99 = [r["latency_ms"]["p99"] for r in mine]
            ratios = [r["delivered_msg_s"] / base[r["round"]] for r in mine if base.get(r["round"])]
            print(f"  {name:8} msg/s median {statistics.median(rates):>11,.0f} "
                  f"(runs {', '.join(f'{x:,.0f}' for x in rates)}); p50 "
                  f"{statistics.median(p50):.2f} ms, p99 {statistics.median(p99):.2f} ms; "
                  f"÷ r1 per round {statistics.median(ratios):.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--base", type=int, default=45000, help="ports.base of the first cluster")
    parser.add_argument("--zk-port", type=int, default=44990)
    parser.add_argument("--out", default="copies_cost.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
