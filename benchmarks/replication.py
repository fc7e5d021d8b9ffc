"""What replication costs (docs/benchmarks.md §2): one publisher and one subscriber on a queue
with two exchanges, so that with replicationFactor=2 each exchange replicates to the other, for
acks none / leader / all. Run it against a cluster with replicationFactor=1 and one with
replicationFactor=2 (the `roq up` commands are in docs/benchmarks.md), same queue shape:

    python benchmarks/replication.py --gcm 127.0.0.1:19000 --tag r1 -q rep1 --repeat 3 \
        --out benchmarks/results/replication.jsonl
    python benchmarks/replication.py --gcm 127.0.0.1:24000 --tag r2 -q rep2 --repeat 3 \
        --out benchmarks/results/replication.jsonl
    python benchmarks/replication.py --summarize benchmarks/results/replication.jsonl

Appends one JSON line per run: the `roq bench` summary without its series.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from roq.client.admin import AdminClient

ROQ = str(Path(sys.executable).with_name("roq"))
RUN_TIMEOUT_S = 180
ACKS = ("none", "leader", "all")
RESULTS = Path(__file__).resolve().parent / "results"


def prepare(gcm: str, queue: str, exchanges: int) -> None:
    """A fresh queue with `exchanges` exchanges (a replica needs a peer), given time to settle.
    The queue is deleted first: scale-in may have retired an idle exchange of an earlier run."""
    admin = AdminClient(gcm=gcm)
    if admin.queue_exists(queue):
        admin.delete_queue(queue)
    admin.create_queue(queue)
    for _ in range(exchanges - 1):
        admin.create_exchange(queue, uuid.uuid4().hex)
    time.sleep(3.0)  # the monitor hears every exchange, replicas are assigned and caught up


def bench(args: argparse.Namespace, acks: str) -> dict[str, Any]:
    cmd = [ROQ, "bench", "--gcm", args.gcm, "-q", args.queue, "--seconds", str(args.seconds)]
    cmd += ["--payload", str(args.payload), "--linger-ms", str(args.linger_ms), "--acks", acks]
    if args.rate:
        cmd += ["--rate", str(args.rate)]
    load = os.getloadavg()[0]
    try:
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        result = {"error": str(error)}
    result.pop("series", None)
    return {
        "tag": args.tag,
        "acks": acks,
        "rate": args.rate,
        "load1": load,
        "cmd": cmd,
        "result": result,
    }


def run(args: argparse.Namespace) -> None:
    prepare(args.gcm, args.queue, args.exchanges)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.repeat):
        for acks in ACKS:  # interleaved: each acks level sees the same machine load
            record = {**bench(args, acks), "round": round_}
            with out.open("a") as sink:
                sink.write(json.dumps(record) + "\n")
            r = record["result"]
            print(
                args.tag,
                acks,
                r.get("delivered_msg_s"),
                r.get("latency_ms"),
                "lost",
                r.get("lost"),
                "dup",
                r.get("duplicated"),
                flush=True,
            )


def summarize(path: str) -> None:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        groups.setdefault((rec["tag"], rec["rate"], rec["acks"]), []).append(rec["result"])
    for key in sorted(groups, key=str):
        res = [r for r in groups[key] if "error" not in r]
        row = {
            "case": key,
            "n": len(res),
            "published": _median([r["published_msg_s"] for r in res]),
            "delivered": _median([r["delivered_msg_s"] for r in res]),
            "all": [round(r["delivered_msg_s"]) for r in res],
            "lost": [r.get("lost") for r in res],
            "dup": [r.get("duplicated") for r in res],
        }
        for q in ("p50", "p99", "p99.9"):
            row[q] = _median([r["latency_ms"][q] for r in res if r["latency_ms"].get(q)])
        print(json.dumps(row))


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gcm", default="127.0.0.1:24000")
    parser.add_argument("--tag", default="r2")
    parser.add_argument("-q", "--queue", default="rep")
    parser.add_argument("--exchanges", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--linger-ms", type=float, default=2.0)
    parser.add_argument("--rate", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "replication.jsonl"))
    parser.add_argument("--summarize", metavar="FILE")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
