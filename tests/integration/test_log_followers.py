"""Log followers (log.followers, issue 30): a queue's copies live on a host that runs none of its
exchanges, so one exchange is enough for replicationFactor copies on as many hosts. Real hosts,
real kill -9s (docs/guarantees.md §6, "Log followers")."""

from __future__ import annotations

import pytest

from roq.client.live import monitor_status
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.protocol.messages.admin import RecordedExchange
from roq.protocol.messages.control import MonitorStatus
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

COUNT = 400
SETTINGS = {
    "replicationFactor": 2,
    "log.followers": 1,
    "exchange.max.perhost": 4,
    "exchange.warmup": 500,
}


def _recorded(cluster: LocalCluster) -> list[RecordedExchange]:
    with cluster.admin() as admin:
        queues = [q for q in admin.status().queues if q.info.name == "q1"]
    return [x for x in queues[0].exchanges if not x.lost] if queues else []


def _live(cluster: LocalCluster) -> MonitorStatus | None:
    """q1's monitor's STATUS (None while it does not answer: it may be moving)."""
    with cluster.admin() as admin:
        queues = [q for q in admin.status().queues if q.info.name == "q1"]
    return monitor_status(queues[0].info.monitor_host) if queues else None


def _follower_live(cluster: LocalCluster, host: str) -> bool:
    """A follower recorded on `host`, and its monitor hears it."""
    followers = [x.exchange_id for x in _recorded(cluster) if x.follower and x.host == host]
    live = _live(cluster) if followers else None
    return live is not None and any(
        x.exchange_id in followers and x.follower for x in live.exchanges
    )


def _in_sync(cluster: LocalCluster) -> int:
    """Copies in sync of the queue's one exchange's log, as the monitor last heard."""
    live = _live(cluster)
    exchanges = [x for x in live.exchanges if not x.follower] if live else []
    return min((x.in_sync for x in exchanges), default=0)


def test_a_follower_holds_the_copy_acks_all_waits_for_and_serves_it_once_the_leader_is_lost(
    cluster: LocalCluster,
):
    """R=2 with one follower: the queue has one exchange (h1) and a follower (h2), never a
    second exchange; acks=all confirms once the follower holds each batch; kill -9 of h1 (the
    monitor's host and the exchange's): a new subscriber reads every confirmed message from the
    follower's copy, in order."""
    cluster.start_gcm(**{"host.loss.grace": 500})
    h1 = cluster.start_host("h1", **SETTINGS)
    cluster.start_host("h2", **SETTINGS)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
    wait_for(lambda: _follower_live(cluster, "h2"), 30, "q1's log follower on h2")
    wait_for(lambda: _in_sync(cluster) == 2, 20, "the exchange's log in sync on 2 copies")
    exchanges = [x for x in _recorded(cluster) if not x.follower]
    assert [x.host for x in exchanges] == ["h1"], exchanges  # the follower is the copy
    publisher = Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1)
    try:
        for n in range(COUNT):
            publisher.send(f"m{n}".encode())
        publisher.flush(timeout_s=30)  # acks=all: on the follower too
    finally:
        publisher.close()
    assert [x.host for x in _recorded(cluster) if not x.follower] == ["h1"]
    shown = cluster.cli("status", "--gcm", cluster.gcm, timeout_s=60)
    assert "log follower" in shown.stdout and "copies held: h1-" in shown.stdout, shown.stdout
    cluster.kill(h1)  # kill -9 of the host, its monitor and its exchange

    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = [bytes(r.payload) for r in subscriber.messages(count=COUNT, timeout_s=60)]
    assert got == [f"m{n}".encode() for n in range(COUNT)], cluster.logs()


def test_a_lost_follower_is_replaced_at_once_and_acks_all_goes_on(cluster: LocalCluster):
    """kill -9 of the follower's host (h2): the monitor asks for another follower, which the
    GCM puts on h3 (no process of the queue there); acks=all confirms again once it holds the
    log, and a subscriber reads everything confirmed before and after."""
    cluster.start_gcm(**{"host.loss.grace": 500})
    cluster.start_host("h1", **SETTINGS)
    h2 = cluster.start_host("h2", **SETTINGS)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
    wait_for(lambda: _follower_live(cluster, "h2"), 30, "q1's log follower on h2")
    sent = []
    publisher = Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1)
    try:
        for n in range(COUNT):
            sent.append(f"a{n}".encode())
            publisher.send(sent[-1])
        publisher.flush(timeout_s=30)
        cluster.start_host("h3", **SETTINGS)
        cluster.wait_ready(hosts=3)
        cluster.kill(h2)
        wait_for(lambda: _follower_live(cluster, "h3"), 40, "a new log follower on h3")
        for n in range(COUNT):
            sent.append(f"b{n}".encode())
            publisher.send(sent[-1])
        publisher.flush(timeout_s=30)  # refused (retriable) until the new follower holds it
    finally:
        publisher.close()
    assert [x.host for x in _recorded(cluster) if not x.follower] == ["h1"]
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = [bytes(r.payload) for r in subscriber.messages(count=len(sent), timeout_s=30)]
    assert got == sent
