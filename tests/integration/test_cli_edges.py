"""The rough edges a new user hit (issue 32 items 4 and 5), each through the `roq` commands a
user types, against a real cluster where one is needed: the refusal of a queue past a host's
capacity names the setting to raise, and the default capacity follows the machine; `roq status`
exits non-zero while a queue is NOT SERVING; `roq sub` does not print a service's requests; bad
input is exit 65, not 1 (a refusal by the GCM); `--zk` errors come without kazoo's log lines;
`roq analytics` over nothing refuses at once."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roq import limits
from roq.errors import EXIT_DATAERR, EXIT_NOINPUT, EXIT_NOT_SERVING, EXIT_UNAVAILABLE
from roq.host import capacity
from roq.system import procstat
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration


def _roq(cluster: LocalCluster, *args: str, stdin: str | bytes | None = None,
         timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    """`roq ARGS --gcm <the cluster's>`, bytes in and out."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        roq_command(*args, "--gcm", cluster.gcm), env=child_environment(), input=data,
        capture_output=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def test_a_queue_past_a_hosts_capacity_is_refused_naming_the_setting_to_raise(
    cluster: LocalCluster,
):
    """Item 4: the tour used up RoQ's 3 exchanges, and the refusal did not say what to do. A
    host without `exchange.max.perhost` derives its limit from the machine; one with it set
    keeps it, and a create past it is refused with the key, its value and how to raise it."""
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 1})
    derived = cluster.start_host("h2")  # the default: 0, from this machine
    cluster.wait_ready(hosts=2)
    assert _roq(cluster, "queue", "create", "q1", "--host", "h1").returncode == 0

    refused = _roq(cluster, "queue", "create", "q2", "--host", "h1")
    err = refused.stderr.decode()
    assert refused.returncode == 1, err  # the GCM refused (README's exit codes)
    assert "host h1: 1 exchanges run here, its limit (exchange.max.perhost=1 as configured)" in err
    assert "raise exchange.max.perhost in this host's HCM.properties" in err, err
    assert "queue q2 not created" in err, err

    expected = capacity.derive(procstat.machine_cores(), procstat.machine_memory_bytes(),
                               64 * 2**20)  # fmt: skip
    assert expected.exchanges >= limits.host_exchanges_floor
    status = _roq(cluster, "status").stdout.decode()
    assert f"max {expected.exchanges} exchanges" in status, status
    assert "derived from this machine" in derived.log_text(), derived.log_text()


def test_status_exits_5_while_a_queue_is_not_serving(cluster: LocalCluster):
    """Item 5: `roq status` printed NOT SERVING and exited 0. A stopped (SIGSTOP) monitor
    answers nothing: the queue is NOT SERVING until it runs again."""
    cluster.start_with_queue()
    assert _roq(cluster, "status").returncode == 0
    [monitor] = processes_with("monitor q1 --bind", str(cluster.tmp))
    os.kill(monitor, signal.SIGSTOP)
    try:
        shown = _roq(cluster, "status")
        assert shown.returncode == EXIT_NOT_SERVING, shown.stderr
        assert "NOT SERVING: host h1 is up but the monitor does not answer" in shown.stdout.decode()
        assert _roq(cluster, "status", "--json").returncode == EXIT_NOT_SERVING
    finally:
        with contextlib.suppress(ProcessLookupError):  # its host may have replaced it
            os.kill(monitor, signal.SIGCONT)
    wait_for(lambda: _roq(cluster, "status").returncode == 0, 30, "q1 serving again")


def test_sub_skips_a_services_requests_and_bad_input_exits_65(
    cluster: LocalCluster, tmp_path: Path
):
    """Item 5: `roq sub` of a queue that carries `roq call` requests printed their BSON; a bad
    --offsets file and a line longer than a message exited 1, which means "the GCM refused"."""
    cluster.start_with_queue()
    assert _roq(cluster, "call", "q1", "upper", "--no-wait", stdin="hello\n").returncode == 0
    assert _roq(cluster, "pub", "q1", "--acks", "leader", stdin="plain\n").returncode == 0
    read = _roq(cluster, "sub", "q1", "--from-beginning", "--count", "1", "--timeout", "30")
    assert read.returncode == 0, read.stderr
    assert read.stdout == b"plain\n"  # the request's record is not printed
    assert b"skipped 1 requests of services" in read.stderr, read.stderr

    offsets = tmp_path / "bad.offsets"
    offsets.write_bytes(b"\xe9 not json")
    bad = _roq(cluster, "sub", "q1", "--offsets", str(offsets), "--timeout", "5")
    assert bad.returncode == EXIT_DATAERR, bad.stderr
    assert f"offsets file {offsets} is unreadable".encode() in bad.stderr

    line = b"first\n" + b"x" * (10 << 20) + b"\nlast\n"  # a 10 MB line
    big = _roq(cluster, "pub", "q1", "--acks", "leader", stdin=line)
    assert big.returncode == EXIT_DATAERR, big.stderr
    assert b"stdin line 2 is longer than a message may be" in big.stderr, big.stderr
    assert b"the 1 lines before it were sent" in big.stderr


def test_count_below_1_is_bad_usage():
    done = subprocess.run(roq_command("sub", "q1", "--count", "-3"), env=child_environment(),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "--count" in done.stderr, done.stderr


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port with nothing listening: a ZooKeeper that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


def test_an_unreachable_zk_is_one_line_without_kazoos(refused_port: int):
    """Item 5: seven kazoo WARNING lines came before `roq: cannot reach ZooKeeper ...`."""
    done = subprocess.run(
        roq_command("sub", "q1", "--zk", f"127.0.0.1:{refused_port}", "--timeout", "3"),
        env={**child_environment(), "ROQ_SECURITY": "off"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "kazoo" not in done.stderr, done.stderr
    assert f"cannot reach ZooKeeper at 127.0.0.1:{refused_port}" in done.stderr, done.stderr


def test_analytics_over_a_missing_or_empty_directory_refuses_at_once(tmp_path: Path):
    """Item 5: the Spark job over nothing ran ~40 s and exited 0 with "every batch passed its
    CRC". Now it refuses before Spark starts (66, EX_NOINPUT), naming the directory."""
    pytest.importorskip("pyarrow")
    empty = tmp_path / "empty"
    (empty / "q1").mkdir(parents=True)  # a queue directory with no segment is still nothing
    for where, says in ((tmp_path / "missing", "does not exist"), (empty, "holds no log segment")):
        started = time.monotonic()
        done = subprocess.run(
            roq_command("analytics", "--log-dir", str(where), "--out", str(tmp_path / "out")),
            env=child_environment(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == EXIT_NOINPUT, done.stderr
        assert f"--log-dir {where} {says}" in done.stderr, done.stderr
        assert time.monotonic() - started < 30  # no Spark start (a loaded machine's CLI start)
        assert not (tmp_path / "out").exists()
