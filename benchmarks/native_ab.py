"""The compiled batch loops end to end (issue 35): one `roq up` cluster of this tree, and its
clients run alternately with ROQ_PURE_PYTHON=1 (pure) and without (compiled), round by round, the
order turning each round. Two measures per side: `pub_rate.py` (one publisher alone, send_many
of 1,000, linger 2 ms: msg/s and its process's CPU µs per message, which a loaded machine
disturbs less than a rate) and `roq bench` (1 publisher + 1 subscriber process: delivered
msg/s). The cluster's exchange runs the compiled loops throughout (its share is the record
check: a few µs per batch, benchmarks/native_micro.py).

    python benchmarks/native_ab.py --rounds 5 --payloads 100,1024 --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from upcluster import UpCluster

HERE = Path(__file__).resolve().parent
SIDES = {"pure": "1", "compiled": "0"}


def pub_rate(cluster: UpCluster, env: dict[str, str], payload: int, count: int) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "pub_rate.py"), "--gcm", f"127.0.0.1:{cluster.base}",
               "-q", f"n{payload}", "--payload", str(payload), "--count", str(count),
               "--many", "1000", "--linger-ms", "2"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, timeout=300, check=True)
    result: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def bench(cluster: UpCluster, env: dict[str, str], payload: int, seconds: float) -> int:
    command = [sys.executable, "-m", "roq", "bench", "--gcm", f"127.0.0.1:{cluster.base}",
               "--queue", f"b{payload}", "--seconds", str(seconds),
               "--payload", str(payload)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, timeout=300, check=True)
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1])
    assert summary["lost"] == 0 and summary["duplicated"] == 0, summary
    return int(summary["delivered_msg_s"])


def run(args: argparse.Namespace) -> None:
    defines = ["http.enabled=false", "scaling.policy=null", f"zk.servers=127.0.0.1:{args.zk_port}"]
    cluster = UpCluster.start(HERE.parent, args.base, "native-ab", defines)
    try:
        with Path(args.out).open("a") as out:
            for turn in range(args.rounds):
                order = list(SIDES.items())[:: 1 if turn % 2 else -1]
                for payload in (int(p) for p in args.payloads.split(",")):
                    for side, pure in order:
                        env = {**cluster.env(), "ROQ_PURE_PYTHON": pure}
                        row = {"side": side, "payload": payload, "round": turn,
                               **pub_rate(cluster, env, payload, args.count // (payload // 100)),
                               "bench_delivered_msg_s": bench(cluster, env, payload, args.seconds),
                               "load1": os.getloadavg()[0]}  # fmt: skip
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                        print(json.dumps(row), file=sys.stderr)
    finally:
        cluster.stop()


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for payload in sorted({r["payload"] for r in rows}):
        by = {(r["side"], r["round"]): r for r in rows if r["payload"] == payload}
        rounds = sorted({turn for _, turn in by})
        print(f"{payload} B ({len(rounds)} rounds)")
        for field in ("msg_s", "cpu_us_per_msg", "bench_delivered_msg_s"):
            pure = [by[("pure", t)][field] for t in rounds]
            comp = [by[("compiled", t)][field] for t in rounds]
            ratios = sorted(round(c / p, 3) for c, p in zip(comp, pure, strict=True))
            print(f"  {field}: pure {statistics.median(pure):,.2f} compiled "
                  f"{statistics.median(comp):,.2f}; compiled/pure per round: median "
                  f"{statistics.median(ratios):.3f} {ratios}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--payloads", default="100,1024")
    parser.add_argument("--count", type=int, default=300_000, help="messages at 100 B")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--base", type=int, default=17000)
    parser.add_argument("--zk-port", type=int, default=16181)
    parser.add_argument("--out", default="native-ab.jsonl")
    parser.add_argument("--summarize", type=Path)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
