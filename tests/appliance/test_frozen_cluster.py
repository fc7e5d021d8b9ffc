"""The artefact end to end: `dist/roq/roq up` runs a one-machine cluster that the frozen client
commands drive, and SIGTERM leaves no process behind; the units' ExecStart lines, run by hand
against the frozen executable and the shipped config, report READY=1 to $NOTIFY_SOCKET from the
main PID (what NotifyAccess=main needs) and STOPPING=1 on SIGTERM."""

from __future__ import annotations

import array
import ctypes
import os
import shlex
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_support import ROOT, frozen_env, run_frozen

from roq.local.zkserver import is_serving, listener_config, write_tls_files
from roq.testing.cluster import PortBlocks, child_pids, wait_for
from roq.transport import security

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

UP_READY_S = 40.0
STOP_BOUND_S = 30.0  # the units' TimeoutStopSec for the GCM
# Measured 1.2 s; the bound leaves room for a child's shutdown grace (limits.shutdown_grace_ms).
KILLED_TREE_GONE_S = 15.0


def up_arguments(tmp: Path, ports: PortBlocks) -> tuple[list[str], int]:
    base = ports.take(6)
    values = {
        "zk.servers": f"127.0.0.1:{ports.take(1)}",  # free: `roq up` starts its own ZooKeeper
        "ports.base": base,
        "gcm.ports.base": base,
        "hcm.port": ports.take(1),
        "http.port": ports.take(1),  # `roq up` serves the HTTP gateway there
        "monitor.base.port": ports.take(60),
        "statmonitor.base.port": ports.take(20),
        "exchange.base.port": ports.take(40),
        "ports.max.perkind": 10,
        "period": 500,
        # Should another test's ZooKeeper take that port first, stay out of its way.
        "zk.namespace": f"/roq-test-{uuid.uuid4().hex[:10]}",
    }
    args = ["up", "--data-dir", str(tmp / "data")]
    for key, value in values.items():
        args += ["-D", f"{key}={value}"]
    return args, base


def _up_and_serving(log: str) -> bool:
    return "roq is up" in log and "http: serving the mq API" in log


@pytest.fixture
def frozen_up(
    frozen_roq: Path, tmp_path: Path, port_blocks: PortBlocks, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    args, base = up_arguments(tmp_path, port_blocks)
    # the frozen commands act as the admin that this `roq up` writes on its first start (not
    # as a cluster an earlier test of this worker left in the environment)
    monkeypatch.delenv("ROQ_SECURITY", raising=False)
    monkeypatch.setenv("ROQ_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("ROQ_CREDENTIALS", raising=False)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [str(frozen_roq), *args],
            env=frozen_env(),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # "roq is up" comes before the gateway serves: it then still creates its queue, and a
        # host killed while it starts that queue's monitor takes longer to stop than the tests'
        # bounds allow (a stop waits for the start in progress). Wait for the gateway too.
        wait_for(
            lambda: _up_and_serving(log_path.read_text(errors="replace")) or process.poll(),
            UP_READY_S,
            f"roq up to be ready\n{log_path.read_text(errors='replace')}",
        )
        assert process.poll() is None, log_path.read_text(errors="replace")
        yield process, f"127.0.0.1:{base}", log_path
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_frozen_up_queue_status_and_clean_stop(
    frozen_roq: Path, frozen_up: tuple[subprocess.Popen[bytes], str, Path]
) -> None:
    process, gcm, log_path = frozen_up
    tree = child_pids(process.pid)
    assert len(tree) >= 3, "ZooKeeper, gcm and host run under roq up"

    created = run_frozen(frozen_roq, "queue", "create", "q1", "--gcm", gcm)
    assert created.returncode == 0, created.stdout + created.stderr
    sent = [f"frozen message {i}" for i in range(5)]
    published = run_frozen(
        frozen_roq, "pub", "q1", "--acks", "leader", "--gcm", gcm, input_text="\n".join(sent) + "\n"
    )
    assert published.returncode == 0, published.stderr
    received = run_frozen(
        frozen_roq,
        "sub",
        "q1",
        "--from-beginning",
        "--count",
        "5",
        "--timeout",
        "20",
        "--gcm",
        gcm,
    )
    assert received.stdout.splitlines() == sent, received.stderr
    listed = run_frozen(frozen_roq, "queue", "list", "--gcm", gcm)
    assert listed.returncode == 0 and "q1" in listed.stdout, listed.stderr
    status = run_frozen(frozen_roq, "status", "--gcm", gcm)
    assert status.returncode == 0, status.stderr
    assert "hosts (1)" in status.stdout and "q1" in status.stdout

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=STOP_BOUND_S) == 0, log_path.read_text(errors="replace")
    # Every process roq up started (ZooKeeper, gcm, host, monitors, exchanges) is gone.
    try:
        wait_for(lambda: not _alive(tree), 10, "the children of roq up to exit")
    except TimeoutError:
        pass  # reported below with the survivors' PIDs
    left = _alive(tree)
    assert left == [], f"left behind: {left}\n{log_path.read_text(errors='replace')}"


def test_frozen_up_killed_takes_its_whole_tree_down(
    frozen_roq: Path, frozen_up: tuple[subprocess.Popen[bytes], str, Path]
) -> None:
    """SIGKILL (the OOM killer, a supervisor past its stop timeout) of `roq up` alone, not its
    process group: ZooKeeper, the GCM, the host and the queue's monitor and exchange go too.
    Before, the JVM survived, and the host hung for ever on its ZooKeeper clean-up."""
    process, gcm, log_path = frozen_up
    created = run_frozen(frozen_roq, "queue", "create", "q1", "--gcm", gcm)
    assert created.returncode == 0, created.stdout + created.stderr
    tree = child_pids(process.pid)
    assert len(tree) >= 5, "ZooKeeper, gcm, host, monitor and exchange run under roq up"

    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    try:
        wait_for(lambda: not _alive(tree), KILLED_TREE_GONE_S, "the orphans of roq up to exit")
    except TimeoutError:
        pass  # reported below with the survivors' PIDs
    left = _alive(tree)
    assert left == [], f"left behind: {left}\n{log_path.read_text(errors='replace')}"


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class NotifyListener:
    """Stands in for systemd's notification socket: an abstract AF_UNIX datagram socket that
    records each message with the sender's PID (SCM_CREDENTIALS)."""

    def __init__(self) -> None:
        self.name = f"@roq-test-notify-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + self.name[1:])
        self.messages: list[tuple[int, str]] = []

    def wait_for(self, state: str, timeout_s: float) -> int:
        """PID that sent a message containing `state`; raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except TimeoutError:
                break
            pid = _sender_pid(ancdata)
            self.messages.append((pid, data.decode()))
            if state in data.decode().splitlines():
                return pid
        raise TimeoutError(f"no {state} within {timeout_s} s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


def _sender_pid(ancdata: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            creds = array.array("i")
            creds.frombytes(data[: struct.calcsize("3i")])
            return creds[0]
    return -1


def unit_command(unit: str, frozen: Path) -> list[str]:
    """The unit's ExecStart with the installed paths mapped to this checkout."""
    line = next(
        line
        for line in (ROOT / "systemd" / unit).read_text().splitlines()
        if line.startswith("ExecStart=")
    )
    argv = shlex.split(line.removeprefix("ExecStart="))
    mapped = {"/opt/roq/roq": str(frozen), "/etc/roq/": str(ROOT / "config") + "/"}
    out = []
    for arg in argv:
        for installed, here in mapped.items():
            arg = arg.replace(installed, here)
        out.append(arg)
    return out


def start_unit_by_hand(
    unit: str, frozen: Path, overrides: dict[str, object], listener: NotifyListener, log: Path
) -> subprocess.Popen[bytes]:
    argv = unit_command(unit, frozen)
    for key, value in overrides.items():
        argv += ["-D", f"{key}={value}"]
    # WatchdogSec=2s as systemd would pass it (the units' own are minutes: too long to watch)
    env = {**frozen_env(), "NOTIFY_SOCKET": listener.name, "WATCHDOG_USEC": "2000000"}
    with log.open("wb") as log_file:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=deny_write_execute,
        )


PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1


def deny_write_execute() -> None:
    """preexec_fn: what the units' MemoryDenyWriteExecute=yes asks for, on kernels >= 6.3
    (inherited by every child, so the host's monitors and exchanges run under it too)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)  # older kernels: EINVAL, ignored


def test_units_exec_start_report_ready_and_stop(
    frozen_roq: Path,
    zookeeper: str,
    port_blocks: PortBlocks,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = f"/roq-test-{uuid.uuid4().hex[:10]}"
    base = port_blocks.take(6)
    common = {"zk.servers": zookeeper, "zk.namespace": namespace, "network.interface": "127.0.0.1",
              "security.dir": tmp_path / "security",
              "zk.tls": "false"}  # the tests' shared ZooKeeper is plain  # fmt: skip
    # the frozen commands act as the admin the GCM writes there on its first start
    monkeypatch.delenv("ROQ_SECURITY", raising=False)
    monkeypatch.setenv("ROQ_ZK_TLS", "off")
    monkeypatch.setenv("ROQ_CREDENTIALS", str(tmp_path / "security" / "admin.json"))
    gcm_over = {**common, "ports.base": base, "period": 500}
    hcm_over = {
        **common,
        "gcm.ports.base": base,
        "hcm.port": port_blocks.take(1),
        "monitor.base.port": port_blocks.take(60),
        "statmonitor.base.port": port_blocks.take(20),
        "exchange.base.port": port_blocks.take(40),
        "ports.max.perkind": 10,
        "directory": tmp_path / "log",  # the unit's /var/lib/roq/log does not exist here
    }
    listeners = {"gcm": NotifyListener(), "host": NotifyListener()}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role, over in (("gcm", gcm_over), ("host", hcm_over)):
            processes[role] = start_unit_by_hand(
                f"roq-{role}.service", frozen_roq, over, listeners[role], tmp_path / f"{role}.log"
            )
            sender = listeners[role].wait_for("READY=1", 30)
            # One-dir: the notifying process is the one systemd started (NotifyAccess=main).
            assert sender == processes[role].pid, listeners[role].messages
            for _ in range(2):  # its loop beats the watchdog every second (half of 2 s)
                beat = listeners[role].wait_for("WATCHDOG=1", 5)
                assert beat == processes[role].pid, listeners[role].messages
        status = run_frozen(frozen_roq, "status", "--gcm", f"127.0.0.1:{base}")
        assert "hosts (1)" in status.stdout, status.stdout + status.stderr
        # A queue gives the host children to drain on SIGTERM.
        gcm = f"127.0.0.1:{base}"
        created = run_frozen(frozen_roq, "queue", "create", "q1", "--gcm", gcm)
        assert created.returncode == 0, created.stdout + created.stderr
        children = wait_for(lambda: child_pids(processes["host"].pid), 10, "the queue's processes")
        for role in ("host", "gcm"):
            processes[role].send_signal(signal.SIGTERM)
            listeners[role].wait_for("STOPPING=1", STOP_BOUND_S)
            assert processes[role].wait(timeout=STOP_BOUND_S) == 0
        assert _alive(children) == [], "the host left its monitor or exchange running"
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        for listener in listeners.values():
            listener.close()


def test_zookeeper_unit_command_serves_with_the_shipped_zoo_cfg(
    tmp_path: Path, port_blocks: PortBlocks
) -> None:
    # with the listener roq-configure appends (`roq keys zookeeper-tls`): TLS only, whose
    # Netty codec the unit's class path must hold
    port = port_blocks.take(1)
    tls = security.generate(tmp_path / "security").zk_tls
    assert tls is not None
    cfg = (ROOT / "ami" / "files" / "zoo.cfg").read_text()
    cfg = cfg.replace("dataDir=/var/lib/roq-zookeeper", f"dataDir={tmp_path / 'zk'}")
    cfg += listener_config(port, "127.0.0.1", write_tls_files(tmp_path / "zk-tls", tls))
    (tmp_path / "zoo.cfg").write_text(cfg)
    line = next(
        line
        for line in (ROOT / "systemd" / "roq-zookeeper.service").read_text().splitlines()
        if line.startswith("ExecStart=")
    )
    argv = shlex.split(line.removeprefix("ExecStart="))
    argv = [str(tmp_path / "zoo.cfg") if a == "/etc/roq/zoo.cfg" else a for a in argv]
    argv = [a.replace("/var/log/roq-zookeeper", str(tmp_path)) for a in argv]
    with (tmp_path / "zk.log").open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: is_serving("127.0.0.1", port, tls=tls), 30, f"ZooKeeper on {port}")
        assert not is_serving("127.0.0.1", port), "it answered in plain TCP"
        process.send_signal(signal.SIGTERM)
        # SuccessExitStatus=143 in the unit: the JVM's answer to SIGTERM.
        assert process.wait(timeout=30) == 143
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
