"""The thesis's load levels (seed 004, Figure 5.2): N producers × R msg/s × B bytes, one
subscriber, with every exchange of the queue sampled from /proc (CPU, RSS) while it runs.

    python benchmarks/load_levels.py --gcm 127.0.0.1:24000 -q t3 --namespace-match roq-bench-r2 \
        --levels 5,10,20 --rate 3000 --payload 20 --seconds 30 --repeat 3 \
        --out benchmarks/results/load_levels.jsonl

Appends one JSON line per run: the `roq bench` summary (without its series) and, per exchange
pid, the median CPU % and max RSS (MB) of the samples taken while publishers were sending.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_watch import cpu_ticks, pids_matching, rss_mb

ROQ = str(Path(sys.executable).with_name("roq"))
SAMPLE_S = 2.0


def sample_exchanges(pattern: str, stop: threading.Event, into: dict[int, list[Any]]) -> None:
    import os

    ticks_s = os.sysconf("SC_CLK_TCK")
    last: dict[int, tuple[float, int]] = {}
    while not stop.wait(SAMPLE_S):
        now = time.monotonic()
        for pid in pids_matching(pattern):
            rss, ticks = rss_mb(pid), cpu_ticks(pid)
            if rss is None or ticks is None:
                continue
            if pid in last:
                cpu = 100 * (ticks - last[pid][1]) / ticks_s / (now - last[pid][0])
                into.setdefault(pid, []).append((cpu, rss))
            last[pid] = (now, ticks)


def one_run(args: argparse.Namespace, producers: int) -> dict[str, Any]:
    pattern = f"roq exchange {args.queue} .*{args.namespace_match}"
    samples: dict[int, list[Any]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_exchanges, args=(pattern, stop, samples))
    sampler.start()
    cmd = [
        ROQ,
        "bench",
        "--gcm",
        args.gcm,
        "-q",
        args.queue,
        "--publishers",
        str(producers),
        "--rate",
        str(args.rate),
        "--payload",
        str(args.payload),
        "--seconds",
        str(args.seconds),
        "--linger-ms",
        str(args.linger_ms),
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    stop.set()
    sampler.join()
    lines = done.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
    summary.pop("series", None)
    exchanges = {}
    for pid, values in samples.items():
        busy = values[2:-2] or values  # leave out spawn and drain
        exchanges[str(pid)] = {
            "cpu_pct_median": round(statistics.median(v[0] for v in busy), 1),
            "rss_mb_max": round(max(v[1] for v in values), 1),
            "samples": len(values),
        }
    return {
        "producers": producers,
        "cmd": " ".join(cmd),
        "summary": summary,
        "exchanges": exchanges,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gcm", default="127.0.0.1:24000")
    parser.add_argument("-q", "--queue", default="t3")
    parser.add_argument("--namespace-match", default="roq-bench-r2")
    parser.add_argument("--levels", default="5,10,20")
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--payload", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--linger-ms", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/load_levels.jsonl")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.repeat):
        for producers in (int(n) for n in args.levels.split(",")):
            record = {
                "round": round_,
                "load1": __import__("os").getloadavg()[0],
                **one_run(args, producers),
            }
            with out.open("a") as sink:
                sink.write(json.dumps(record) + "\n")
            s = record["summary"]
            print(
                producers,
                s.get("published_msg_s"),
                s.get("delivered_msg_s"),
                s.get("lost"),
                s.get("latency_ms"),
                record["exchanges"],
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
