"""A GCM stalled past its ZooKeeper session (SIGSTOP) comes back deposed, with a new session.
It must leave the new leader's znode alone: clients find the GCM through it. Found by the fault
tests (tests/faults, SIGSTOP of a machine): the deposed GCM deleted it, and every client that
looked up the GCM in ZooKeeper got "no GCM leads the cluster" while the new leader served."""

from __future__ import annotations

import signal
import time

import pytest

from roq.client.admin import AdminClient
from roq.coordination.discovery import leader_admin_endpoint
from roq.protocol.ports import GcmPort, endpoint_at
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

WATCH_S = 3.0  # how long the new leader's znode must stay once the deposed GCM runs again


def test_a_gcm_stalled_past_its_session_leaves_the_new_leaders_znode(
    cluster: LocalCluster,
) -> None:
    first = cluster.start_gcm()
    with AdminClient(gcm=cluster.gcm, timeout_ms=1000, retries=30) as admin:
        assert admin.list_queues() == []
    second = cluster.start_gcm()
    second_admin = endpoint_at("127.0.0.1", int(second.name.split("-")[1]), GcmPort.ADMIN)

    def leader() -> str:
        return leader_admin_endpoint(cluster.zk, cluster.namespace, cluster.zk_auth)

    first.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: leader() == second_admin, 30, f"the standby leads\n{cluster.logs()}")
    finally:
        first.process.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "no longer acting as leader" in first.log_text(),
        20,
        f"the first GCM deposed\n{first.log_text()[-3000:]}",
    )
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:  # the deposed GCM withdraws within a few 0.1 s polls
        assert leader() == second_admin, cluster.logs()
        time.sleep(0.2)
    with AdminClient(zk=cluster.zk, namespace=cluster.namespace) as admin:
        assert admin.list_queues() == []
