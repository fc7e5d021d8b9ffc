"""Where a message's time goes (issue 35): py-spy on the exchange, the publisher and the subscriber
of one `roq bench`, flat out, at each payload size, on one `roq up` cluster of this tree (security
on, the default; acks=none; log on, R=1). `profile_dataplane.py` does the sampling; this starts
the cluster, runs it once per size and prints its per-process JSON lines, each tagged with the
payload.

    python benchmarks/profile_cost.py --sizes 100,1024 --seconds 12 \
        --out benchmarks/results/2026-11-27-cost/profile.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from upcluster import UpCluster

TREE = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def profile(cluster: UpCluster, payload: int, seconds: float, extra: list[str]) -> list[dict]:
    queue = f"prof{payload}"
    exchange_port_prefix = str(cluster.base + 1000)[:3]  # the cluster's exchange ports
    command = [
        sys.executable, str(HERE / "profile_dataplane.py"),
        "--exchange-match", f"exchange {queue} .*--port {exchange_port_prefix}",
        "--seconds", str(seconds), "--out", f"/tmp/roq-profile-cost-{payload}", "--",
        "--gcm", f"127.0.0.1:{cluster.base}", "-q", queue, "--seconds", str(seconds + 25),
        "--payload", str(payload), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, env=cluster.env(), capture_output=True, text=True,
                          timeout=seconds + 240, check=False)  # fmt: skip
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise SystemExit(f"profile at {payload} B failed: {done.stderr[-2000:]}")
    return [{"payload": payload, **line} for line in lines]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--base", type=int, default=9000)  # below the ephemeral ports
    parser.add_argument("--zk-port", type=int, default=8999)
    parser.add_argument("-D", dest="define", action="append", default=[], help="key=value")
    parser.add_argument("--bench", default="", help="more roq bench arguments, one string")
    parser.add_argument("--out", default="profile-cost.jsonl")
    args = parser.parse_args(argv)
    defines = [f"zk.servers=127.0.0.1:{args.zk_port}", "http.enabled=false",
               "scaling.policy=null", *args.define]  # fmt: skip
    cluster = UpCluster.start(TREE, args.base, "profile-cost", defines)
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with Path(args.out).open("a") as out:
            for size in (int(s) for s in args.sizes.split(",")):
                for line in profile(cluster, size, args.seconds, args.bench.split()):
                    line["load1"] = os.getloadavg()[0]
                    out.write(json.dumps(line) + "\n")
                    print(json.dumps(line), flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
