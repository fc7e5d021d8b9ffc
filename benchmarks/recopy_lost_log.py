"""How long a gone exchange's 1 GB log takes to have replicationFactor copies again, and the
copy rate (docs/benchmarks.md, "Copying a lost log again").

Each run starts a real ZooKeeper (once), a GCM and two hosts on 127.0.0.1 (replicationFactor=2,
scaling.policy=null), creates q1 with an exchange on each host, stops it, and leaves in h1's
exchange's copy directory a copy of the log of an exchange that no longer exists (`gone-…`):
`--megabytes` of 64 KiB batches in the log format, as replication would have left it. It then
starts q1 again: h1's exchange opens and reports the copy, the monitor lists it as a dead log
with one copy, and (at once since 26 November; after a 5 s grace before) it has h1's
exchange send it to h2's. Times,
from the monitor's STATUS polled every 0.1 s:

- listed: the monitor first lists the gone log (in a real host loss: the re-placed monitor
  has heard from the holder);
- started: the monitor names a target (`ShortLogs`), i.e. listed + up to one
  `monitor.list.period` (2 s);
- complete: the target's report says its copy ends where the source's does (reports every
  `heartbeat.period`, 200 ms here).

Prints one JSON line per run and the medians. The target's copy is then compared with the
source's, byte for byte.

    PYTHONPATH=appliance .venv/bin/python benchmarks/recopy_lost_log.py --runs 5 \\
        --port-base 36000 --megabytes 1024
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from roq.client.live import monitor_status
from roq.local.zkserver import ZooKeeperServer
from roq.log import Log, LogSettings, replica_directory
from roq.log import format as batchfmt
from roq.protocol.messages.control import MonitorStatus
from roq.testing.cluster import LocalCluster, PortBlocks, processes_with, wait_for

GONE = "gone-1"
BATCH_PAYLOADS = 100
PAYLOAD = b"x" * 640  # 100 × 640 B: batches of about 64 KiB


def write_copy(directory: Path, size: int) -> int:
    """A copy of GONE's log holding `size` bytes of whole batches; returns its end."""
    copy = Log.open(directory, LogSettings(memory_bytes=0), name="seeded copy")
    producer, seq = b"\x01" * 16, 0
    try:
        while copy.end_offset < size:
            now = int(time.time() * 1e6)
            batch = batchfmt.encode_batch(
                producer, seq, b"k", [PAYLOAD] * BATCH_PAYLOADS, [now] * BATCH_PAYLOADS
            )
            copy.append(bytearray(batch))
            seq += BATCH_PAYLOADS
        return copy.end_offset
    finally:
        copy.close()


def digest(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.glob("*.log")):
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def _has(pid: int, fragment: str) -> bool:
    try:
        return fragment in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


def run_once(zk: str, ports: PortBlocks, megabytes: int, tmp: Path) -> dict[str, Any]:
    cluster = LocalCluster(tmp, zk, ports)
    try:
        return _measure(cluster, megabytes)
    finally:
        cluster.stop()


def _measure(cluster: LocalCluster, megabytes: int) -> dict[str, Any]:
    cluster.start_gcm()
    settings = {"replicationFactor": 2, "scaling.policy": "null", "exchange.max.perhost": 2}
    cluster.start_host("h1", **settings)
    cluster.start_host("h2", **settings)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
        admin.create_exchange("q1", "recopy-bench", host="h2")
        holder = next(x.exchange_id for x in admin.status().queues[0].exchanges if x.host == "h1")
        admin.stop_queue("q1")
        root = cluster.tmp / "h1" / "log"
        mine = [p for p in processes_with(" q1 --bind ") if _has(p, str(root))]
        wait_for(lambda: not [p for p in mine if Path(f"/proc/{p}").exists()], 30, "q1 stopped")
        source_dir = replica_directory(root, "q1", GONE, holder)
        began = time.monotonic()
        end = write_copy(source_dir, megabytes * 2**20)
        written_s = time.monotonic() - began
        admin.start_queue("q1", "h1")
        monitor_host = admin.status().queues[0].info.monitor_host
    times = _watch(monitor_host, end)
    target = next((cluster.tmp / "h2" / "log" / "_replicas" / "q1").glob(f"{GONE}@*"))
    assert digest(target) == digest(source_dir), "the copy differs from its source"
    copy_s = times["complete"] - times["started"]
    return {
        "bytes": end,
        "seeded_s": round(written_s, 1),
        "listed_to_complete_s": round(times["complete"] - times["listed"], 2),
        "copy_s": round(copy_s, 2),
        "copy_mb_s": round(end / 1e6 / copy_s, 1),
    }


def _watch(monitor_host: str, end: int, timeout_s: float = 600.0) -> dict[str, float]:
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while "complete" not in seen:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete copy within {timeout_s} s: {seen}")
        status = monitor_status(monitor_host, timeout_ms=2000)
        now = time.monotonic()
        if status is not None:
            _note(status, end, now, seen)
        time.sleep(0.1)
    return seen


def _note(status: MonitorStatus, end: int, now: float, seen: dict[str, float]) -> None:
    dead = [c for c in status.copies if c.leader_id == GONE]
    if dead:
        seen.setdefault("listed", now)
    if any(s.leader_id == GONE and s.targets for s in status.short_logs):
        seen.setdefault("started", now)
    if dead and "started" in seen and sum(r.end == end for r in dead[0].replicas) >= 2:
        seen["complete"] = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--port-base", type=int, default=36000)  # uses 1000 ports from here
    args = parser.parse_args()
    ports = PortBlocks(args.port_base, args.port_base + 1000)
    work = Path(tempfile.mkdtemp(prefix="roq-recopy-"))
    zookeeper = ZooKeeperServer(work / "zk", ports.take(1))
    zookeeper.start()
    results = []
    try:
        for n in range(args.runs):
            tmp = work / f"run{n}"
            tmp.mkdir()
            try:
                result = run_once(zookeeper.connect_string, ports, args.megabytes, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        zookeeper.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = {
        key: statistics.median(r[key] for r in results)
        for key in ("listed_to_complete_s", "copy_s", "copy_mb_s")
    }
    print(json.dumps({"runs": len(results), "median": medians}))


if __name__ == "__main__":
    main()
