"""A/B of two source trees of roq: the same benchmark, interleaved, each side on its own cluster
running its own code, so that a refactor can be shown to leave the speed where it was.

Each tree gets a one-machine cluster (`roq up`, started with PYTHONPATH=<tree>/appliance, so its
GCM, host, monitor and exchange run that tree's code) and its `roq bench` runs with the same
PYTHONPATH. Runs alternate A, B, A, B, ... and one JSON line per run goes to --out. The first
cluster starts a ZooKeeper on --zk-port; the second uses it, in its own namespace.

    python benchmarks/ab_trees.py --a /work/old --b . --pairs 5 --out results/ab.jsonl
    python benchmarks/ab_trees.py --summarize results/ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PYTHON = sys.executable
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


def env_for(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree.resolve() / "appliance")}


def cluster_args(base: int, namespace: str, zk_port: int, extra: list[str]) -> list[str]:
    ports = {
        "ports.base": base,
        "hcm.port": base + 100,
        "monitor.base.port": base + 500,
        "statmonitor.base.port": base + 800,
        "exchange.base.port": base + 1000,
    }
    defines = [f"{k}={v}" for k, v in ports.items()]
    defines += [f"zk.namespace={namespace}", f"zk.servers=127.0.0.1:{zk_port}", *extra]
    return [arg for define in defines for arg in ("-D", define)]


def start_cluster(
    tree: Path, base: int, name: str, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    data = Path(tempfile.mkdtemp(prefix=f"ab-{name}-"))
    command = [PYTHON, "-m", "roq", "up", "--data-dir", str(data)]
    command += cluster_args(base, f"/roq-ab-{name}", args.zk_port, args.define)
    log = (data / "up.log").open("wb")
    process = subprocess.Popen(
        command, env=env_for(tree), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    wait_ready(tree, base, process)
    return process


def wait_ready(tree: Path, base: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"roq up for {tree} exited with {process.returncode}")
        probe = subprocess.run(
            [PYTHON, "-m", "roq", "status", "--gcm", f"127.0.0.1:{base}"],
            env=env_for(tree),
            capture_output=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0 and b"host" in probe.stdout.lower():
            return
        time.sleep(0.5)
    raise SystemExit(f"the cluster of {tree} was not ready within {READY_TIMEOUT_S} s")


def stop_cluster(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)


def bench(tree: Path, base: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [PYTHON, "-m", "roq", "bench", "--gcm", f"127.0.0.1:{base}"]
    command += ["--seconds", str(args.seconds), "--payload", str(args.payload), *args.bench]
    done = subprocess.run(
        command, env=env_for(tree), capture_output=True, timeout=RUN_TIMEOUT_S, check=False
    )
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench on {tree} failed ({done.returncode}): {done.stderr[-2000:]!r}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(args: argparse.Namespace) -> None:
    trees = {"a": Path(args.a), "b": Path(args.b)}
    bases = {"a": args.base, "b": args.base + args.b_offset}
    clusters = {}
    try:
        for side in ("a", "b"):
            clusters[side] = start_cluster(trees[side], bases[side], side, args)
        with Path(args.out).open("a") as out:
            for pair in range(args.pairs):
                for side in ("a", "b") if pair % 2 == 0 else ("b", "a"):
                    result = bench(trees[side], bases[side], args)
                    line = {"side": side, "tree": str(trees[side]), "pair": pair, **result}
                    line["load1"] = os.getloadavg()[0]
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    print(side, pair, result.get("delivered_msg_s"), file=sys.stderr)
    finally:
        for process in clusters.values():
            stop_cluster(process)


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
