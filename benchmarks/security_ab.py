"""The cost of CurveZMQ (issue 23): the same `roq bench`, on a cluster with security on and one
with security=off, interleaved on/off, off/on, ... in one run, so both sides see the same
machine load. Cases: 100 B batched and unbatched as fast as possible (throughput), and batched
at 5,000 msg/s (latency p50/p99). One JSON line per run goes to --out.

Both clusters are `roq up` of this tree, each in its own data directory; the secured one writes
its keys there and its bench finds them through ROQ_HOME. The first cluster starts a ZooKeeper
on --zk-port; the second uses it, in its own namespace.

    python benchmarks/security_ab.py --pairs 3 --out benchmarks/results/security.jsonl
    python benchmarks/security_ab.py --summarize benchmarks/results/security.jsonl
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

TREE = Path(__file__).resolve().parent.parent
CASES = {
    "batched": ["--linger-ms", "2"],
    "unbatched": ["--linger-ms", "0", "--batch-bytes", "1"],
    "rate5000": ["--linger-ms", "2", "--rate", "5000"],
}


def start_cluster(side: str, base: int, zk_port: int) -> UpCluster:
    defines = {
        "zk.namespace": f"/roq-sec-ab-{side}-{os.getpid()}",
        "zk.servers": f"127.0.0.1:{zk_port}",
        "security": "true" if side == "on" else "false",
        "http.enabled": "false",  # its queue would take one of the host's exchange slots
        "exchange.max.perhost": 8,  # one queue per case
    }
    return UpCluster.start(TREE, base, f"sec-ab-{side}", [f"{k}={v}" for k, v in defines.items()])


def bench(cluster: UpCluster, case: str, seconds: float) -> dict[str, Any]:
    return cluster.bench(["--queue", case, "--seconds", str(seconds), "--payload", "100",
                          *CASES[case]])  # fmt: skip


def run(args: argparse.Namespace) -> None:
    bases = {"on": args.base, "off": args.base + args.off_offset}
    clusters: dict[str, UpCluster] = {}
    try:
        for side in ("on", "off"):
            clusters[side] = start_cluster(side, bases[side], args.zk_port)
        with Path(args.out).open("a") as out:
            for pair in range(args.pairs):
                for case in CASES:
                    for side in ("on", "off") if pair % 2 == 0 else ("off", "on"):
                        result = bench(clusters[side], case, args.seconds)
                        line = {"side": side, "case": case, "pair": pair, **result}
                        line["load1"] = os.getloadavg()[0]
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(side, case, pair, result.get("delivered_msg_s"), file=sys.stderr)
    finally:
        for cluster in clusters.values():
            cluster.stop()


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for case in CASES:
        medians = {}
        for side in ("on", "off"):
            mine = [r for r in rows if r["case"] == case and r["side"] == side]
            if not mine:
                continue
            rate = statistics.median(r["delivered_msg_s"] for r in mine)
            p50 = statistics.median(r["latency_ms"]["p50"] for r in mine)
            p99 = statistics.median(r["latency_ms"]["p99"] for r in mine)
            medians[side] = rate
            print(
                f"{case:9} {side:3}: n={len(mine)} delivered msg/s median {rate:,.0f}; "
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )
        pairs = {(r["pair"], r["side"]): r["delivered_msg_s"] for r in rows if r["case"] == case}
        ratios = sorted(
            round(pairs[(p, "on")] / pairs[(p, "off")], 3)
            for p, side in pairs
            if side == "on" and pairs.get((p, "off"))
        )
        if medians.get("off"):
            print(
                f"{case:9} on/off: medians {medians.get('on', 0) / medians['off']:.3f}; "
                f"per pair {ratios}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--base", type=int, default=41000, help="ports.base of the secured one")
    parser.add_argument("--off-offset", type=int, default=2000, help="off's ports.base - on's")
    parser.add_argument("--zk-port", type=int, default=2181)
    parser.add_argument("--out", default="security_ab.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
