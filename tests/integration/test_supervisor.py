"""config/supervisord.conf, roq on a machine without systemd: it mirrors the units, and a copy of
it pointed at this test's ZooKeeper, ports and directories runs `roq gcm` and `roq host` under a
real supervisord: a killed host is restarted, a queue round-trips messages, and both
`supervisorctl stop all` and SIGTERM to supervisord stop both programs cleanly (exit 0, the host
before the GCM on SIGTERM) and leave no roq process of the test behind."""

from __future__ import annotations

import configparser
import getpass
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from roq import limits
from roq.client.admin import AdminClient
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import PortBlocks, act_as_admin, child_pids, processes_with, wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "config" / "supervisord.conf"
PROGRAMS = {"roq-gcm": "roq-gcm.service", "roq-host": "roq-host.service"}
SUPERVISORD = Path(sys.executable).with_name("supervisord")
SUPERVISORCTL = Path(sys.executable).with_name("supervisorctl")
# startsecs (5 s) after a start that may itself take seconds on a loaded machine.
RUNNING_S = 60.0
# A restarted host exits 75 until its old ZooKeeper session (4 s here) expires, then runs for
# startsecs; supervisord waits 1 s, 2 s, 3 s, ... between those attempts.
RESTART_S = 60.0
STOP_S = 30.0 + 45.0 + 15.0  # both programs' stopwaitsecs, then a margin
GONE_S = 15.0


def read_conf(path: Path) -> configparser.RawConfigParser:
    conf = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    conf.read(path)
    return conf


def unit_value(unit: str, key: str) -> str:
    text = (ROOT / "systemd" / unit).read_text()
    match = re.search(rf"^{key}=(.*)$", text, re.M)
    assert match, f"{unit} has no {key}"
    return match.group(1)


def test_shipped_conf_runs_the_units_commands_with_their_bounds() -> None:
    conf = read_conf(SHIPPED)
    assert conf.get("supervisorctl", "serverurl") == "unix://" + conf.get(
        "unix_http_server", "file"
    )
    for program, unit in PROGRAMS.items():
        section = conf[f"program:{program}"]
        assert section["command"] == unit_value(unit, "ExecStart")
        assert section["user"] == unit_value(unit, "User")
        assert f"{section['stopwaitsecs']}s" == unit_value(unit, "TimeoutStopSec")
        assert section["stopsignal"] == "TERM"
        # KillMode=mixed: SIGTERM to roq alone, SIGKILL to the whole group at the deadline.
        assert (section["stopasgroup"], section["killasgroup"]) == ("false", "true")
        # Restart=on-failure, RestartPreventExitStatus=78.
        assert section["autorestart"] == "unexpected"
        assert set(section["exitcodes"].split(",")) == {"0", "78"}
    # A host stops its children one by one, each within SHUTDOWN + SIGTERM grace.
    one_child_s = 2 * limits.shutdown_grace_ms / 1000
    assert int(conf["program:roq-host"]["stopwaitsecs"]) > one_child_s
    assert int(conf["program:roq-gcm"]["priority"]) < int(conf["program:roq-host"]["priority"])


@dataclass
class Supervised:
    conf: Path
    process: subprocess.Popen[bytes]
    logs: Path
    namespace: str
    gcm: str

    def ctl(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SUPERVISORCTL), "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def running_pid(self, program: str) -> int | None:
        """The PID supervisord reports for `program` once it is RUNNING, else None."""
        line = self.ctl("status", program).stdout
        match = re.search(r"\bRUNNING\s+pid (\d+),", line)
        return int(match.group(1)) if match else None

    def all_running(self) -> dict[str, int] | None:
        pids = {program: self.running_pid(program) for program in PROGRAMS}
        return {k: v for k, v in pids.items() if v} if all(pids.values()) else None

    def wait(self, predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """wait_for, failing with supervisord's and the programs' logs as they are then."""
        try:
            return wait_for(predicate, timeout_s, what, interval_s=0.5)
        except TimeoutError as error:
            pytest.fail(f"{error}\n{self.log_text()}")

    def supervisord_log(self) -> str:
        return (self.logs / "supervisord.log").read_text(errors="replace")

    def log_text(self) -> str:
        parts = []
        for name in ("supervisord.log", "roq-gcm.log", "roq-host.log"):
            path = self.logs / name
            text = path.read_text(errors="replace")[-3000:] if path.exists() else ""
            parts.append(f"--- {name}\n{text}")
        return "\n".join(parts)


def conf_copy(
    tmp: Path, run_dir: Path, overrides: dict[str, dict[str, object]]
) -> configparser.RawConfigParser:
    """The shipped file with the installed paths mapped into the test's directories, the
    programs run as this user, and each command given the test's settings as -D overrides."""
    mapped = {
        "/opt/roq/roq": shlex.join(roq_command()),
        "/etc/roq/": f"{ROOT / 'config'}/",
        "/var/lib/roq": str(tmp / "lib"),
        "/var/log/roq": str(tmp / "log"),
        "/run/": f"{run_dir}/",
    }
    conf = read_conf(SHIPPED)
    for section in conf.sections():
        for key, value in conf.items(section):
            for installed, here in mapped.items():
                value = value.replace(installed, here)
            conf.set(section, key, value)
    for program, values in overrides.items():
        section = conf[f"program:{program}"]
        section["user"] = getpass.getuser()
        section["command"] += "".join(f" -D {shlex.quote(f'{k}={v}')}" for k, v in values.items())
    return conf


def settings_for(
    ports: PortBlocks, zookeeper: str, namespace: str, security_dir: Path
) -> dict[str, dict[str, object]]:
    base = ports.take(6)
    common = {
        "security.dir": str(security_dir),
        "zk.servers": zookeeper,
        "zk.namespace": namespace,
        "zk.session.timeout": 4000,
        "network.interface": "127.0.0.1",
    }
    return {
        "roq-gcm": {**common, "ports.base": base, "period": 500},
        "roq-host": {
            **common,
            "gcm.ports.base": base,
            "hcm.port": ports.take(1),
            "monitor.base.port": ports.take(60),
            "statmonitor.base.port": ports.take(20),
            "exchange.base.port": ports.take(40),
            "ports.max.perkind": 10,
            "heartbeat.period": 200,
        },
    }


@pytest.fixture
def supervised(tmp_path: Path, zookeeper: str, port_blocks: PortBlocks) -> Iterator[Supervised]:
    assert SUPERVISORD.exists(), (
        "supervisord is missing: pip install -e '.[dev]' (or '.[supervisor]')"
    )
    namespace = f"/roq-test-{uuid.uuid4().hex[:10]}"
    # the keys a first start writes, made here so that the test acts as their admin
    act_as_admin(tmp_path / "security")
    overrides = settings_for(port_blocks, zookeeper, namespace, tmp_path / "security")
    for directory in ("lib/log", "log"):
        (tmp_path / directory).mkdir(parents=True)
    # A short directory for the control socket: a pytest path may pass AF_UNIX's 108 bytes.
    with tempfile.TemporaryDirectory(prefix="roq-sv-") as run_dir:
        conf_path = tmp_path / "supervisord.conf"
        with conf_path.open("w") as conf_file:
            conf_copy(tmp_path, Path(run_dir), overrides).write(conf_file)
        env = child_environment()
        env.pop("NOTIFY_SOCKET", None)
        with (tmp_path / "supervisord.out").open("wb") as out:
            process = subprocess.Popen(
                [str(SUPERVISORD), "-n", "-c", str(conf_path)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        gcm = f"127.0.0.1:{overrides['roq-gcm']['ports.base']}"
        try:
            yield Supervised(conf_path, process, tmp_path / "log", namespace, gcm)
        finally:
            _end(process, namespace)


def _end(process: subprocess.Popen[bytes], namespace: str) -> None:
    """supervisord stops its programs on SIGTERM; whatever a failed test leaves gets SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    for pid in processes_with(namespace):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def roq(*args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        roq_command(*args),
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        input=input_text,
        check=False,
    )


def host_registered(gcm: str) -> bool:
    with AdminClient(gcm=gcm, timeout_ms=1000, retries=1) as admin:
        return len(admin.status().hosts) >= 1


def round_trip(gcm: str, queue: str) -> None:
    created = roq("queue", "create", queue, "--gcm", gcm)
    assert created.returncode == 0, created.stdout + created.stderr
    sent = [f"supervised message {i}" for i in range(5)]
    published = roq(
        "pub", queue, "--acks", "leader", "--gcm", gcm, input_text="\n".join(sent) + "\n"
    )
    assert published.returncode == 0, published.stderr
    received = roq(
        "sub", queue, "--from-beginning", "--count", "5", "--timeout", "20", "--gcm", gcm
    )
    assert received.stdout.splitlines() == sent, received.stderr


def stopped_cleanly(log: str, logs: str = "") -> None:
    """Each program exited 0 on SIGTERM within its stopwaitsecs (not "terminated by SIGKILL");
    `logs`, the programs' own, explain a failure."""
    for program in PROGRAMS:
        assert f"stopped: {program} (exit status 0)" in log, f"{log}\n{logs}"


@pytest.mark.timeout(300)
def test_supervisord_runs_restarts_and_stops_gcm_and_host(supervised: Supervised) -> None:
    s = supervised
    pids = s.wait(s.all_running, RUNNING_S, "both programs RUNNING")
    assert set(child_pids(s.process.pid)) >= set(pids.values())

    # autorestart: a crash (here SIGKILL) of the host is followed by a new host.
    os.kill(pids["roq-host"], signal.SIGKILL)
    s.wait(
        lambda: s.running_pid("roq-host") not in (None, pids["roq-host"]),
        RESTART_S,
        "supervisord to restart the killed host",
    )
    assert s.running_pid("roq-gcm") == pids["roq-gcm"]
    s.wait(lambda: host_registered(s.gcm), RUNNING_S, "the host registered")

    round_trip(s.gcm, "sq")
    # gcm, host, and the queue's monitor and exchange, all under supervisord.
    ours = processes_with(s.namespace)
    assert len(ours) >= 4 and set(ours) <= set(child_pids(s.process.pid)), ours

    stopped = s.ctl("stop", "all", timeout_s=STOP_S)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr + s.log_text()
    stopped_cleanly(s.supervisord_log(), s.log_text())
    s.wait(lambda: not processes_with(s.namespace), GONE_S, "every roq process to exit")

    # What an init system or a container runtime does: SIGTERM to supervisord, which stops the
    # programs in reverse priority order, the host before the GCM, then exits.
    started = s.ctl("start", "all", timeout_s=RUNNING_S)
    assert started.returncode == 0, started.stdout + started.stderr + s.log_text()
    offset = len(s.supervisord_log())
    s.process.send_signal(signal.SIGTERM)
    assert s.process.wait(timeout=STOP_S) == 0, s.log_text()
    log = s.supervisord_log()[offset:]
    stopped_cleanly(log)
    assert log.index("stopped: roq-host") < log.index("stopped: roq-gcm"), log
    s.wait(lambda: not processes_with(s.namespace), GONE_S, "every roq process to exit")
