"""Profiles the exchange and the bench's publisher and subscriber while `roq bench` loads them.

Starts `roq bench` (arguments after `--`), waits until its workers send, then runs
`py-spy record --format raw` on the queue's exchange and on both workers at once, and prints,
per process, where the CPU samples went: the share of samples whose innermost Python frame is
each function (self time), and the inclusive share of a few functions of interest. Idle samples
(threads blocked in poll/recv without the GIL) are not counted by py-spy, so the shares say where
busy time goes; `busy` is the fraction of wall time the process was on-CPU in Python.

    python benchmarks/profile_dataplane.py --exchange-match "exchange p1 .*--port 20" \
        --seconds 15 --out /tmp/prof -- --gcm 127.0.0.1:19000 -q p1 --seconds 25 \
        --payload 100 --linger-ms 2
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

PY_SPY = str(Path(sys.executable).with_name("py-spy"))
ROQ = str(Path(sys.executable).with_name("roq"))
RATE_HZ = 200
STARTUP_S = 6.0  # cluster placement + worker start before the load is steady
FIND_TIMEOUT_S = 90.0  # for the exchange and both bench workers to be running
TOP = 15


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def find_pids(bench: subprocess.Popen[str], exchange_match: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for child in children(bench.pid):
        line = cmdline(child)
        for role in ("pub", "sub"):
            if f"bench-worker {role} " in line and role not in found:
                found[role] = child
    out = subprocess.run(["pgrep", "-f", exchange_match], check=False, capture_output=True)
    # the pattern also matches this script's own command line (and `timeout`'s around it)
    pids = [int(p) for p in out.stdout.split() if "roq exchange " in cmdline(int(p))]
    if pids:
        found["exchange"] = pids[0]
    return found


def record(pids: dict[str, int], seconds: float, out: Path) -> dict[str, Path]:
    files = {role: out / f"{role}.txt" for role in pids}
    spies = [
        subprocess.Popen(
            [
                PY_SPY,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                str(RATE_HZ),
                "--format",
                "raw",
                "--output",
                str(files[role]),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
    ]
    for spy in spies:
        spy.wait(seconds + 60)
    return files


def summarize(path: Path, seconds: float) -> dict[str, object]:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        total += count
        self_time[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    if not total:
        return {"samples": 0}
    return {
        "samples": total,
        "busy": round(total / (seconds * RATE_HZ), 2),
        "self_pct": {k: round(100 * v / total, 1) for k, v in self_time.most_common(TOP)},
        "inclusive_pct": {
            k: round(100 * v / total, 1)
            for k, v in inclusive.most_common(60)
            if "roq/" in k or "zmq/" in k
        },
    }


def _short(frame: str) -> str:
    """'func (path/to/roq/x.py:12)' -> 'func (roq/x.py)': one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for anchor in ("/roq/", "/zmq/", "/lib/python"):
        if anchor in path:
            path = anchor.strip("/") + "/" + path.split(anchor, 1)[1]
            break
    return f"{name} ({path})"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exchange-match", required=True, help="pgrep -f pattern")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--out", default="/tmp/roq-profile")
    parser.add_argument("bench", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench_args = [a for a in args.bench if a != "--"]
    bench = subprocess.Popen(
        [ROQ, "bench", *bench_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    time.sleep(STARTUP_S)
    pids = find_pids(bench, args.exchange_match)
    deadline = time.monotonic() + FIND_TIMEOUT_S  # a loaded machine starts the workers late
    while len(pids) < 3 and time.monotonic() < deadline:
        time.sleep(1.0)
        pids = find_pids(bench, args.exchange_match)
    time.sleep(STARTUP_S / 2)  # the workers' own start, then the load is steady
    files = record(pids, args.seconds, out)
    result, _ = bench.communicate(timeout=300)
    for role, path in files.items():
        doc = {"role": role, "pid": pids[role], **summarize(path, args.seconds)}
        print(json.dumps(doc), flush=True)
    print(result.strip().splitlines()[-1] if result.strip() else "{}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
