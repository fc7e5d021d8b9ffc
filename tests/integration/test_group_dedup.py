"""A consumer group's de-duplication by message id (docs/guarantees.md, "De-duplication by message
id") on a real cluster: two exchanges with no copy of each other's log (replicationFactor 1), so
the exchanges' windows cannot catch a message re-sent to the other one after its exchange died;
the group hands it out once, across a kill -9 of that exchange and of the monitor."""

from __future__ import annotations

import os
import signal

import pytest

from roq.client.consumer import Consumer
from roq.log import format as batchfmt
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration

SETTINGS = {"replicationFactor": 1, "exchange.max.perhost": 4, "work.slot.ms": 200}


def _exchanges(cluster: LocalCluster) -> dict[str, str]:
    """Exchange id → its front, of the live exchanges of q1."""
    with cluster.admin() as admin:
        [queue] = admin.status().queues
    return {x.fields()["Id"]: x.front for x in queue.exchanges if not x.lost}


def _send(cluster: LocalCluster, front: str, *messages: tuple[bytes, bytes | None]) -> None:
    """(payload, message id) pairs from a publisher placed on the exchange at `front`,
    confirmed (acks=leader: its log alone, it has no copy)."""
    publisher, _ = cluster.publisher_on({front}, acks="leader", keep_others=False)
    with publisher:
        for payload, message_id in messages:
            publisher.send(payload, b"k", message_id=message_id)
        publisher.flush(timeout_s=30)
        assert publisher.exchange == front, "moved off its exchange: re-run"


def _kill(cluster: LocalCluster, fragment: str) -> None:
    """kill -9 this cluster's process whose command line holds `fragment`; its host starts it
    again (same command line, same log)."""
    [pid] = processes_with(fragment, str(cluster.tmp))
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: processes_with(fragment, str(cluster.tmp)) not in ([], [pid]),
        30,
        f"{fragment} restarted",
    )


def _handed(consumer: Consumer, expected: int) -> list[bytes]:
    """`expected` deliveries (each acked and confirmed), then a bounded wait for one more
    (there must be none)."""
    found = []
    for delivery in consumer.deliveries(expected, timeout_s=30):
        found.append(delivery.payload)
        delivery.ack()
    for delivery in consumer.deliveries(1, timeout_s=3):
        found.append(delivery.payload)
        delivery.ack()
    consumer.flush()
    return found


def test_a_message_re_sent_to_an_exchange_without_its_copy_is_handed_to_the_group_once(
    cluster: LocalCluster,
):
    """The message goes to exchange A, the group hands it out and it is acked; A is killed
    (kill -9), and the message is sent again with its id to exchange B, as a publisher whose
    batch was appended but not confirmed sends it to the exchange it moves to. B has no copy of
    A's log, so it appends it: the group settles that copy as a duplicate. Then the same after a
    kill -9 of the monitor: its successor rebuilt the window from its state log."""
    cluster.start_with_queue(2, **SETTINGS)
    with cluster.admin() as admin:
        admin.create_exchange("q1", "dedup-tx-h2", host="h2")
    wait_for(lambda: len(_exchanges(cluster)) == 2, 30, "the queue's two exchanges")
    (a, front_a), (_, front_b) = sorted(_exchanges(cluster).items())
    first, second = batchfmt.new_message_id(), batchfmt.new_message_id()
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        _send(cluster, front_a, (b"first on A", first))
        assert _handed(consumer, 1) == [b"first on A"]

        _kill(cluster, a)
        wait_for(lambda: a in _exchanges(cluster), 30, "exchange A back on its log")
        _send(cluster, front_b, (b"first again on B", first), (b"marker", None))
        assert _handed(consumer, 1) == [b"marker"]
        with cluster.admin() as admin:
            assert admin.get_group("q1", "g").duplicates == 1

        _send(cluster, front_a, (b"second on A", second))
        assert _handed(consumer, 1) == [b"second on A"]
        _kill(cluster, "monitor q1 --bind")
        _send(cluster, front_b, (b"second again on B", second), (b"marker 2", None))
        assert _handed(consumer, 1) == [b"marker 2"]
