"""Elasticity on a real cluster: scale-out under load, the capacity limit, scale-in, rules.

Thresholds are lowered through -D settings so that each scenario runs in seconds: exchanges are
sized for 200 KB/s and the implicit rule fires at half of that. Publishers and subscribers run in
this process; the monitor, its exchanges and the GCM are real processes.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest
from test_dataplane import Collector, _assert_exact

from roq.client.live import monitor_status
from roq.client.publisher import Publisher
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

FAST = {
    "exchange.warmup": 200,
    "exchange.max.throughput": 200_000,  # bytes/s
    "scaling.highwater": 0.5,  # the implicit rule: every exchange above 100 KB/s
    "scaling.window.ms": 1000,
    "scaling.cooldown.ms": 3000,
    "scaling.lowwater": 0.3,
    "scaling.lowwater.ms": 60_000,
    "relocate.cooldown": 2000,
}


def _start(cluster: LocalCluster, queue: str = "q1", **overrides: Any) -> str:
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 3, **FAST, **overrides})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue(queue)
    return queue


def _live(cluster: LocalCluster, queue: str) -> dict[str, Any]:
    with cluster.admin() as admin:
        record = next(q for q in admin.list_queues() if q["Name"] == queue)
    status = monitor_status(record["Monitor_host"])
    assert status is not None, "monitor unreachable"
    return status


def _events(cluster: LocalCluster, queue: str) -> list[str]:
    return [e["Event"] for e in _live(cluster, queue)["Scaling"]["Events"]]


class Load:
    """Publishers sending at roughly fixed rates from the test thread, counting what they sent."""

    def __init__(self, cluster: LocalCluster, queue: str, sizes: list[int]):
        self.publishers = [Publisher(queue, gcm=cluster.gcm, linger_ms=1) for _ in sizes]
        self.sizes = sizes
        self.sent: collections.Counter[bytes] = collections.Counter()

    def step(self, messages_each: int = 2) -> None:
        """One 20 ms step: `messages_each` messages from each publisher."""
        for publisher, size in zip(self.publishers, self.sizes, strict=True):
            if size:
                for _ in range(messages_each):
                    publisher.send(b"x" * size, b"k")
                    self.sent[publisher.producer_id] += 1
        time.sleep(0.02)

    def run_until(self, done: Any, timeout_s: float, what: str, logs: Any) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}\n{logs()}")
            self.step()

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()

    def expected(self) -> dict[tuple[bytes, bytes], int]:
        return {(pid, b"k"): n for pid, n in self.sent.items()}


def test_load_ramp_adds_an_exchange_and_moves_the_heaviest_publisher(cluster: LocalCluster):
    queue = _start(cluster)
    collector = Collector(cluster, queue)
    collector.start()
    load = Load(cluster, queue, [1000, 1000, 50, 50])  # ~2 × 90 KB/s + 2 × 4 KB/s
    first = load.publishers[0].exchange
    assert all(p.exchange == first for p in load.publishers)
    load.run_until(
        lambda: any(p.exchange != first for p in load.publishers[:2]),
        25,
        "a heavy publisher on a new exchange",
        cluster.logs,
    )
    for _ in range(50):  # one more second of load on both exchanges
        load.step()
    live = _live(cluster, queue)
    assert len(live["Exchanges"]) == 2, "one exchange added, not more"
    moved = [p for p in load.publishers if p.exchange != first]
    assert sum(1 for p in moved if p in load.publishers[:2]) == 1, "one heavy moved, one stayed"
    events = [e["Event"] for e in live["Scaling"]["Events"]]
    assert events[:3] == ["scale_out", "exchange_added", "publisher_moved"], events
    load.close()
    wait_for(lambda: collector.count >= sum(load.sent.values()), 15, "everything delivered")
    time.sleep(0.3)
    collector.finish()
    _assert_exact(collector, load.expected())
