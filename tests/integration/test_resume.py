"""Restart is resume (issue 17): queues come back with their logs after a restart of `roq up`, a
kill -9 of a host, and a queue stop/start; only a delete removes data."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from roq.client.publisher import Publisher
from roq.errors import EXIT_NOT_SERVING, RoqError
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, child_pids, processes_with, wait_for

pytestmark = pytest.mark.integration

# The bounds (15 s for `roq up` and a host under it, 10 s after a host started again
# by hand) are speed goals, measured by benchmarks/restart_resume.py (docs/benchmarks.md: 5 s
# medians), not by a timed test: on the loaded CI machine, where every child is a Python start
# competing for two cores, `roq up` served again after 15.5, 15.9 and 18.6 s. These bounds say
# only that it resumes by itself, with no command typed.
SERVE_AGAIN_S = 45.0
HOST_SERVES_AGAIN_S = 30.0


def _pub(cluster: LocalCluster, gcm: str, lines: list[str], timeout_s: float = 10) -> bool:
    """One `roq pub --acks leader`; True once every line is acknowledged."""
    try:
        done = cluster.cli(
            "pub", "q1", "--acks", "leader", "--gcm", gcm,
            input_text="\n".join(lines) + "\n", timeout_s=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _read_all(cluster: LocalCluster, gcm: str, count: int) -> list[str]:
    result = cluster.cli(
        "sub", "q1", "--from-beginning", "--count", str(count), "--timeout", "30", "--gcm", gcm,
        timeout_s=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + cluster.logs()
    return result.stdout.splitlines()


def _assert_read_back(cluster: LocalCluster, gcm: str, sent: list[str], after: int) -> None:
    """Every message sent, in its stream's order, and the `after` probes (other streams,
    which may be read before or between them: no order is promised across streams)."""
    lines = _read_all(cluster, gcm, len(sent) + after)
    assert [line for line in lines if line != "after"] == sent, lines
    assert lines.count("after") == after, lines


def _acknowledged(gcm: str) -> bool:
    """One publish from this process, acknowledged by the leader within 2 s. In process, not a
    `roq pub`: a CLI run that met the restart waited out its 5 s timeout, and the next began
    with a second of start-up, so the measure was the probe's granularity, not the queue's."""
    try:
        with Publisher("q1", gcm=gcm, acks="leader") as publisher:
            publisher.send(b"after")
            publisher.flush(timeout_s=2)
        return True
    except RoqError:
        return False


def _serves_again(logs: Callable[[], str], gcm: str, since: float, bound_s: float) -> float:
    """Waits until a publish is acknowledged; returns the seconds since `since`."""
    wait_for(lambda: _acknowledged(gcm), bound_s + 5, "q1 accepting publishes")
    took = time.monotonic() - since
    print(f"served again after {took:.1f} s")  # with -s
    assert took < bound_s, f"q1 served again after {took:.1f} s\n{logs()}"
    return took


# --- `roq up` ---------------------------------------------------------------------------------
class Up:
    """A `roq up` on its own data directory and ports; `start()` again resumes it."""

    def __init__(self, tmp: Path, ports: PortBlocks):
        """With the keys of the helper LocalCluster (the README's tour as a user runs it, with
        roq-data in its directory, is test_tour.py's)."""
        self.tmp = tmp
        self.data = tmp / "data"
        self.base = ports.take(6)
        values = {
            "zk.servers": f"127.0.0.1:{ports.take(1)}",  # free: `roq up` starts its ZooKeeper
            "ports.base": self.base,
            "hcm.port": ports.take(1),
            "http.port": ports.take(1),  # `roq up` serves the HTTP gateway there
            "monitor.base.port": ports.take(60),
            "statmonitor.base.port": ports.take(20),
            "exchange.base.port": ports.take(40),
            "ports.max.perkind": 10,
            "period": 500,
            "heartbeat.period": 200,
            "zk.namespace": f"/roq-test-{uuid.uuid4().hex[:10]}",
        }
        values["security.dir"] = str(tmp / "security")  # the helper's, whose CLI the tests use
        self.args = ["up", "--data-dir", str(self.data)]
        for key, value in values.items():
            self.args += ["-D", f"{key}={value}"]
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "up.log"

    @property
    def gcm(self) -> str:
        return f"127.0.0.1:{self.base}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> None:
        marker = self.log_text().count("roq is up") if self.log_path.exists() else 0
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                roq_command(*self.args),
                env=child_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.tmp,
            )
        process = self.process
        wait_for(
            lambda: self.log_text().count("roq is up") > marker or process.poll() is not None,
            60,
            "roq up ready",
        )
        assert process.poll() is None, self.log_text()

    def kill_tree(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        for pid in processes_with(str(self.data)):  # ZooKeeper: its own session
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not processes_with(str(self.data)), 15, "the tree gone")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill_tree()
        for pid in processes_with(str(self.data)):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up(tmp_path: Path, port_blocks: PortBlocks) -> Iterator[tuple[Up, LocalCluster]]:
    local = Up(tmp_path, port_blocks)
    # A LocalCluster only for its CLI and log helpers: it starts nothing.
    helper = LocalCluster(tmp_path, "", port_blocks)
    try:
        yield local, helper
    finally:
        local.stop()


def test_a_second_roq_up_on_the_same_data_directory_exits_75_naming_the_first(
    up: tuple[Up, LocalCluster],
) -> None:
    """Issue 32: it printed "roq is up." and then restarted its children for ever."""
    local, _ = up
    local.start()
    assert local.process is not None
    second = subprocess.run(
        roq_command(*local.args), env=child_environment(), capture_output=True, text=True,
        timeout=60, cwd=local.tmp, check=False,
    )  # fmt: skip
    assert second.returncode == 75, second.stderr
    assert f"another roq up (pid {local.process.pid}) runs on" in second.stderr
    assert "roq is up" not in second.stdout
    assert local.process.poll() is None, local.log_text()  # the first serves on


def test_roq_up_port_base_moves_every_port_of_the_cluster(
    tmp_path: Path, port_blocks: PortBlocks
) -> None:
    """Issue 32: a second cluster beside the first took seven -D keys; now one option."""
    base = port_blocks.take(1200)  # the layout spans base .. base + 1000 + the exchanges'
    helper = LocalCluster(tmp_path, "", port_blocks)  # its keys and CLI; it starts nothing
    args = ["up", "--data-dir", str(tmp_path / "data"), "--port-base", str(base),
            "-D", f"security.dir={tmp_path / 'security'}", "-D", "ports.max.perkind=10",
            "-D", f"zk.namespace=/roq-test-{uuid.uuid4().hex[:10]}"]  # fmt: skip
    with (tmp_path / "up.log").open("wb") as log_file:
        process = subprocess.Popen(
            roq_command(*args), env=child_environment(), stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip

    def log_text() -> str:
        return (tmp_path / "up.log").read_text(errors="replace")

    try:
        wait_for(lambda: "roq is up" in log_text() or process.poll() is not None, 60, "up")
        assert process.poll() is None, log_text()
        assert f"127.0.0.1:{base + 90}" in log_text()  # its own ZooKeeper, there
        assert f"GCM         127.0.0.1:{base} " in log_text()
        listed = helper.cli("status", "--gcm", f"127.0.0.1:{base}", timeout_s=60)
        assert listed.returncode == 0 and "hosts (1)" in listed.stdout, listed.stderr
        made = helper.cli("queue", "create", "q1", "--gcm", f"127.0.0.1:{base}", timeout_s=60)
        assert made.returncode == 0, made.stderr + log_text()
        assert (
            f"127.0.0.1:{base + 500}"
            in helper.cli("status", "--gcm", f"127.0.0.1:{base}", timeout_s=60).stdout
        )  # the monitor's ports start at base + 500
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for pid in processes_with(str(tmp_path / "data")):
            os.kill(pid, signal.SIGKILL)


# Issue 32: a SIGTERM right after `roq queue create` left 8 processes running 20 s later (the
# host waited out each child's start and stopped them one by one). The goal is 5 s; the bound
# here is liveness on a loaded machine (the old code took 24-25 s).
GONE_WITHIN_S = 12.0


@pytest.mark.parametrize("after_s", [0.0, 0.7, 2.0], ids=["at-once", "0.7s", "2s"])
def test_sigterm_during_a_queues_start_stops_every_process_of_roq_up(
    up: tuple[Up, LocalCluster], after_s: float
) -> None:
    local, helper = up
    local.start()
    assert local.process is not None
    created = helper.cli("queue", "create", "q1", "--gcm", local.gcm, timeout_s=60)
    assert created.returncode == 0, created.stderr + local.log_text()
    time.sleep(after_s)  # the moment of the queue's start (its second exchange, its copies)
    sent = time.monotonic()
    local.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: local.process is not None and local.process.poll() is not None
        and not processes_with(str(local.data)),
        GONE_WITHIN_S, f"every process of roq up gone\n{local.log_text()[-3000:]}", 0.1,
    )  # fmt: skip
    print(f"gone {time.monotonic() - sent:.2f} s after SIGTERM")
    assert local.process.returncode == 0, local.log_text()[-3000:]


def _queue_with_messages(up: Up, helper: LocalCluster, count: int) -> list[str]:
    created = helper.cli("queue", "create", "q1", "--gcm", up.gcm, timeout_s=60)
    assert created.returncode == 0, created.stderr + up.log_text()
    sent = [f"m{n}" for n in range(count)]
    assert _pub(helper, up.gcm, sent, 30), up.log_text()
    return sent


def test_roq_up_sigterm_then_up_again_serves_the_queue_with_its_log(
    up: tuple[Up, LocalCluster],
) -> None:
    local, helper = up
    local.start()
    sent = _queue_with_messages(local, helper, 500)
    local.stop()
    started = time.monotonic()
    local.start()
    _serves_again(local.log_text, local.gcm, started, SERVE_AGAIN_S)
    _assert_read_back(helper, local.gcm, sent, after=1)


def _host_pid(local: Up) -> int:
    assert local.process is not None
    hosts = [p for p in child_pids(local.process.pid) if p in processes_with(" host ")]
    assert len(hosts) == 1, hosts
    return hosts[0]


def test_roq_up_restarts_a_killed_host_and_resumes_after_its_whole_tree_is_killed(
    up: tuple[Up, LocalCluster],
) -> None:
    local, helper = up
    local.start()
    sent = _queue_with_messages(local, helper, 300)
    os.kill(_host_pid(local), signal.SIGKILL)  # its monitor and exchange die with it
    killed = time.monotonic()
    # roq up restarts the host first: an in-process probe is quick enough to be answered by the
    # dying exchange before its host's death is noticed
    wait_for(lambda: "restarting roq host" in local.log_text(), SERVE_AGAIN_S, "roq up restarts it")
    _serves_again(local.log_text, local.gcm, killed, SERVE_AGAIN_S)
    _assert_read_back(helper, local.gcm, sent, after=1)

    local.kill_tree()
    started = time.monotonic()
    local.start()  # ZooKeeper restores the dead host's session: the host proves it dead
    _serves_again(local.log_text, local.gcm, started, SERVE_AGAIN_S)
    _assert_read_back(helper, local.gcm, sent, after=2)


# --- hosts and queues --------------------------------------------------------------------------
def _queue_processes(cluster: LocalCluster, queue: str) -> list[int]:
    return processes_with(f" {queue} --bind ", str(cluster.tmp))


def test_a_host_killed_and_started_again_serves_its_queues_with_their_logs(
    cluster: LocalCluster,
) -> None:
    cluster.start_gcm()
    host = cluster.start_host("h1")
    cluster.wait_ready()
    assert cluster.cli("queue", "create", "q1", "--gcm", cluster.gcm).returncode == 0
    sent = [f"m{n}" for n in range(400)]
    assert _pub(cluster, cluster.gcm, sent, 30), cluster.logs()
    cluster.kill(host)  # the host's process group: its children die with it
    wait_for(lambda: not _queue_processes(cluster, "q1"), 10, "q1's processes gone")
    wait_for(
        lambda: "NOT SERVING: host h1 is down" in _not_serving(cluster),
        15,
        "status saying why q1 is not served (h1's session expires in 4 s)",
    )
    started = time.monotonic()
    cluster.start_host("h1")  # new port ranges; the recorded ports are free, so reused
    _serves_again(cluster.logs, cluster.gcm, started, HOST_SERVES_AGAIN_S)
    _assert_read_back(cluster, cluster.gcm, sent, after=1)


def _roq(cluster: LocalCluster, *args: str) -> str:
    result = cluster.cli(*args, "--gcm", cluster.gcm, timeout_s=60)
    assert result.returncode == 0, f"roq {' '.join(args)}: {result.stderr}\n{cluster.logs()}"
    return result.stdout


def _not_serving(cluster: LocalCluster) -> str:
    """`roq status` while a queue is not served: it exits EXIT_NOT_SERVING (issue 32)."""
    result = cluster.cli("status", "--gcm", cluster.gcm, timeout_s=60)
    assert result.returncode == EXIT_NOT_SERVING, f"roq status: {result.stderr}"
    return result.stdout


def test_stop_and_start_of_a_queue_on_two_hosts_stops_everything_and_keeps_the_logs(
    cluster: LocalCluster,
) -> None:
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.start_host("h2")
    cluster.wait_ready(hosts=2)
    _roq(cluster, "queue", "create", "q1", "--host", "h1")
    with cluster.admin() as admin:
        admin.create_exchange("q1", "resume-tx-1", host="h2")
    sent = [f"m{n}" for n in range(300)]
    assert _pub(cluster, cluster.gcm, sent, 30), cluster.logs()
    assert len(_queue_processes(cluster, "q1")) == 3  # the monitor and two exchanges

    _roq(cluster, "queue", "stop", "q1")
    wait_for(lambda: not _queue_processes(cluster, "q1"), 10, "every q1 process gone")
    _roq(cluster, "queue", "start", "q1")
    assert len(_queue_processes(cluster, "q1")) == 3
    assert _pub(cluster, cluster.gcm, ["after"], 30), cluster.logs()
    got = _read_all(cluster, cluster.gcm, len(sent) + 1)
    assert sorted(got) == sorted([*sent, "after"])


def test_stop_start_keeps_the_log_and_delete_removes_it(cluster: LocalCluster) -> None:
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    _roq(cluster, "queue", "create", "q1")
    sent = [f"m{n}" for n in range(200)]
    assert _pub(cluster, cluster.gcm, sent, 30), cluster.logs()
    _roq(cluster, "queue", "stop", "q1")
    _roq(cluster, "queue", "start", "q1")
    assert _read_all(cluster, cluster.gcm, len(sent)) == sent
    logs = cluster.tmp / "h1" / "log" / "q1"
    assert any(logs.iterdir())
    _roq(cluster, "queue", "delete", "q1")
    assert not logs.exists()
    _roq(cluster, "queue", "create", "q1")
    assert _pub(cluster, cluster.gcm, ["fresh"], 30)
    assert _read_all(cluster, cluster.gcm, 1) == ["fresh"]
