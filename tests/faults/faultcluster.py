"""A roq cluster across the machines of `faultnet`: a 3-node ZooKeeper ensemble on the first
three machines, `roq host` on every machine, `roq gcm` on the first two. Every process is
started with `ip netns exec` (which keeps the environment, so PYTHONPATH reaches the children)
and binds its machine's address only. Every wait is bounded and names what it waited for."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultnet import Machine, Network

from roq.client.admin import AdminClient
from roq.local.zkserver import classpath
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import act_as_admin, wait_for

ZK_PORT = 2181
SESSION_MS = 4000  # zk.session.timeout of every roq process here
# host.loss.grace (default 6 s): how long the GCM waits for a lost host before re-placing its
# work. The bound (session + 5 s) leaves no room for the default; 500 ms is what
# tests/integration/test_hostloss.py uses.
GRACE_MS = 500
SETTINGS = {
    "zk.session.timeout": SESSION_MS,
    "heartbeat.period": 200,
    "monitor.stat.period": 500,
    "exchange.max.perhost": 4,
    "exchange.warmup": 500,
    "replicationFactor": 2,
    # The workload is light: the default scale-in would retire one of q1's two exchanges after
    # 30 s, and the faults would hit a queue without a second exchange to copy its log.
    "scaling.min.exchanges": 2,
}


@dataclass
class Proc:
    """One server process on one machine; `start()` again after it died runs the same thing."""

    name: str
    machine: Machine
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [*self.machine.exec_prefix(), *self.argv],
                env=child_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reap(self, timeout_s: float = 10.0) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class FaultCluster:
    net: Network
    tmp: Path
    namespace: str = field(default_factory=lambda: f"/roq-faults-{uuid.uuid4().hex[:8]}")
    procs: list[Proc] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # the hosts', over SETTINGS

    def __post_init__(self) -> None:
        """One cluster key for every machine, as an operator copies cluster.json to each one
        (docs/security.md); the test acts as the generated admin principal."""
        act_as_admin(self.security_dir)

    @property
    def security_dir(self) -> Path:
        return self.tmp / "security"

    @property
    def zk_machines(self) -> list[Machine]:
        return self.net.machines[:3]

    @property
    def zk_servers(self) -> str:
        return ",".join(f"{m.address}:{ZK_PORT}" for m in self.zk_machines)

    def machine(self, name: str) -> Machine:
        return next(m for m in self.net.machines if m.name == name)

    def on(self, machine: Machine) -> list[Proc]:
        return [p for p in self.procs if p.machine is machine]

    def start(self, log_dirs: dict[str, Path] | None = None) -> None:
        for index, machine in enumerate(self.zk_machines, start=1):
            self._add(machine, "zk", self._zk_argv(machine, index)).start()
        wait_for(self.zk_leader, 60, f"a ZooKeeper leader elected\n{self.logs()}", 0.3)
        for machine in self.net.machines[:2]:
            self._add(machine, "gcm", roq_command("gcm", *self._gcm_args(machine))).start()
        for machine in self.net.machines:
            directory = (log_dirs or {}).get(machine.name, self.tmp / machine.name / "log")
            self._add(
                machine, "host", roq_command("host", *self._host_args(machine, directory))
            ).start()
        self.wait_hosts(len(self.net.machines))

    def _add(self, machine: Machine, kind: str, argv: list[str]) -> Proc:
        proc = Proc(
            f"{kind}-{machine.name}", machine, argv, self.tmp / f"{kind}-{machine.name}.log"
        )
        self.procs.append(proc)
        return proc

    def _zk_argv(self, machine: Machine, myid: int) -> list[str]:
        data = self.tmp / machine.name / "zk"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{myid}\n")
        servers = "".join(
            f"server.{n}={m.address}:2888:3888\n" for n, m in enumerate(self.zk_machines, start=1)
        )
        config = data / "zoo.cfg"
        config.write_text(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={data}\nclientPort={ZK_PORT}\nclientPortAddress={machine.address}\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\n"
            "minSessionTimeout=1000\nmaxSessionTimeout=60000\n" + servers
        )
        java = shutil.which("java") or "java"
        return [
            java, "-Xmx128m", "-XX:+UseSerialGC", "-cp", classpath(),
            "-Dzookeeper.root.logger=WARN,CONSOLE", f"-Dzookeeper.log.dir={data}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config),
        ]  # fmt: skip

    def _common(self, machine: Machine) -> dict[str, Any]:
        return {
            "zk.servers": self.zk_servers,
            "zk.namespace": self.namespace,
            "network.interface": machine.address,
            "zk.session.timeout": SESSION_MS,
            "security.dir": str(self.security_dir),
        }

    def _gcm_args(self, machine: Machine) -> list[str]:
        values = {**self._common(machine), "period": 500, "hcmTIMEOUT": 20000}
        return _defines({**values, "host.loss.grace": GRACE_MS})

    def _host_args(self, machine: Machine, directory: Path) -> list[str]:
        values = {**self._common(machine), **SETTINGS, **self.settings}
        return _defines({**values, "host.name": machine.name, "directory": str(directory)})

    # --- observing ------------------------------------------------------------------------
    def zk_mode(self, machine: Machine) -> str:
        """`leader`, `follower`, or "" when the server does not serve (no quorum, dead)."""
        try:
            with socket.create_connection((machine.address, ZK_PORT), timeout=1.0) as sock:
                sock.sendall(b"srvr")
                sock.settimeout(1.0)
                text = b"".join(iter(lambda: sock.recv(4096), b"")).decode(errors="replace")
        except OSError:
            return ""
        for line in text.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def zk_leader(self) -> Machine | None:
        return next((m for m in self.zk_machines if self.zk_mode(m) == "leader"), None)

    def admin(self, timeout_ms: int = 2000) -> AdminClient:
        return AdminClient(zk=self.zk_servers, namespace=self.namespace, timeout_ms=timeout_ms)

    def wait_hosts(self, count: int, timeout_s: float = 60.0) -> None:
        def registered() -> bool:
            with self.admin() as admin:
                return len(admin.status().hosts) >= count

        wait_for(registered, timeout_s, f"{count} live host(s)\n{self.logs()}", 0.5)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_text()[-tail:]}" for p in self.procs)

    # --- faults on processes --------------------------------------------------------------
    def kill_machine(self, machine: Machine) -> None:
        """kill -9 of every process of the machine (servers and the children they started)."""
        for _ in range(3):
            if not machine.signal_all(signal.SIGKILL):
                break
            time.sleep(0.2)
        for proc in self.on(machine):
            proc.reap()

    def stop_gracefully(self, machine: Machine, timeout_s: float = 30.0) -> None:
        for proc in reversed(self.on(machine)):
            if proc.running() and proc.process is not None:
                proc.process.send_signal(signal.SIGTERM)
                proc.reap(timeout_s)
        self.kill_machine(machine)  # what outlived SIGTERM (none, normally)

    def restart_machine(self, machine: Machine) -> None:
        for proc in self.on(machine):
            if not proc.running():
                proc.start()

    def stop(self) -> None:
        for machine in self.net.machines:
            machine.signal_all(signal.SIGCONT)  # a stopped process cannot take SIGTERM
        for proc in reversed(self.procs):
            if proc.running() and proc.process is not None:
                proc.process.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            proc.reap(10)
        for machine in self.net.machines:
            self.kill_machine(machine)


def _defines(values: dict[str, Any]) -> list[str]:
    text = {
        k: ("true" if v is True else "false" if v is False else str(v)) for k, v in values.items()
    }
    return [arg for k, v in text.items() for arg in ("-D", f"{k}={v}")]
