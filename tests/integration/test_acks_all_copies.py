"""acks=all on an exchange that joined a running queue: what it confirms is on a replica from the
first message, so its host's death loses none of it (docs/guarantees.md §2)."""

from __future__ import annotations

from typing import Any

import pytest

from roq.client.locate import MonitorAddress
from roq.client.subscriber import Subscriber
from roq.protocol.commands import ChildCommand
from roq.protocol.ports import MonitorPort
from roq.testing.cluster import LocalCluster, processes_with, wait_for
from roq.transport import new_context
from roq.transport.rpc import Requester

pytestmark = pytest.mark.integration

COUNT = 300


def _monitor_status(queue: dict[str, Any]) -> dict[str, Any]:
    context = new_context()
    endpoint = MonitorAddress(queue["Monitor_host"]).at(MonitorPort.CONTROL)
    requester = Requester(context, endpoint, timeout_ms=2000)
    try:
        return dict(requester.request({"CMD": int(ChildCommand.PING)})["STATUS"])
    finally:
        requester.close()
        context.term()


def test_acks_all_on_a_newly_joined_exchange_survives_its_hosts_death(cluster: LocalCluster):
    # The monitor republishes its list (and used to assign replicas) only every 30 s here: the
    # exchange that joins must be given its replica when it joins, not at the next period.
    settings = {"replicationFactor": 2}
    cluster.start_gcm()
    cluster.start_host("h1", **settings, **{"monitor.list.period": 30_000})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    h2 = cluster.start_host("h2", **settings)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        joined = admin.create_exchange("q1", "tx-h2", host="h2").exchange.fields()
        [queue] = admin.status().queues
    publisher, _ = cluster.publisher_on({joined["Front"]}, keep_others=False)
    try:
        for n in range(COUNT):
            publisher.send(f"m{n}".encode())
        publisher.flush()  # acks=all: every one confirmed
    finally:
        publisher.close()
    cluster.kill(h2)  # kill -9 of the host and its exchange: nothing restarts it
    assert not processes_with(joined["Id"])

    def copy_announced() -> bool:
        copies = _monitor_status(queue.fields())["Copies"]
        return any(c["Id"] == joined["Id"] for c in copies)

    wait_for(copy_announced, 10, f"a copy of {joined['Id']}'s log (acks=all confirmed it)")
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = [bytes(r.payload) for r in subscriber.messages(count=COUNT, timeout_s=20)]
    assert got == [f"m{n}".encode() for n in range(COUNT)]
