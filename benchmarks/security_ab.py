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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PYTHON = sys.executable
TREE = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
CASES = {
    "batched": ["--linger-ms", "2"],
    "unbatched": ["--linger-ms", "0", "--batch-bytes", "1"],
    "rate5000": ["--linger-ms", "2", "--rate", "5000"],
}


def env_for(side: str, data: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(TREE / "appliance")}
    env.pop("ROQ_CREDENTIALS", None)
    if side == "on":
        env["ROQ_HOME"] = str(data)
        env.pop("ROQ_SECURITY", None)
    else:
        env["ROQ_SECURITY"] = "off"
    return env


def cluster_args(base: int, side: str, zk_port: int) -> list[str]:
    defines = {
        "ports.base": base,
        "hcm.port": base + 100,
        "monitor.base.port": base + 500,
        "statmonitor.base.port": base + 800,
        "exchange.base.port": base + 1000,
        "zk.namespace": f"/roq-sec-ab-{side}-{os.getpid()}",
        "zk.servers": f"127.0.0.1:{zk_port}",
        "security": "true" if side == "on" else "false",
        "http.enabled": "false",  # its queue would take one of the host's exchange slots
        "exchange.max.perhost": 8,  # one queue per case
    }
    return [arg for key, value in defines.items() for arg in ("-D", f"{key}={value}")]


def start_cluster(side: str, base: int, zk_port: int) -> tuple[subprocess.Popen[bytes], Path]:
    data = Path(tempfile.mkdtemp(prefix=f"sec-ab-{side}-"))
    command = [PYTHON, "-m", "roq", "up", "--data-dir", str(data)]
    log = (data / "up.log").open("wb")
    process = subprocess.Popen(
        command + cluster_args(base, side, zk_port),
        env=env_for(side, data),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"roq up ({side}) exited with {process.returncode}: see {data}")
        probe = subprocess.run(
            [PYTHON, "-m", "roq", "status", "--gcm", f"127.0.0.1:{base}"],
            env=env_for(side, data),
            capture_output=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0 and b"host" in probe.stdout.lower():
            return process, data
        time.sleep(0.5)
    raise SystemExit(f"the {side} cluster was not ready within {READY_TIMEOUT_S} s")


def stop_cluster(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)


def bench(side: str, data: Path, base: int, case: str, seconds: float) -> dict[str, Any]:
    command = [PYTHON, "-m", "roq", "bench", "--gcm", f"127.0.0.1:{base}", "--queue", case]
    command += ["--seconds", str(seconds), "--payload", "100", *CASES[case]]
    done = subprocess.run(
        command, env=env_for(side, data), capture_output=True, timeout=RUN_TIMEOUT_S, check=False
    )
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench {case} ({side}) failed: {done.stderr[-2000:]!r}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(args: argparse.Namespace) -> None:
    bases = {"on": args.base, "off": args.base + args.off_offset}
    clusters: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for side in ("on", "off"):
            clusters[side] = start_cluster(side, bases[side], args.zk_port)
        with Path(args.out).open("a") as out:
            for pair in range(args.pairs):
                for case in CASES:
                    for side in ("on", "off") if pair % 2 == 0 else ("off", "on"):
                        result = bench(side, clusters[side][1], bases[side], case, args.seconds)
                        line = {"side": side, "case": case, "pair": pair, **result}
                        line["load1"] = os.getloadavg()[0]
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(side, case, pair, result.get("delivered_msg_s"), file=sys.stderr)
    finally:
        for process, _ in clusters.values():
            stop_cluster(process)


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
