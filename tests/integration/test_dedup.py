"""De-duplication by message id (docs/guarantees.md §17) on a real cluster: at the exchange
(a batch whose ids it appended within dedup.window.ms is acknowledged, not appended), across
its restart (the window is rebuilt from its log), outside the window (appended again), and at
the exchange holding a copy of another's log (where a publisher moving off that exchange sends
its unconfirmed batches)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from roq.client.consumer import Consumer
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.log import format as batchfmt
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration


def _start(cluster: LocalCluster, **host: object) -> str:
    cluster.start_gcm()
    cluster.start_host("h1", **host)
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    return "q1"


def _send(cluster: LocalCluster, queue: str, payload: bytes, message_id: bytes | None) -> None:
    """One message from a publisher of its own (a new producer, as an application that
    restarted and sends again), confirmed by the exchange."""
    with Publisher(queue, gcm=cluster.gcm, acks="leader", linger_ms=0) as publisher:
        publisher.send(payload, b"k", message_id=message_id)
        publisher.flush(timeout_s=20)
        assert publisher.confirmed_batches == publisher.sent_batches == 1


def _logged(cluster: LocalCluster, queue: str, expected: int) -> list[bytes]:
    """The payloads the queue's log holds, read from its beginning: `expected` of them, then
    a bounded wait for one more (there must be none)."""
    replay = Subscriber(queue, gcm=cluster.gcm, start="beginning")
    try:
        found = [r.payload for r in replay.messages(expected, timeout_s=20)]
        found += [r.payload for r in replay.messages(1, timeout_s=2)]
    finally:
        replay.close()
    return found


def _exchange_pid(cluster: LocalCluster, queue: str) -> tuple[str, int]:
    with cluster.admin() as admin:
        status = admin.status()
    [exchange] = next(q.fields() for q in status.queues if q.info.name == queue)["Exchanges"]
    [pid] = processes_with(exchange["Id"])
    return exchange["Id"], pid


@pytest.fixture
def queue(cluster: LocalCluster) -> Iterator[str]:
    yield _start(cluster)


def test_an_id_sent_again_within_the_window_is_acknowledged_and_appended_once_even_after_a_restart(
    cluster: LocalCluster, queue: str
):
    first, other = batchfmt.new_message_id(), batchfmt.new_message_id()
    _send(cluster, queue, b"first", first)
    _send(cluster, queue, b"first again", first)  # acknowledged, not appended
    _send(cluster, queue, b"other", other)
    _send(cluster, queue, b"plain", None)  # no id: never de-duplicated
    _send(cluster, queue, b"plain", None)
    assert _logged(cluster, queue, 4) == [b"first", b"other", b"plain", b"plain"]

    ident, pid = _exchange_pid(cluster, queue)
    os.kill(pid, signal.SIGKILL)  # its host starts it again, on the same log
    wait_for(lambda: processes_with(ident) not in ([], [pid]), 30, "the exchange restarted")
    _send(cluster, queue, b"first after the restart", first)  # the rebuilt window has it
    _send(cluster, queue, b"marker", batchfmt.new_message_id())
    assert _logged(cluster, queue, 5) == [b"first", b"other", b"plain", b"plain", b"marker"]


def test_an_id_sent_again_after_the_window_is_appended_again(cluster: LocalCluster):
    window_s = 1.5
    queue = _start(cluster, **{"dedup.window.ms": int(window_s * 1000)})
    same = batchfmt.new_message_id()
    _send(cluster, queue, b"first", same)
    sent_at = time.monotonic()
    # Send it again every 0.2 s until a copy is appended: those sent within the window are not
    # (its buckets expire up to dedup_bucket_ms late), the first one after it is.
    tries: dict[bytes, float] = {}
    live = Subscriber(queue, gcm=cluster.gcm)
    try:
        deadline = sent_at + 20
        appended: list[bytes] = []
        while not appended and time.monotonic() < deadline:
            payload = b"again %d" % len(tries)
            tries[payload] = time.monotonic() - sent_at
            _send(cluster, queue, payload, same)
            appended = [r.payload for r in live.messages(1, timeout_s=0.2)]
    finally:
        live.close()
    assert appended, f"no copy appended within 20 s of {len(tries)} sent"
    assert tries[appended[0]] >= window_s, f"appended {tries[appended[0]]:.2f} s after the first"
    assert _logged(cluster, queue, 2) == [b"first", appended[0]]


def test_an_id_sent_to_the_exchange_holding_its_copy_is_handed_to_a_group_once(
    cluster: LocalCluster,
):
    """Two exchanges, each copying the other's log (replicationFactor 2, acks=all): a message
    confirmed on the first, sent again with its id to the second (as a publisher re-sends its
    unconfirmed batches after a fail-over), is not appended there: the group gets it once."""
    settings = {"replicationFactor": 2, "exchange.max.perhost": 1}
    cluster.start_gcm()
    cluster.start_host("h1", **settings)
    cluster.start_host("h2", **settings)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", host="h1")

    def recorded() -> list[object]:
        with cluster.admin() as admin:
            [queue] = admin.status().queues
        return [x for x in queue.exchanges if not x.lost]

    wait_for(lambda: len(recorded()) == 2, 30, "the queue's second exchange (the copy)")
    fronts = [x.front for x in recorded()]  # type: ignore[attr-defined]
    same = batchfmt.new_message_id()
    first, _ = cluster.publisher_on({fronts[0]}, keep_others=False)
    with first:
        first.send(b"first", message_id=same)
        first.flush(timeout_s=30)  # acks=all: on both copies
    second, _ = cluster.publisher_on({fronts[1]}, keep_others=False)
    with second:
        second.send(b"first again", message_id=same)
        second.flush(timeout_s=30)  # confirmed, not appended
        second.send(b"marker", message_id=batchfmt.new_message_id())
        second.flush(timeout_s=30)
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        handed = [d.payload for d in consumer.deliveries(2, timeout_s=30)]
        handed += [d.payload for d in consumer.deliveries(1, timeout_s=3)]
    assert sorted(handed) == [b"first", b"marker"]
