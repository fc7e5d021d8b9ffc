"""Restart is resume (issue 17), timed: median of N runs of

  1. `roq up` started again (SIGTERM, then up) on a data directory with Q queues holding
     --mb MB of logs in all, until every queue accepts an acknowledged publish;
  2. a kill -9 of the `roq host` under `roq up`, until every queue accepts a publish again.

    PYTHONPATH=appliance .venv/bin/python benchmarks/restart_resume.py --mb 1024 --runs 5

Prints one JSON line. Ports from --port-base (default 47000) onwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import child_pids, processes_with, wait_for


def _cli(*args: str, input_text: str | None = None, timeout_s: float = 60) -> bool:
    try:
        done = subprocess.run(
            roq_command(*args), env=child_environment(), capture_output=True, text=True,
            input=input_text, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


class Up:
    def __init__(self, data: Path, base: int):
        self.gcm = f"127.0.0.1:{base}"
        values = {
            "zk.servers": f"127.0.0.1:{base + 10}", "ports.base": base, "hcm.port": base + 11,
            "monitor.base.port": base + 100, "statmonitor.base.port": base + 200,
            "exchange.base.port": base + 300, "exchange.max.perhost": 8,
            "zk.namespace": f"/roq-bench-{uuid.uuid4().hex[:8]}",
        }  # fmt: skip
        self.args = ["up", "--data-dir", str(data)]
        for key, value in values.items():
            self.args += ["-D", f"{key}={value}"]
        self.log = data.parent / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                roq_command(*self.args), env=child_environment(), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)

    def host_pid(self) -> int:
        assert self.process is not None
        return next(p for p in child_pids(self.process.pid) if p in processes_with(" host "))


def _alive(pids: set[int]) -> bool:
    return any(Path(f"/proc/{pid}").exists() for pid in pids)


def _all_serve(up: Up, queues: list[str]) -> None:
    for queue in queues:
        wait_for(
            lambda q=queue: _cli(
                "pub", q, "--acks", "leader", "--gcm", up.gcm, input_text="probe\n", timeout_s=5
            ),
            120,
            f"{queue} accepting publishes",
            interval_s=0.05,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=1024, help="MB of logs over all queues")
    parser.add_argument("--queues", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--port-base", type=int, default=47000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="roq-resume-") as tmp:
        up = Up(Path(tmp) / "data", options.port_base)
        up.start()
        wait_for(lambda: _cli("status", "--gcm", up.gcm, timeout_s=5), 60, "roq up ready")
        queues = [f"r{n}" for n in range(options.queues)]
        per_queue = options.mb * 1024 * 1024 // options.queues
        for queue in queues:
            assert _cli("queue", "create", queue, "--gcm", up.gcm)
            count = per_queue // 1000
            assert _cli("pub", queue, "--count", str(count), "--size", "1000", "--acks", "leader",
                        "--gcm", up.gcm, timeout_s=3600)  # fmt: skip
        restart, host_kill = [], []
        try:
            for _ in range(options.runs):
                up.stop()
                began = time.monotonic()
                up.start()
                _all_serve(up, queues)
                restart.append(time.monotonic() - began)
                host = up.host_pid()
                old = set(child_pids(host))  # its monitors and exchanges die with it
                os.kill(host, signal.SIGKILL)
                began = time.monotonic()
                # The probe must not be answered by the old processes: wait until they are gone.
                wait_for(lambda old=old: not _alive(old), 30, "the old children gone")
                _all_serve(up, queues)
                host_kill.append(time.monotonic() - began)
        finally:
            up.stop()
    print(json.dumps({
        "queues": options.queues, "log_mb": options.mb, "runs": options.runs,
        "restart_to_all_publishing_s": restart,
        "restart_median_s": statistics.median(restart),
        "host_kill9_to_all_publishing_s": host_kill,
        "host_kill9_median_s": statistics.median(host_kill),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
