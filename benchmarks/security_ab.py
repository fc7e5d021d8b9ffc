"""The cost of CurveZMQ (issue 23): the same `roq bench`, on a cluster with security on and one
with security=off, interleaved on/off, off/on, ... in one run, so both sides see the same
machine load. Cases: 100 B batched and unbatched as fast as possible (throughput), and batched
at 5,000 msg/s (latency p50/p99). One JSON line per run goes to --out.

Both clusters are `roq up` of this tree, each in its own data directory; the secured one writes
its keys there and its bench finds them through ROQ_HOME. Each starts its own ZooKeeper (on at
--zk-port, off at --zk-port + 1): the secured cluster's ZooKeeper speaks TLS only, which the
other could not use. --payload sets the message size of every case (100 B by default).

    python benchmarks/security_ab.py --pairs 3 --out benchmarks/results/security.jsonl
    python benchmarks/security_ab.py --summarize benchmarks/results/security.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
        "zk.servers": f"127.0.0.1:{zk_port + (side == 'off')}",
        "security": "true" if side == "on" else "false",
        "http.enabled": "false",  # its queue would take one of the host's exchange slots
        "exchange.max.perhost": 8,  # one queue per case
    }
    return UpCluster.start(TREE, base, f"sec-ab-{side}", [f"{k}={v}" for k, v in defines.items()])


def cluster_cpu_s(cluster: UpCluster) -> float:
    """User + system CPU seconds of every live process of the cluster (its session)."""
    assert cluster.process is not None
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[3]) == cluster.process.pid:  # its session id
            total += int(fields[11]) + int(fields[12])
    return total / tick


def bench(cluster: UpCluster, case: str, seconds: float, payload: int) -> dict[str, Any]:
    """One bench, and the CPU it cost per delivered message: the cluster's processes' and the
    bench's (its workers, waited for), all threads (Python, libzmq's I/O, where CURVE runs)."""
    before = cluster_cpu_s(cluster), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = cluster.bench(["--queue", case, "--seconds", str(seconds), "--payload",
                            str(payload), *CASES[case]])  # fmt: skip
    after = cluster_cpu_s(cluster), resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after[1].ru_utime + after[1].ru_stime) - (before[1].ru_utime + before[1].ru_stime)
    delivered = max(result.get("delivered", 0), 1)
    result["cpu_us_per_msg"] = {
        "cluster": round((after[0] - before[0]) / delivered * 1e6, 2),
        "clients": round(client / delivered * 1e6, 2),
    }
    return result


def run(args: argparse.Namespace) -> None:
    bases = {"on": args.base, "off": args.base + args.off_offset}
    clusters: dict[str, UpCluster] = {}
    try:
        for side in ("on", "off"):
            clusters[side] = start_cluster(side, bases[side], args.zk_port)
        with Path(args.out).open("a") as out:
            for pair in range(args.pairs):
                for case in args.cases.split(","):
                    for side in ("on", "off") if pair % 2 == 0 else ("off", "on"):
                        result = bench(clusters[side], case, args.seconds, args.payload)
                        line = {"side": side, "case": case, "pair": pair, **result}
                        line["payload"] = args.payload
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
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms{cpu_medians(mine)}"
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


def cpu_medians(rows: list[dict[str, Any]]) -> str:
    """The median CPU µs per delivered message, cluster + clients (lines that have it)."""
    cpu = [r["cpu_us_per_msg"] for r in rows if "cpu_us_per_msg" in r]
    if not cpu:
        return ""
    cluster = statistics.median(c["cluster"] for c in cpu)
    clients = statistics.median(c["clients"] for c in cpu)
    return f"; CPU µs/msg: cluster {cluster:.2f} + clients {clients:.2f} = {cluster + clients:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--base", type=int, default=41000, help="ports.base of the secured one")
    parser.add_argument("--off-offset", type=int, default=2000, help="off's ports.base - on's")
    parser.add_argument("--zk-port", type=int, default=2181, help="on's; off's is one above")
    parser.add_argument("--payload", type=int, default=100, help="bytes per message")
    parser.add_argument("--cases", default=",".join(CASES), help="which cases, comma-separated")
    parser.add_argument("--out", default="security_ab.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(
            f"--cases: no case {', '.join(sorted(unknown))} (there are {', '.join(CASES)})"
        )
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
