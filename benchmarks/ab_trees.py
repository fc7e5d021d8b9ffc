"""A/B of two source trees of roq: the same benchmark, interleaved, each side on its own cluster
running its own code, so that a refactor can be shown to leave the speed where it was.

Each tree gets a one-machine cluster (`roq up`, started with PYTHONPATH=<tree>/appliance, so its
GCM, host, monitor and exchange run that tree's code) and its `roq bench` runs with the same
PYTHONPATH. Runs alternate A, B, A, B, ... and one JSON line per run goes to --out. Each cluster
starts its own ZooKeeper, A on --zk-port and B on --zk-port + 1: a secure cluster's ZooKeeper
admits only that cluster's credential (cluster.json), so two secure clusters cannot share one.

    python benchmarks/ab_trees.py --a /work/old --b . --pairs 5 --out results/ab.jsonl
    python benchmarks/ab_trees.py --summarize results/ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from upcluster import UpCluster


def start_cluster(tree: Path, base: int, name: str, args: argparse.Namespace) -> UpCluster:
    zk_port = args.zk_port + (name == "b")
    defines = [f"zk.namespace=/roq-ab-{name}", f"zk.servers=127.0.0.1:{zk_port}"]
    return UpCluster.start(tree, base, f"ab-{name}", [*defines, *args.define])


def bench(cluster: UpCluster, args: argparse.Namespace, side: str = "a") -> dict[str, Any]:
    only_b = args.b_bench.split() if side == "b" else []  # e.g. "--headers 2": B's load only
    return cluster.bench(["--seconds", str(args.seconds), "--payload", str(args.payload),
                          *only_b, *args.bench])  # fmt: skip


def run(args: argparse.Namespace) -> None:
    trees = {"a": Path(args.a), "b": Path(args.b)}
    bases = {"a": args.base, "b": args.base + args.b_offset}
    clusters: dict[str, UpCluster] = {}
    try:
        for side in ("a", "b"):
            clusters[side] = start_cluster(trees[side], bases[side], side, args)
        with Path(args.out).open("a") as out:
            for pair in range(args.pairs):
                for side in ("a", "b") if pair % 2 == 0 else ("b", "a"):
                    result = bench(clusters[side], args, side)
                    line = {"side": side, "tree": str(trees[side]), "pair": pair, **result}
                    line["load1"] = os.getloadavg()[0]
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    print(side, pair, result.get("delivered_msg_s"), file=sys.stderr)
    finally:
        for cluster in clusters.values():
            cluster.stop()


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for side in ("a", "b"):
        rates = [r["delivered_msg_s"] for r in rows if r["side"] == side]
        p99 = [r["latency_ms"]["p99"] for r in rows if r["side"] == side]
        tree = next((r["tree"] for r in rows if r["side"] == side), "?")
        if rates:
            print(
                f"{side} ({tree}): n={len(rates)} delivered msg/s median "
                f"{statistics.median(rates):,.0f} (min {min(rates):,}, max {max(rates):,}); "
                f"p99 median {statistics.median(p99):.1f} ms"
            )
    a = {r["pair"]: r["delivered_msg_s"] for r in rows if r["side"] == "a"}
    b = {r["pair"]: r["delivered_msg_s"] for r in rows if r["side"] == "b"}
    ratios = [b[p] / a[p] for p in a if p in b and a[p]]
    if ratios:
        print(f"b/a per pair: median {statistics.median(ratios):.3f}, {sorted(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", help="source tree A (its appliance/ goes on PYTHONPATH)")
    parser.add_argument("--b", help="source tree B")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--base", type=int, default=41000, help="ports.base of cluster A")
    parser.add_argument("--b-offset", type=int, default=2000, help="cluster B's ports.base - A's")
    parser.add_argument("--zk-port", type=int, default=2181)
    parser.add_argument("-D", dest="define", action="append", default=[], help="key=value")
    parser.add_argument("--b-bench", default="", help="bench args for side B only, one string")
    parser.add_argument("--bench", nargs=argparse.REMAINDER, default=[], help="more bench args")
    parser.add_argument("--out", default="ab.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
