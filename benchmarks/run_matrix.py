"""Runs the 1-publisher/1-subscriber matrix of docs/benchmarks.md §1–2, interleaved so that the
bare proxy and roq (log off, log on) see the same machine load, and appends one JSON line per
run to a results file. Needs two running clusters (see docs/benchmarks.md for the `roq up`
commands): one with useLog=false, one with useLog=true.

    python benchmarks/run_matrix.py --nolog-gcm 127.0.0.1:22000 --log-gcm 127.0.0.1:19000 \
        --repeat 3 --out benchmarks/results/matrix.jsonl
    python benchmarks/run_matrix.py --summarize benchmarks/results/matrix.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
ROQ = str(Path(PYTHON).with_name("roq"))
RUN_TIMEOUT_S = 180


# Framings: "batched" = linger 2 ms (the default); "unbatched" = linger 0, a send() per message,
# the publisher coalescing what arrives while it is busy; "frame" = batch_bytes 1, a frame per
# message whatever the load. The proxy has two: 100 messages per frame, or 1.
FRAMINGS = ("batched", "unbatched", "frame")


def throughput_cases() -> list[dict[str, Any]]:
    return [
        {"kind": "throughput", "payload": p, "framing": f} for p in (100, 1024) for f in FRAMINGS
    ]


def latency_cases() -> list[dict[str, Any]]:
    return [
        {"kind": "latency", "payload": p, "framing": f} for p in (100, 1024) for f in FRAMINGS[1:]
    ]


def command(system: str, case: dict[str, Any], args: argparse.Namespace) -> list[str]:
    seconds = str(args.seconds if case["kind"] == "throughput" else args.latency_seconds)
    payload = str(case["payload"])
    if system.startswith("proxy"):
        pacing = ["--pacing", "spin" if system == "proxy-spin" else "tick"]
        return [
            PYTHON,
            str(HERE / "proxy_baseline.py"),
            case["kind"],
            "--payload",
            payload,
            "--batch",
            "100" if case["framing"] == "batched" else "1",
            "--seconds",
            seconds,
            "--rate",
            "5000",
            *(pacing if case["kind"] == "latency" else []),
        ]
    gcm = args.log_gcm if system.startswith("roq-log") else args.nolog_gcm
    cmd = [
        ROQ,
        "bench",
        "--gcm",
        gcm,
        "-q",
        f"m{case['payload']}",
        "--seconds",
        seconds,
        "--payload",
        payload,
        "--linger-ms",
        "2" if case["framing"] == "batched" else "0",
    ]
    if case["framing"] == "frame":
        cmd += ["--batch-bytes", "1"]
    if case["kind"] == "latency":
        cmd += ["--rate", "5000"]
    if system == "roq-log-acks":
        cmd += ["--acks", "leader"]
    return cmd


def run_one(system: str, case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    cmd = command(system, case, args)
    load_before = os.getloadavg()[0]
    started = time.time()
    try:
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
        result = json.loads(line)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        result = {"error": str(error)}
    result.pop("series", None)
    return {
        "system": system,
        **case,
        "cmd": " ".join(cmd),
        "started": started,
        "load1": load_before,
        "result": result,
    }


def run(args: argparse.Namespace) -> None:
    cases: list[tuple[str, dict[str, Any]]] = []
    if "throughput" in args.kinds:
        cases += [(s, c) for c in throughput_cases() for s in ("proxy", "roq-nolog", "roq-log")]
    if "latency" in args.kinds:
        # "proxy" is paced like roq bench (1 ms ticks); "proxy-spin" spins to each message's
        # due time, which keeps a CPU awake and flatters it (proxy_baseline.py)
        systems = ("proxy", "proxy-spin", "roq-nolog", "roq-log", "roq-log-acks")
        cases += [(s, c) for c in latency_cases() for s in systems]
    # the proxy has one frame-per-message mode: "unbatched" measures it
    cases = [(s, c) for s, c in cases if not (s.startswith("proxy") and c["framing"] == "frame")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.repeat):
        for system, case in cases:  # rounds interleave the systems: same load for each
            record = run_one(system, case, args)
            record["round"] = round_
            with out.open("a") as sink:
                sink.write(json.dumps(record) + "\n")
            r = record["result"]
            print(
                system,
                case,
                r.get("delivered_msg_s"),
                r.get("latency_ms"),
                r.get("lost"),
                f"load {record['load1']:.1f}",
                flush=True,
            )


def summarize(path: str) -> None:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        key = (rec["kind"], rec["payload"], rec["framing"], rec["system"])
        groups.setdefault(key, []).append(rec)
    for key in sorted(groups):
        recs = groups[key]
        res = [r["result"] for r in recs if "error" not in r["result"]]
        rate = [r["delivered_msg_s"] for r in res]
        lost = [r.get("lost", 0) for r in res]
        row: dict[str, Any] = {
            "n": len(res),
            "delivered_msg_s_median": _median(rate),
            "all": rate,
            "lost": lost,
            "records_per_batch": _median([r.get("records_per_batch", 0) for r in res]),
            "load1": [round(r["load1"], 1) for r in recs],
        }
        if key[0] == "latency":
            for q in ("p50", "p99", "p99.9"):
                row[q] = _median([r["latency_ms"][q] for r in res if r["latency_ms"][q]])
        print(json.dumps({"case": key, **row}))


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nolog-gcm", default="127.0.0.1:22000")
    parser.add_argument("--log-gcm", default="127.0.0.1:19000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--kinds", default="throughput,latency")
    parser.add_argument("--out", default=str(HERE / "results" / "matrix.jsonl"))
    parser.add_argument("--summarize", metavar="FILE")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
