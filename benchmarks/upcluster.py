"""One-machine clusters for the A/B benchmarks (ab_trees.py, security_ab.py): `roq up` of a source
tree in a data directory of its own, ready once `roq status` names a host, and `roq bench` against
it. Each cluster's clients find its credentials through ROQ_HOME (its data directory), so two
secured clusters side by side never use each other's keys.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PYTHON = sys.executable
READY_TIMEOUT_S = 240.0  # a loaded 2-core machine takes minutes
RUN_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


def port_defines(base: int) -> dict[str, int]:
    """Every port kind of a cluster at `base`; two clusters 2,000 apart never overlap."""
    return {
        "ports.base": base,
        "hcm.port": base + 100,
        "monitor.base.port": base + 500,
        "statmonitor.base.port": base + 800,
        "exchange.base.port": base + 1000,
    }


@dataclass
class UpCluster:
    tree: Path  # its appliance/ is the PYTHONPATH of the cluster and of its clients
    base: int
    data: Path
    secure: bool = True
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, tree: Path, base: int, name: str, defines: list[str]) -> UpCluster:
        """`roq up -D define...` (each "key=value"), waited for until ready."""
        data = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        secure = not {"security=false", "security=off"} & set(defines)
        cluster = cls(tree.resolve(), base, data, secure=secure)
        command = [PYTHON, "-m", "roq", "up", "--data-dir", str(data)]
        for define in [*(f"{k}={v}" for k, v in port_defines(base).items()), *defines]:
            command += ["-D", define]
        with (data / "up.log").open("wb") as log:
            cluster.process = subprocess.Popen(
                command, env=cluster.env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            cluster.wait_ready()
        except BaseException:
            cluster.stop()  # not left running (with its ZooKeeper) after a failed start
            raise
        return cluster

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(self.tree / "appliance")}
        env.pop("ROQ_CREDENTIALS", None)
        if self.secure:
            env["ROQ_HOME"] = str(self.data)
            env.pop("ROQ_SECURITY", None)
        else:
            env["ROQ_SECURITY"] = "off"
        return env

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"roq up in {self.data} exited with {self.process.returncode}")
            try:
                probe = subprocess.run(
                    [PYTHON, "-m", "roq", "status", "--gcm", f"127.0.0.1:{self.base}"],
                    env=self.env(), capture_output=True, timeout=30, check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                continue  # a loaded machine: ask again until READY_TIMEOUT_S
            if probe.returncode == 0 and b"host" in probe.stdout.lower():
                return
            time.sleep(0.5)
        raise SystemExit(f"the cluster in {self.data} was not ready within {READY_TIMEOUT_S} s")

    def bench(self, args: list[str]) -> dict[str, Any]:
        """One `roq bench ARGS` against this cluster: its JSON summary."""
        command = [PYTHON, "-m", "roq", "bench", "--gcm", f"127.0.0.1:{self.base}", *args]
        done = subprocess.run(
            command, env=self.env(), capture_output=True, timeout=RUN_TIMEOUT_S, check=False
        )
        lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"bench {args} on {self.data} failed ({done.returncode}): "
                             f"{done.stderr[-2000:]!r}")  # fmt: skip
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return  # it exited (a failed start) with its whole group
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
