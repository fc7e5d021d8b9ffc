"""Samples processes' resident memory (VmRSS) and CPU from /proc every `--every` seconds.

    python benchmarks/proc_watch.py --match "roq exchange" --seconds 200 --every 10

Prints one JSON line per sample: {"t": s, "pids": {pid: {"rss_mb": .., "cpu_pct": ..}}} and a
last line with each pid's min/max/first/last RSS. CPU is the share of one core used since the
previous sample (utime + stime from /proc/PID/stat).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def pids_matching(pattern: str) -> list[int]:
    found = subprocess.run(
        check=False, args=["pgrep", "-f", pattern], capture_output=True, text=True
    ).stdout
    # the pattern also matches the command lines of this script and of `timeout` around it
    return [int(p) for p in found.split() if "proc_watch" not in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as line:
            return line.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "proc_watch"  # gone: leave it out


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))


def watch(pattern: str, seconds: float, every: float) -> dict[int, list[float]]:
    started = time.monotonic()
    last: dict[int, tuple[float, int]] = {}
    history: dict[int, list[float]] = {}
    while (now := time.monotonic()) - started <= seconds:
        sample: dict[str, Any] = {}
        for pid in pids_matching(pattern):
            rss, ticks = rss_mb(pid), cpu_ticks(pid)
            if rss is None or ticks is None:
                continue
            before = last.get(pid)
            cpu = 100 * (ticks - before[1]) / TICKS / (now - before[0]) if before else None
            last[pid] = (now, ticks)
            history.setdefault(pid, []).append(rss)
            sample[str(pid)] = {
                "rss_mb": round(rss, 1),
                "cpu_pct": None if cpu is None else round(cpu, 1),
            }
        print(json.dumps({"t": round(now - started, 1), "pids": sample}), flush=True)
        time.sleep(max(0.0, every - (time.monotonic() - now)))
    return history


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--match", default="roq exchange")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--every", type=float, default=10)
    args = parser.parse_args(argv)
    history = watch(args.match, args.seconds, args.every)
    summary = {
        str(pid): {
            "first": round(v[0], 1),
            "last": round(v[-1], 1),
            "min": round(min(v), 1),
            "max": round(max(v), 1),
            "samples": len(v),
        }
        for pid, v in history.items()
    }
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
