"""The rough edges a new user hit (issue 32), each through the `roq` commands a user types,
against a real cluster where one is needed: the refusal of a queue past a host's capacity names
the setting to raise, and the default capacity follows the machine."""

from __future__ import annotations

import subprocess

import pytest

from roq import limits
from roq.host import capacity
from roq.system import procstat
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster

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
