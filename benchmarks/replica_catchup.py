"""Resident memory of both exchanges while a new replica is back-filled (docs/benchmarks.md §5c).

Needs a running cluster with `replicationFactor=2` and `scaling.policy=null` (the R=2 `roq up`
line of docs/benchmarks.md). The script:

1. makes a fresh queue with one exchange (no peer, so no replica yet);
2. fills that exchange's log with `roq bench` at full rate for `--fill-seconds`;
3. adds a second exchange: the monitor assigns it as the first one's replica, and the leader
   back-fills it from its log (`replication.py`), optionally while a publisher goes on at full
   rate for `--during-seconds` (with `--acks`);
4. samples VmRSS and CPU of both exchanges every `--every` seconds, and the leader's view of
   its replica (acknowledged offset against the log's end) from its control port, until the
   copy has caught up or `--timeout` passed.

    python benchmarks/replica_catchup.py --gcm 127.0.0.1:24000 -q cu1 --namespace roq-bench-r2 \
        --fill-seconds 15 --during-seconds 30 --out benchmarks/results/2026-11-23d/catchup.jsonl

Prints (and appends to `--out`) one JSON line per sample and a summary line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import proc_watch

from roq.client.admin import AdminClient
from roq.protocol.commands import ChildCommand
from roq.protocol.ports import ExchangePort, endpoint_at
from roq.replication import REPLICATION_WINDOW_BYTES
from roq.transport import new_context
from roq.transport.rpc import Requester

ROQ = str(Path(sys.executable).with_name("roq"))
BENCH_TIMEOUT_S = 600


def bench(gcm: str, queue: str, seconds: float, acks: str = "none") -> subprocess.Popen[str]:
    cmd = [ROQ, "bench", "--gcm", gcm, "-q", queue, "--seconds", str(seconds)]
    cmd += ["--payload", "100", "--linger-ms", "2", "--acks", acks]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def bench_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=BENCH_TIMEOUT_S)
    lines = out.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": "no output"}
    result.pop("series", None)
    keys = ("published_msg_s", "delivered_msg_s", "lost", "latency_ms", "error")
    return {k: result.get(k) for k in keys}


def exchange_pids(queue: str, namespace: str) -> dict[int, str]:
    """pid → front port of the queue's exchanges."""
    found = {}
    for pid in proc_watch.pids_matching(f"roq exchange {queue} .*{namespace}"):
        words = proc_watch._cmdline(pid).split()
        if "--port" in words:
            found[pid] = words[words.index("--port") + 1]
    return found


def leader_status(context: Any, port: str) -> dict[str, Any]:
    requester = Requester(context, endpoint_at("127.0.0.1", int(port), ExchangePort.CONTROL), 2000)
    try:
        return dict(requester.request({"CMD": int(ChildCommand.PING)}).get("STATUS", {}))
    finally:
        requester.close()


def sample(
    context: Any, pids: dict[int, str], leader: int, last: dict[int, tuple[float, int]]
) -> dict[str, Any]:
    now = time.monotonic()
    row: dict[str, Any] = {"pids": {}}
    for pid in pids:
        rss, ticks = proc_watch.rss_mb(pid), proc_watch.cpu_ticks(pid)
        if rss is None or ticks is None:
            continue
        before = last.get(pid)
        cpu = 100 * (ticks - before[1]) / proc_watch.TICKS / (now - before[0]) if before else None
        last[pid] = (now, ticks)
        role = "leader" if pid == leader else "replica"
        row["pids"][str(pid)] = {"role": role, "rss_mb": round(rss, 1),
                                 "cpu_pct": None if cpu is None else round(cpu, 1)}  # fmt: skip
    status = leader_status(context, pids[leader])
    replicas = status.get("Replicas") or [{}]
    row.update(log_end=status.get("LogEnd"), acked=replicas[0].get("Acked"),
               in_sync=replicas[0].get("InSync"))  # fmt: skip
    return row


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gcm", default="127.0.0.1:24000")
    parser.add_argument("-q", "--queue", default="cu1")
    parser.add_argument("--namespace", default="roq-bench-r2", help="part of the zk namespace")
    parser.add_argument("--fill-seconds", type=float, default=15)
    parser.add_argument("--during-seconds", type=float, default=0)
    parser.add_argument("--acks", default="none", help="the publisher during the catch-up")
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    sink = open(args.out, "a") if args.out else None  # noqa: SIM115 — closed at the end

    def emit(doc: dict[str, Any]) -> None:
        print(json.dumps(doc), flush=True)
        if sink:
            sink.write(json.dumps(doc) + "\n")

    admin = AdminClient(gcm=args.gcm)
    if admin.queue_exists(args.queue):
        admin.delete_queue(args.queue)
    admin.create_queue(args.queue)
    time.sleep(2.0)
    fill = bench_result(bench(args.gcm, args.queue, args.fill_seconds))
    ((leader, port),) = exchange_pids(args.queue, args.namespace).items()
    context, last = new_context(), {}
    emit({"phase": "filled", "fill": fill, **sample(context, {leader: port}, leader, last)})
    during = None
    if args.during_seconds:
        during = bench(args.gcm, args.queue, args.during_seconds, args.acks)
        time.sleep(2.0)  # placed and publishing before the replica appears
    started = time.monotonic()
    admin.create_exchange(args.queue, uuid.uuid4().hex)
    peak: dict[str, float] = {}
    caught_up_at = None
    while (t := time.monotonic() - started) < args.timeout:
        row = sample(context, exchange_pids(args.queue, args.namespace), leader, last)
        for pid in row["pids"].values():
            peak[pid["role"]] = max(peak.get(pid["role"], 0.0), pid["rss_mb"])
        emit({"phase": "catch-up", "t": round(t, 1), **row})
        behind = (row["log_end"] or 0) - (row["acked"] or 0)
        # caught up: within one replication window of the end (a publisher may be appending)
        if caught_up_at is None and row["in_sync"] and behind <= REPLICATION_WINDOW_BYTES:
            caught_up_at = round(t, 1)
        if caught_up_at is not None and (during is None or during.poll() is not None):
            break
        time.sleep(args.every)
    emit({"phase": "summary", "fill": fill, "during": bench_result(during) if during else None,
          "caught_up_after_s": caught_up_at, "rss_max_mb": peak})  # fmt: skip
    if sink:
        sink.close()


if __name__ == "__main__":
    main(sys.argv[1:])
