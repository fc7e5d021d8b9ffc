"""acks=all on an exchange that joined a running queue: what it confirms is on a replica from the
first message, so its host's death loses none of it (docs/guarantees.md §2)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from roq.client.locate import MonitorAddress
from roq.client.publisher import PublishError, PublishTimeout
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


def _recorded(cluster: LocalCluster) -> list[Any]:
    with cluster.admin() as admin:
        [queue] = admin.status().queues
    return [x for x in queue.exchanges if not x.lost]


def test_acks_all_refuses_rather_than_confirm_on_fewer_copies_than_min_insync(
    cluster: LocalCluster,
):
    """replicationFactor 2 (min.insync.copies 0: 2): a new queue gets its second exchange by
    itself, and acks=all confirms only what both copies hold. With the replica frozen (SIGSTOP)
    and no room for another exchange, a batch is not confirmed: it is refused after the wait,
    retriably, naming the copies missing. Thawed, acks=all confirms again."""
    settings = {"replicationFactor": 2, "exchange.max.perhost": 1}
    cluster.start_gcm()
    cluster.start_host("h1", **settings)
    cluster.start_host("h2", **settings)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", host="h1")
    wait_for(lambda: len(_recorded(cluster)) == 2, 30, "the queue's second exchange (the copy)")
    first = next(x for x in _recorded(cluster) if x.host == "h1")
    other = next(x for x in _recorded(cluster) if x.host == "h2")
    publisher, _ = cluster.publisher_on({first.front}, keep_others=False)
    try:
        wait_for(lambda: _confirmed(publisher, b"both copies"), 30, "acks=all with two copies")
        [frozen] = processes_with(other.exchange_id)
        os.kill(frozen, signal.SIGSTOP)
        try:
            publisher.send(b"one copy")
            with pytest.raises(PublishError) as refused:
                publisher.flush(timeout_s=30)
            assert "min.insync.copies=2" in str(refused.value), refused.value
            assert "queue q1" in str(refused.value), refused.value
        finally:
            os.kill(frozen, signal.SIGCONT)
        wait_for(lambda: _confirmed(publisher, b"again"), 40, "acks=all once the copy is back")
    finally:
        publisher.close()


def _confirmed(publisher: Any, payload: bytes) -> bool:
    """One acks=all message sent and confirmed (False: refused, or not confirmed in 5 s)."""
    publisher.send(payload)
    try:
        publisher.flush(timeout_s=5)
    except (PublishError, PublishTimeout):
        return False
    return True
