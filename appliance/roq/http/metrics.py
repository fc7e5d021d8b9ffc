"""`GET /metrics`: the gateway's counters in the Prometheus text format (prometheus_client),
in a registry of its own (not the library's global one, which would also export whatever
else the process imported)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from roq.http.index import TopicIndex

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(
        self, index: TopicIndex, replaced: Callable[[], int], read: Callable[[], int] = lambda: 0
    ):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "roq_http_requests", "Requests answered, by endpoint and status.",
            ["endpoint", "status"], registry=self.registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "roq_http_request_seconds", "Time to answer a request (long polls included).",
            ["endpoint"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30),
        )  # fmt: skip
        self.published = Counter(
            "roq_http_published_messages", "Messages stored by publishes.", registry=self.registry
        )
        topics = Gauge(
            "roq_http_index_topics", "Topics with messages in this gateway's index.",
            registry=self.registry,
        )  # fmt: skip
        topics.set_function(lambda: len(index.messages))
        held = Gauge(
            "roq_http_index_messages", "Messages held in this gateway's index.",
            registry=self.registry,
        )  # fmt: skip
        held.set_function(lambda: index.count)
        failed = Gauge(
            "roq_http_publishers_replaced", "Failed publishers this gateway replaced.",
            registry=self.registry,
        )  # fmt: skip
        failed.set_function(replaced)
        from_logs = Gauge(
            "roq_http_log_messages_read", "Messages this gateway read from its queues' logs "
            "since it started (after its snapshot's position).", registry=self.registry,
        )  # fmt: skip
        from_logs.set_function(read)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.seconds.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
