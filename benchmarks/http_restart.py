"""How long the HTTP gateway takes to serve again after a restart, with a large history behind it
(issue 29: "a gateway restarts in < 2 s with 10 GB of history").

    PYTHONPATH=appliance .venv/bin/python benchmarks/http_restart.py --gib 10 --runs 3 \\
        --out benchmarks/results/http_restart.json

A one-machine cluster (`roq up`, its own ZooKeeper, http.enabled=false) and one `roq http` this
script starts. It registers --topics topics, publishes --gib GiB through the gateway (v2 batch
publishes of --message-kib KiB messages; each topic keeps --max-queue-size of them), subscribes
"s" to every topic near the end and publishes a few more, so each subscriber's next message is a
kept one. Then, --runs times: SIGTERM the gateway (it saves its snapshot), start it again, and
time (from the spawn) until /metrics answers and until every topic's get returns its subscriber's
next message (200, the right text). Once more with the snapshot deleted: the log is read from the
beginning, as every start did before snapshots. Progress on stderr; a JSON summary on stdout
and in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upcluster import PYTHON, UpCluster

TREE = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
REPLAY_TIMEOUT_S = 3600.0  # reading 10 GiB from the beginning, for the comparison
BODY_BYTES_MAX = 15 * 1024 * 1024  # under the gateway's 16 MiB request body


class Gateway:
    def __init__(self, cluster: UpCluster, port: int, zk: str, max_queue_size: int, kib: int):
        self.cluster, self.port = cluster, port
        self.args = [
            PYTHON, "-m", "roq", "http", "-D", f"zk.servers={zk}", "-D", f"http.port={port}",
            "-D", f"directory={cluster.data / 'log'}",
            "-D", f"security.dir={cluster.data / 'security'}",
            "-D", "http.queues=1", "-D", f"maxQueueSize={max_queue_size}",
            "-D", f"maxMsgSize={kib * 1024 + 1024}", "-D", "maxTopics=100000",
        ]  # fmt: skip
        token = subprocess.run(
            [PYTHON, "-m", "roq", "keys", "token"], env=cluster.env(), capture_output=True,
            check=True, timeout=60,
        ).stdout.decode().strip()  # fmt: skip
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=120,
            headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Spawn it; the monotonic time of the spawn."""
        log = (self.cluster.data / "http.log").open("ab")
        spawned = time.monotonic()
        self.process = subprocess.Popen(
            self.args, env=self.cluster.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return spawned

    def wait_metrics(self, timeout_s: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, "roq http exited"
            try:
                answer = self.client.get("/metrics", timeout=2)
                if answer.status_code == 200:
                    return answer.text
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise SystemExit(f"roq http did not answer within {timeout_s} s")

    def read_from_logs(self) -> int:
        found = re.search(r"^roq_http_log_messages_read_total (\S+)$", self.wait_metrics(), re.M)
        return int(float(found.group(1))) if found else -1

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        if self.process.wait(120) != 0:
            raise SystemExit(f"roq http exited {self.process.returncode} on SIGTERM")

    def call(self, path: str, **body: Any) -> tuple[int, dict[str, Any]]:
        answer = self.client.post(path, json=body)
        return answer.status_code, answer.json()


def fill(gateway: Gateway, topics: int, total_bytes: int, kib: int) -> int:
    """Publish about `total_bytes` round-robin over the topics; the messages published."""
    message = "x" * (kib * 1024)
    batch = max(1, min(1000, BODY_BYTES_MAX // len(message)))
    sent = {"messages": 0, "bytes": 0}
    lock = threading.Lock()
    step = max(total_bytes // 20, 1)

    def worker(first: int) -> None:
        n = first
        while True:
            with lock:
                if sent["bytes"] >= total_bytes:
                    return
                before = sent["bytes"]
                sent["bytes"] += batch * len(message)
                sent["messages"] += batch
                if before // step != sent["bytes"] // step:
                    print(f"  filled {sent['bytes'] / 2**30:.2f} GiB", file=sys.stderr)
            status, body = gateway.call(
                "/v2/message/publish", owner="o", topic=f"t{n % topics}", msgs=[message] * batch
            )
            if status != 200:
                raise SystemExit(f"publish: {status} {body}")
            n += 4

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sent["messages"]


def prepare(gateway: Gateway, topics: int, gib: float, kib: int, tail: int) -> dict[str, int]:
    """Topics, history, subscribers, then `tail` messages per topic: what each get expects."""
    for n in range(topics):
        status, body = gateway.call("/v1/topic/register", owner="o", topic=f"t{n}")
        assert status == 200 or "already" in body.get("error", ""), body
    published = fill(gateway, topics, int(gib * 2**30), kib)
    expected = {}
    for n in range(topics):
        status, body = gateway.call("/v1/topic/subscribe", subscriber="s", topic=f"t{n}")
        assert status == 200, body
        expected[f"t{n}"] = body["nextIdx"]
        for m in range(tail):
            gateway.call("/v1/message/publish", owner="o", topic=f"t{n}", msg=f"tail {n} {m}")
    published += topics * tail
    deadline = time.monotonic() + REPLAY_TIMEOUT_S
    while gateway.read_from_logs() < published:  # the index has all of it
        assert time.monotonic() < deadline, "the gateway did not read its own messages"
        time.sleep(0.5)
    return expected


def restart(
    gateway: Gateway, expected: dict[str, int], timeout_s: float, between: Any = None
) -> dict[str, float]:
    """SIGTERM, `between()`, start again; seconds from the spawn to /metrics and to every
    topic's get."""
    gateway.stop()
    if between is not None:
        between()
    spawned = gateway.start()
    gateway.wait_metrics(timeout_s)
    answered = time.monotonic() - spawned
    deadline = spawned + timeout_s
    for topic, index in expected.items():
        while True:
            status, body = gateway.call("/v1/message/get", subscriber="s", topic=topic)
            if status == 200:
                assert body == {"msgIdx": index, "msg": f"tail {topic[1:]} 0"}, body
                break
            assert time.monotonic() < deadline, f"{topic}: {status} {body}"
    served = time.monotonic() - spawned
    return {"metrics_s": round(answered, 3), "served_s": round(served, 3),
            "read_from_logs": gateway.read_from_logs()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=10.0, help="history to publish, GiB")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--message-kib", type=int, default=16)
    parser.add_argument("--max-queue-size", type=int, default=10, help="messages kept per topic")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", type=int, default=47000, help="the cluster's port base")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    zk = f"127.0.0.1:{args.base + 90}"  # outside the GCM's ports (base ..)
    cluster = UpCluster.start(TREE, args.base, "http-restart",
                              ["http.enabled=false", f"zk.servers={zk}"])  # fmt: skip
    gateway = Gateway(cluster, args.base + 80, zk, args.max_queue_size, args.message_kib)
    try:
        gateway.start()
        gateway.wait_metrics()
        print(f"filling {args.gib} GiB over {args.topics} topics", file=sys.stderr)
        expected = prepare(gateway, args.topics, args.gib, args.message_kib, tail=3)
        log_bytes = sum(f.stat().st_size for f in (cluster.data / "log").rglob("*") if f.is_file())
        runs = []
        for run in range(args.runs):
            runs.append(restart(gateway, expected, START_TIMEOUT_S))
            print(f"  restart {run + 1} from the snapshot: {runs[-1]}", file=sys.stderr)
        snapshots = cluster.data / "log" / f".http-{gateway.port}"
        snapshot_bytes = sum(f.stat().st_size for f in snapshots.iterdir())
        replay = restart(gateway, expected, REPLAY_TIMEOUT_S, lambda: shutil.rmtree(snapshots))
        print(f"  restart without a snapshot: {replay}", file=sys.stderr)
        summary = {
            "command": " ".join(sys.argv), "log_bytes": log_bytes,
            "snapshot_bytes": snapshot_bytes, "topics": args.topics,
            "max_queue_size": args.max_queue_size, "message_kib": args.message_kib,
            "from_snapshot": runs,
            "median_served_s": statistics.median(r["served_s"] for r in runs),
            "without_snapshot": replay,
        }  # fmt: skip
        text = json.dumps(summary, indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        if gateway.process is not None and gateway.process.poll() is None:
            os.killpg(gateway.process.pid, signal.SIGTERM)
            gateway.process.wait(60)
        cluster.stop()


if __name__ == "__main__":
    main()
