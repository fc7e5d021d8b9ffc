"""Queue lifecycle through the `roq` CLI on a real cluster: processes really start and stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from typing import Any

import pytest

from roq.client.admin import AdminRefused
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import Registry
from roq.errors import EXIT_NOT_SERVING
from roq.protocol.ports import EXCHANGE_WIDTH, ExchangePort, MonitorPort, port_at
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration


def _roq(cluster: LocalCluster, *args: str, codes: tuple[int, ...] = (0,)) -> str:
    result = cluster.cli(*args, "--gcm", cluster.gcm, timeout_s=60)
    assert result.returncode in codes, f"roq {' '.join(args)}: {result.stderr}\n{cluster.logs()}"
    return result.stdout


def _status(cluster: LocalCluster) -> dict[str, Any]:
    """The status, also while a queue is NOT SERVING (exit 5, after printing it)."""
    return dict(json.loads(_roq(cluster, "status", "--json", codes=(0, EXIT_NOT_SERVING))))


@pytest.fixture
def running(cluster: LocalCluster) -> LocalCluster:
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 8})
    cluster.wait_ready()
    return cluster


def test_create_list_stop_start_delete_round_trip(running: LocalCluster):
    _roq(running, "queue", "create", "orders")
    assert len(running.queue_processes("orders")) == 2  # its monitor and first exchange
    [queue] = json.loads(_roq(running, "queue", "list", "--json"))
    assert (queue["Name"], queue["State"], queue["Host"]) == ("orders", "RUNNING", "h1")

    _roq(running, "queue", "stop", "orders")
    wait_for(lambda: not running.queue_processes("orders"), 10, "processes gone after stop")
    assert json.loads(_roq(running, "queue", "list", "--json"))[0]["State"] == "STOPPED"

    _roq(running, "queue", "start", "orders")
    assert len(running.queue_processes("orders")) == 2
    assert json.loads(_roq(running, "queue", "list", "--json"))[0]["State"] == "RUNNING"

    _roq(running, "queue", "delete", "orders")
    wait_for(lambda: not running.queue_processes("orders"), 10, "processes gone after delete")
    assert json.loads(_roq(running, "queue", "list", "--json")) == []


def test_create_twice_and_unknown_host_are_clear_failures(running: LocalCluster):
    _roq(running, "queue", "create", "q1")
    again = running.cli("queue", "create", "q1", "--gcm", running.gcm)
    assert again.returncode == 1 and "already exists" in again.stderr
    nowhere = running.cli("queue", "create", "q2", "--host", "no-such-host", "--gcm", running.gcm)
    assert nowhere.returncode == 1 and "no-such-host" in nowhere.stderr
    bad_name = running.cli("queue", "create", "bad name!", "--gcm", running.gcm)
    assert bad_name.returncode == 1 and "name" in bad_name.stderr


def test_standby_gcm_serves_the_same_queues_after_the_leader_is_killed(running: LocalCluster):
    _roq(running, "queue", "create", "q1")
    _roq(running, "queue", "create", "q2")
    standby = running.start_gcm()
    leader = running.daemons[0]
    wait_for(lambda: len(_candidates(running)) == 2, 10, "the standby in the election")
    os.killpg(leader.process.pid, signal.SIGKILL)
    leader.process.wait(timeout=10)
    killed = time.monotonic()
    args = ("queue", "list", "--json", "--zk", running.zk, "--namespace", running.namespace)

    def listed() -> list[str]:
        result = running.cli(*args, timeout_s=30)
        assert result.returncode == 0, result.stderr
        return sorted(q["Name"] for q in json.loads(result.stdout))

    assert wait_for(lambda: listed() == ["q1", "q2"], 40, f"standby\n{running.logs()}")
    assert time.monotonic() - killed < 4 + 12  # session timeout 4 s, a 5 s request timeout
    assert standby.process.poll() is None


def _candidates(cluster: LocalCluster) -> list[str]:
    """The GCMs standing in the leader election (its lock's participants)."""
    client = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    try:
        return list(client.get_children(Paths(cluster.namespace).election))
    finally:
        session.close(client)


def test_a_killed_host_disappears_from_status(running: LocalCluster):
    second = running.start_host("h2")
    running.wait_ready(hosts=2)
    assert {h["Name"] for h in _status(running)["Hosts"]} == {"h1", "h2"}
    running.kill(second)
    wait_for(
        lambda: {h["Name"] for h in _status(running)["Hosts"]} == {"h1"},
        15,
        "h2 gone from roq status (session timeout 4 s)",
    )


def _claimed_ports(status: dict[str, Any]) -> list[int]:
    ports = []
    for queue in status["Queues"]:
        for address in (queue["Monitor_host"], queue["Stat_Monitor_host"]):
            ports.append(int(address.rsplit(":", 1)[1]))
        ports += [int(x["Front"].rsplit(":", 1)[1]) for x in queue["Exchanges"]]
    return ports


def test_ports_are_reused_without_collisions(running: LocalCluster):
    for n in range(5):
        _roq(running, "queue", "create", f"p{n}")
    _roq(running, "queue", "delete", "p1")
    _roq(running, "queue", "delete", "p3")
    _roq(running, "queue", "create", "p5")
    _roq(running, "queue", "create", "p6")
    ports = _claimed_ports(_status(running))
    assert len(ports) == len(set(ports)) == 5 * 3


def test_a_port_taken_by_another_program_is_skipped_and_reported(running: LocalCluster):
    blocker = socket.socket()
    try:
        probe = running.cli("queue", "create", "first", "--gcm", running.gcm)
        assert probe.returncode == 0
        status = _status(running)
        monitor_port = int(status["Queues"][0]["Monitor_host"].rsplit(":", 1)[1])
        _roq(running, "queue", "delete", "first")
        squat = port_at(monitor_port, MonitorPort.PLACEMENT)  # inside the freed monitor block
        blocker.bind(("127.0.0.1", squat))
        blocker.listen()
        _roq(running, "queue", "create", "second")
        second = _status(running)["Queues"][0]
        assert int(second["Monitor_host"].rsplit(":", 1)[1]) != monitor_port
        assert "in use" in running.logs()
    finally:
        blocker.close()


def _port_claims(cluster: LocalCluster, host: str) -> dict[int, dict[str, Any]]:
    client = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    try:
        return Registry(client, Paths(cluster.namespace)).port_claims(host)
    finally:
        session.close(client)


def test_a_second_host_with_a_live_name_exits_75_and_leaves_the_claims(running: LocalCluster):
    _roq(running, "queue", "create", "q1")
    claims = _port_claims(running, "h1")
    assert len(claims) == 3  # the monitor's, the stat monitor's and the exchange's blocks
    twin = running.start_host("h1")  # same name, its own hcm.port
    assert twin.process.wait(timeout=20) == 75, twin.log_text()
    last = twin.log_text().strip().splitlines()[-1]
    assert last.startswith("roq: host name 'h1' is already registered by pid "), last
    assert _port_claims(running, "h1") == claims
    [host] = _status(running)["Hosts"]
    assert host["Name"] == "h1"  # the live host's record survived the twin's exit
    _roq(running, "queue", "create", "q2")  # and it still serves
    assert len(running.queue_processes("q1")) == 2


def test_a_host_restarted_after_kill_9_releases_its_old_claims(running: LocalCluster):
    _roq(running, "queue", "create", "q1")
    old_claims = _port_claims(running, "h1")
    assert len(old_claims) == 3
    running.kill(running.daemons[1])
    wait_for(lambda: not _status(running)["Hosts"], 15, "h1's session expired (4 s)")
    restarted = running.start_host("h1")
    running.wait_ready()
    # The host registers its name before it releases the old claims (until it owns the name they
    # may belong to a live twin), so registration alone does not mean the release is done.
    # h1.log is appended to, so the first run's line is there too.
    wait_for(lambda: restarted.log_text().count("serving on") == 2, 15, "the restarted h1 serving")
    assert restarted.log_text().count("left by a previous run") == 3
    # It then re-adopts q1 (restart is resume) on its recorded ports, free again: claimed anew.
    wait_for(lambda: "re-adopted queue q1" in restarted.log_text(), 15, "q1 re-adopted")
    assert _port_claims(running, "h1") == old_claims


def _queue_names(cluster: LocalCluster) -> list[str]:
    return sorted(q["Name"] for q in json.loads(_roq(cluster, "queue", "list", "--json")))


def test_a_create_the_host_refuses_is_reported_and_rolled_back(cluster: LocalCluster):
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 1})
    cluster.wait_ready()
    _roq(cluster, "queue", "create", "q1")
    refused = cluster.cli("queue", "create", "q2", "--host", "h1", "--gcm", cluster.gcm)
    assert refused.returncode == 1
    assert "exchange.max.perhost=1" in refused.stderr and "q2 not created" in refused.stderr
    assert _queue_names(cluster) == ["q1"]  # no q2 record left in CREATING
    gone = cluster.cli("queue", "delete", "q2", "--gcm", cluster.gcm)
    assert gone.returncode == 1 and "not registered" in gone.stderr
    _roq(cluster, "queue", "delete", "q1")
    _roq(cluster, "queue", "create", "q2")  # a fresh create works once a slot is free
    assert _queue_names(cluster) == ["q2"]


def test_a_create_whose_exchange_cannot_bind_leaves_nothing_behind(cluster: LocalCluster):
    cluster.start_gcm()
    exchange_base = cluster.ports.take(EXCHANGE_WIDTH)
    blocker = socket.socket()
    # the only exchange block is unusable
    blocker.bind(("127.0.0.1", port_at(exchange_base, ExchangePort.BACK)))
    blocker.listen()
    try:
        cluster.start_host("h1", **{"ports.max.perkind": 1, "exchange.base.port": exchange_base})
        cluster.wait_ready()
        with cluster.admin() as admin:
            with pytest.raises(AdminRefused, match="no free exchange port block") as raised:
                admin.create_queue("q1")
            assert raised.value.reason == "host_failed"
            assert admin.list_queues() == []
        assert not cluster.queue_processes("q1"), "the monitor started for q1 was stopped"
        assert _port_claims(cluster, "h1") == {}
    finally:
        blocker.close()
    _roq(cluster, "queue", "create", "q1")
    assert len(cluster.queue_processes("q1")) == 2
