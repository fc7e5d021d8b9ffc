"""TTL and delay enforced on a real cluster (docs/guarantees.md, "TTL and delay"): an expired
message reaches no application (fan-out, a consumer group, request/response, whose task ends
`expired`), and a delayed one none before its not-before time (fan-out, holding the rest of its
stream; a group, letting the rest of the slot go on; request/response). Times are wall-clock µs,
as the publisher sets them; each delayed delivery is measured against its not-before time."""

from __future__ import annotations

import time

import pytest

from roq.client.consumer import Consumer
from roq.client.publisher import Publisher
from roq.client.requests import Requester, TaskExpired
from roq.client.subscriber import Subscriber
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

WORK = {"work.slot.messages": 100, "work.slot.ms": 100, "work.lease.ms": 2000}
# long enough that a delivery at once is caught, and that what is not delayed comes before it,
# on a loaded machine
DELAY_US = 3_000_000
LATE_S = 30.0  # a delayed message comes within this of its time (generous: 2 shared cores)


def _now_us() -> int:
    return time.time_ns() // 1000


def _publish(cluster: LocalCluster) -> int:
    """Into q1, in this order: a plain message, one expired already, one that expires in an
    hour, one delayed by DELAY_US and one behind it of its stream (key k), one of another key.
    Returns the delayed one's not-before time."""
    with Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=0) as publisher:
        now = _now_us()  # once placed: its start may take seconds on a loaded machine
        due = now + DELAY_US
        publisher.send(b"plain", b"k")
        publisher.send(b"expired", b"k", expires_at_us=now - 1_000_000)
        publisher.send(b"alive", b"k", expires_at_us=now + 3_600_000_000)
        publisher.send(b"delayed", b"k", not_before_us=due)
        publisher.send(b"behind", b"k")
        publisher.send(b"other", b"o")
        publisher.flush()
    return due


def test_a_subscriber_drops_expired_messages_and_holds_a_delayed_one_with_its_stream(
    cluster: LocalCluster,
):
    cluster.start_with_queue()
    seen: list[tuple[bytes, int]] = []
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        due = _publish(cluster)
        for record in subscriber.messages(5, timeout_s=LATE_S + DELAY_US / 1e6):
            seen.append((record.payload, _now_us()))
        expired = subscriber.expired
    order = [payload for payload, _ in seen]
    assert sorted(order) == sorted([b"plain", b"alive", b"delayed", b"behind", b"other"]), order
    assert expired == 1
    at = dict(seen)
    assert due <= at[b"delayed"] <= at[b"behind"], "the delayed one came early, or not first"
    assert at[b"delayed"] - due < LATE_S * 1e6
    # its stream waited for it; the other stream did not
    assert order.index(b"plain") < order.index(b"alive") < order.index(b"delayed")
    assert order.index(b"other") < order.index(b"delayed")
    assert at[b"other"] < due


def test_a_group_drops_expired_messages_and_hands_out_a_delayed_one_at_its_time(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    seen: dict[bytes, tuple[int, int]] = {}
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        due = _publish(cluster)
        for delivery in consumer.deliveries(5, timeout_s=LATE_S):
            seen[delivery.payload] = (_now_us(), delivery.deliveries)
            delivery.ack()
        consumer.flush()
        stats = dict(consumer.stats)
    assert sorted(seen) == sorted([b"plain", b"alive", b"delayed", b"behind", b"other"])
    assert stats["expired"] == 1 and stats["deferred"] >= 1
    at_delayed, deliveries = seen[b"delayed"]
    assert due <= at_delayed < due + LATE_S * 1e6
    assert deliveries == 1, "putting it off counted as a delivery"
    # not an ordered group: the rest of its slot went on without waiting for it
    assert seen[b"behind"][0] < due and seen[b"other"][0] < due
    with cluster.admin() as admin:
        wait_for(lambda: admin.get_group("q1", "g").lag == 0, 20, "every message settled")
        assert admin.get_group("q1", "g").acked == 5  # the expired one settled, not acked


def test_an_ordered_group_hands_out_nothing_after_a_delayed_message_before_it(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    seen: list[tuple[bytes, int]] = []
    with Consumer("q1", "g", gcm=cluster.gcm, ordered=True) as consumer:
        due = _publish(cluster)
        for delivery in consumer.deliveries(5, timeout_s=LATE_S):
            seen.append((delivery.payload, _now_us()))
            delivery.ack()
        consumer.flush()
    order = [payload for payload, _ in seen]
    assert order[:3] == [b"plain", b"alive", b"delayed"], order  # in the log's order
    assert sorted(order[3:]) == [b"behind", b"other"], order
    assert all(due <= at < due + LATE_S * 1e6 for _, at in seen[2:]), (due, seen)


def test_a_request_expired_before_a_worker_took_it_ends_expired_and_never_runs(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    ran: list[bytes] = []

    def handler(payload: bytes) -> bytes:
        ran.append(payload)
        return payload

    with cluster.worker("echo", handler), Requester("q1", gcm=cluster.gcm) as requester:
        stale = requester.submit("echo", b"stale", expires_at_us=_now_us() - 1_000_000)
        fresh = requester.submit("echo", b"fresh", expires_at_us=_now_us() + 3_600_000_000)
        assert fresh.result(LATE_S) == b"fresh"
        with pytest.raises(TaskExpired, match="expired"):
            stale.result(LATE_S)
        assert "before a worker took it" in stale.view.error
    assert ran == [b"fresh"]


def test_a_delayed_request_is_not_started_before_its_time(cluster: LocalCluster):
    cluster.start_with_queue(**WORK)
    started: list[int] = []

    def handler(payload: bytes) -> bytes:
        started.append(_now_us())
        return payload.upper()

    with cluster.worker("echo", handler), Requester("q1", gcm=cluster.gcm) as requester:
        due = _now_us() + DELAY_US
        task = requester.submit("echo", b"later", not_before_us=due)
        assert task.result(LATE_S + DELAY_US / 1e6) == b"LATER"
    assert len(started) == 1
    assert due <= started[0] < due + LATE_S * 1e6
