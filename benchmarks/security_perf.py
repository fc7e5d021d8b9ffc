"""Where CurveZMQ's cost goes (issue 35): `perf record` on every process of a `roq up` cluster and
of its `roq bench` (exchange, publisher, subscriber, all their threads: the Python thread and
libzmq's I/O threads, where CURVE encrypts and decrypts), once with security on and once off,
then the CPU samples by process role and by shared object (libsodium, libzmq, Python, kernel).

    python benchmarks/security_perf.py --payload 1024 --seconds 6 --out /tmp/perf-sec
    # then, e.g.: perf report -i /tmp/perf-sec/on.data --sort comm,dso --stdio

Needs `perf` (linux-tools) and the right to trace the processes (root, or perf_event_paranoid).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

from security_ab import CASES, start_cluster

SETTLE_S = 3.0  # after the bench's workers exist: their imports and connections, not recorded
WORKERS_TIMEOUT_S = 90.0  # a loaded machine's imports take long


def descendants(root: int) -> list[int]:
    """`root` and every process below it, from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children[pid])
    return found


def role(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = b" ".join(args).decode(errors="replace")
    for name in (
        "bench-worker pub",
        "bench-worker sub",
        " exchange ",
        " host",
        " gcm",
        "zookeeper",
    ):
        if name in text:
            return name.strip()
    return "other"


def wait_for_workers(bench: int) -> None:
    """Until the bench's publisher and subscriber processes run (bounded)."""
    deadline = time.monotonic() + WORKERS_TIMEOUT_S
    while time.monotonic() < deadline:
        running = {role(pid) for pid in descendants(bench)}
        if {"bench-worker pub", "bench-worker sub"} <= running:
            return
        time.sleep(0.3)
    raise SystemExit(f"the bench's workers did not start within {WORKERS_TIMEOUT_S} s")


def profile(side: str, args: argparse.Namespace) -> None:
    base = args.base + (0 if side == "on" else args.off_offset)
    cluster = start_cluster(side, base, args.zk_port)
    try:
        command = [sys.executable, "-m", "roq", "bench", "--gcm", f"127.0.0.1:{base}",
                   "--queue", args.case, "--seconds", str(args.seconds),
                   "--payload", str(args.payload), *CASES[args.case]]  # fmt: skip
        bench = subprocess.Popen(command, env=cluster.env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        assert cluster.process is not None
        wait_for_workers(bench.pid)
        time.sleep(SETTLE_S)
        pids = descendants(cluster.process.pid) + descendants(bench.pid)
        data = Path(args.out) / f"{side}.data"
        # perf follows the children started meanwhile (the queue's exchange, the bench's
        # workers); their roles are read while they live
        record = subprocess.Popen(["perf", "record", "-q", "-F", str(args.frequency), "-g",
                                   "-o", str(data), "-p", ",".join(map(str, pids)), "--",
                                   "sleep", str(args.record_s)],
                                  stderr=subprocess.DEVNULL)  # fmt: skip
        roles: dict[int, str] = {}
        while record.poll() is None:
            for pid in descendants(cluster.process.pid) + descendants(bench.pid):
                if roles.get(pid, "?") in ("?", "other"):
                    roles[pid] = role(pid)
            time.sleep(0.3)
        out, _ = bench.communicate(timeout=120)
        (Path(args.out) / f"{side}.roles").write_text(
            "\n".join(f"{pid} {name}" for pid, name in roles.items()) + "\n"
        )
        (Path(args.out) / f"{side}.bench.json").write_bytes(out.splitlines()[-1] if out else b"")
        print(side, out.decode().strip().splitlines()[-1][:300] if out else "no summary")
    finally:
        cluster.stop()


def report(side: str, out: Path) -> None:
    """Samples by (role, shared object), % of the side's samples on the three data-plane roles."""
    roles = dict(line.split(" ", 1) for line in (out / f"{side}.roles").read_text().splitlines())
    text = subprocess.run(["perf", "report", "-i", str(out / f"{side}.data"), "--stdio",
                           "--no-children", "--sort", "pid,dso", "-g", "none",
                           "--percent-limit", "0.3"],
                          capture_output=True, text=True, check=False).stdout  # fmt: skip
    share: dict[tuple[str, str], float] = collections.Counter()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[0].endswith("%"):
            continue
        pid = fields[1].split(":")[0]
        dso = fields[-1]
        for known in ("libsodium", "libzmq", "python", "kernel", "libc", "_zmq", "zlib", "libz"):
            if known in dso:
                dso = known
                break
        share[(roles.get(pid, "?"), dso)] += float(fields[0].rstrip("%"))
    for (who, dso), percent in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"{side:3} {who:18} {dso:28} {percent:5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payload", type=int, default=1024)
    parser.add_argument("--case", default="batched", choices=sorted(CASES))
    parser.add_argument("--seconds", type=float, default=12.0, help="the bench's")
    parser.add_argument("--record-s", type=float, default=3.0)
    parser.add_argument("--frequency", type=int, default=499)
    parser.add_argument("--base", type=int, default=41000)
    parser.add_argument("--off-offset", type=int, default=2000)
    parser.add_argument("--zk-port", type=int, default=2181, help="on's; off's is one above")
    parser.add_argument("--sides", default="on,off")
    parser.add_argument("--out", default="security_perf")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for side in args.sides.split(","):
        if not args.report_only:
            profile(side, args)
        report(side, out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
