"""One fault test's run: the cluster, the queue, the workload process, the nemesis log and the
check at the end. Times in the histories are wall-clock seconds (`time.time()`), so the
workload's and the nemesis's events merge on one time line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from checker import Report, check, load
from faultcluster import SESSION_MS, FaultCluster
from faultnet import Network

from roq.client.live import monitor_status
from roq.system.spawn import child_environment
from roq.testing.cluster import wait_for

WORKLOAD = Path(__file__).with_name("faultload.py")
# The fail-over goal, zk.session.timeout + 5 s, is a speed goal: measured by
# benchmarks/fault_availability.py over repeated runs, not asserted by a timed test (on CI's two
# shared cores one chain of Python starts, a GCM election and a monitor re-placement, ran 9.1 s
# once). The tests assert liveness: every producer acknowledged again within this.
RESUME_GOAL_S = SESSION_MS / 1000 + 5
RESUME_BOUND_S = 3 * RESUME_GOAL_S
PRODUCERS = 3


class FaultRun:
    def __init__(
        self, tmp: Path, net: Network, acks: str = "all", settings: dict[str, Any] | None = None
    ):
        self.tmp, self.acks = tmp, acks
        self.cluster = FaultCluster(net, tmp, settings=dict(settings or {}))
        self.history = tmp / "history.jsonl"
        self.nemesis_log = tmp / "nemesis.jsonl"
        self.stop_file = tmp / "stop"
        self.workload: subprocess.Popen[bytes] | None = None
        self.workload_log = tmp / "workload.log"

    def start(self, log_dirs: dict[str, Path] | None = None) -> None:
        """The cluster, the queue q1 (monitor and an exchange on m1; with replicationFactor 2
        its monitor asks for a second exchange, which the GCM places on a host that runs none
        of q1's, m2 by name: each log is copied on the other), then the workload, running
        until every producer has had acknowledgements."""
        self.cluster.start(log_dirs)
        with self.cluster.admin(timeout_ms=30000) as admin:  # one attempt: a retry would clash
            admin.create_queue("q1", "m1")
        wait_for(self._two_exchanges, 30, f"q1's two exchanges\n{self.cluster.logs()}", 0.3)
        self._start_workload()
        self.wait_acks(after=0.0, count=20)

    def _two_exchanges(self) -> bool:
        with self.cluster.admin() as admin:
            queue = next(q for q in admin.status().queues if q.info.name == "q1")
        return sorted(x.host for x in queue.exchanges) == ["m1", "m2"]

    def _start_workload(self) -> None:
        command = [
            sys.executable, str(WORKLOAD), "--zk", self.cluster.zk_servers,
            "--namespace", self.cluster.namespace, "--history", str(self.history),
            "--stop-file", str(self.stop_file), "--acks", self.acks,
            "--producers", str(PRODUCERS), "--max-s", "200",
        ]  # fmt: skip
        with self.workload_log.open("ab") as log_file:
            self.workload = subprocess.Popen(
                command, env=child_environment(), stdout=log_file, stderr=subprocess.STDOUT
            )

    def oks_after(self, after: float) -> dict[str, int]:
        """Acknowledged publishes per worker completed after `after` (wall clock)."""
        counts: dict[str, int] = {}
        for event in load(self.history):
            if event["type"] == "ok" and event["time"] > after:
                counts[event["worker"]] = counts.get(event["worker"], 0) + 1
        return counts

    def wait_acks(self, after: float, count: int = 5, timeout_s: float = 60.0) -> None:
        """Until every producer had `count` acknowledgements after `after` (or raise)."""
        assert self.workload is not None
        wait_for(
            lambda: (
                self.workload is not None
                and self.workload.poll() is None
                and len(self.oks_after(after)) == PRODUCERS
                and min(self.oks_after(after).values()) >= count
            ),
            timeout_s,
            f"{count} acks from each producer after {after:.1f}\n{self.diagnostics()}",
            0.5,
        )

    def nemesis(self, name: str, phase: str, from_heal: bool = False) -> float:
        now = time.time()
        event = {"type": "nemesis", "name": name, "phase": phase, "time": now}
        with self.nemesis_log.open("a") as log_file:
            log_file.write(json.dumps({**event, "from_heal": from_heal}) + "\n")
        return now

    def finish(self) -> Report:
        """Stop the producers, wait for the read from the beginning, check the history."""
        assert self.workload is not None
        self.stop_file.touch()
        try:
            self.workload.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.workload.kill()
            self.workload.wait(timeout=10)
            raise AssertionError(f"the workload did not finish\n{self.diagnostics()}") from None
        assert self.workload.returncode == 0, self.diagnostics()
        return check(load(self.history, self.nemesis_log))

    def unserved_lost_logs(self, timeout_s: float = 30.0) -> list[str]:
        """q1's lost exchanges whose log is on the disk of their host, back and registered,
        that q1's monitor does not list as readable (its copies, or the keeper the host started
        for it) within `timeout_s`: [] when every one is. Such a log is exactly the cause of the
        rolling restart's loss (issue 30 item 0), whether or not the final read needed it, so
        this fails every run the cause is present, not only the runs it cost messages."""
        missing: list[str] = []

        def served() -> bool:
            missing.clear()
            with self.cluster.admin() as admin:
                status = admin.status()
            queue = next(q for q in status.queues if q.info.name == "q1")
            live = monitor_status(queue.info.monitor_host)
            listed = {c.leader_id for c in live.copies if c.replicas} if live else set()
            hosts = {h.name for h in status.hosts}
            for x in queue.exchanges:
                on_disk = self.tmp / x.host / "log" / "q1" / x.exchange_id
                if x.lost and x.host in hosts and on_disk.is_dir() and x.exchange_id not in listed:
                    missing.append(f"{x.exchange_id} (on {x.host})")
            return not missing

        try:
            wait_for(served, timeout_s, "every lost log readable", 1.0)
        except TimeoutError:
            return missing
        return []

    def diagnostics(self) -> str:
        try:
            workload = self.workload_log.read_text(errors="replace")[-3000:]
        except OSError:
            workload = ""
        return f"--- workload\n{workload}\n{self.cluster.logs()}"

    def close(self) -> None:
        if self.workload is not None and self.workload.poll() is None:
            self.workload.kill()
            self.workload.wait(timeout=10)
        self.cluster.stop()
