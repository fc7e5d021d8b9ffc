"""Per-message cost (issue 35): several sides, each a source tree with its own `-D` settings on a
one-machine cluster of its own, the same `roq bench` on each, interleaved round by round (the
order turns each round), so every side sees the same machine. A side is NAME=TREE[,key=value...]:

    python benchmarks/cost_ab.py --rounds 5 --seconds 5 --payloads 100,1024 \
        --side main=/work/wt-main --side io2=. --side io1=/work/wt-io1 \
        --side io2-off=.,security=false --out benchmarks/results/2026-11-27-cost/ab.jsonl
    python benchmarks/cost_ab.py --summarize benchmarks/results/2026-11-27-cost/ab.jsonl

`--summarize` prints, per payload, each side's median delivered msg/s and, against the first
side, the median of the per-round ratios (both runs of a ratio are from the same round).
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


def parse_side(text: str) -> tuple[str, Path, list[str]]:
    name, _, rest = text.partition("=")
    tree, *defines = rest.split(",")
    if not name or not tree:
        raise SystemExit(f"--side {text!r}: expected NAME=TREE[,key=value...]")
    return name, Path(tree), defines


def run(args: argparse.Namespace) -> None:
    sides = [parse_side(text) for text in args.side]
    clusters: dict[str, UpCluster] = {}
    try:
        for index, (name, tree, defines) in enumerate(sides):
            base = args.base + index * args.offset
            # a ZooKeeper each: on a loaded machine a side's `ruok` probe of a shared one could
            # time out, and its second ZooKeeper then fail to bind the port
            zk = f"zk.servers=127.0.0.1:{args.zk_port - index}"
            shared = [f"zk.namespace=/roq-cost-{name}", zk,
                      "http.enabled=false", "scaling.policy=null"]  # fmt: skip
            clusters[name] = UpCluster.start(tree, base, f"cost-{name}", [*shared, *defines])
        with Path(args.out).open("a") as out:
            for turn in range(args.rounds):
                order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
                for payload in (int(p) for p in args.payloads.split(",")):
                    for name, _, _ in order:
                        result = bench(clusters[name], payload, args)
                        line = {"side": name, "payload": payload, "round": turn, **result}
                        line["load1"] = os.getloadavg()[0]
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(name, payload, turn, result.get("delivered_msg_s"), file=sys.stderr)
    finally:
        for cluster in clusters.values():
            cluster.stop()


def bench(cluster: UpCluster, payload: int, args: argparse.Namespace) -> dict[str, Any]:
    return cluster.bench(["--queue", f"c{payload}", "--seconds", str(args.seconds),
                          "--payload", str(payload), *args.bench.split()])  # fmt: skip


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    names = list(dict.fromkeys(r["side"] for r in rows))
    for payload in sorted({r["payload"] for r in rows}):
        rate = {(r["side"], r["round"]): r["delivered_msg_s"] for r in rows
                if r["payload"] == payload}  # fmt: skip
        lost = sum(r.get("lost", 0) for r in rows if r["payload"] == payload)
        print(f"{payload} B (lost in all runs: {lost})")
        for name in names:
            mine = sorted(v for (s, _), v in rate.items() if s == name)
            ratios = sorted(
                rate[(name, turn)] / rate[(names[0], turn)]
                for (s, turn) in rate
                if s == name and (names[0], turn) in rate and rate[(names[0], turn)]
            )
            if mine:
                print(f"  {name}: median {statistics.median(mine):,.0f} msg/s, runs {mine}; "
                      f"/{names[0]} per round: median {statistics.median(ratios):.3f} "
                      f"{[round(r, 3) for r in ratios]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", action="append", default=[], help="NAME=TREE[,key=value...]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--payloads", default="100,1024")
    # below the ephemeral range (32768+: a client socket may hold one) and the tests' (21000+)
    parser.add_argument("--base", type=int, default=11000, help="ports.base of the first side")
    parser.add_argument("--offset", type=int, default=2000, help="between sides' ports.base")
    parser.add_argument("--zk-port", type=int, default=10999, help="the first side's; then -1")
    parser.add_argument("--bench", default="", help="more roq bench arguments, one string")
    parser.add_argument("--out", default="cost-ab.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    elif len(args.side) < 2:
        parser.error("give at least two --side")
    else:
        run(args)


if __name__ == "__main__":
    main()
