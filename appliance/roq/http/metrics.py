"""`GET /metrics`: the gateway's counters in the Prometheus text format (prometheus_client,
through roq.metrics), in a registry of its own (not the library's global one, which would also
export whatever else the process imported)."""

from __future__ import annotations

from collections.abc import Callable

from roq.http.index import TopicIndex
from roq.metrics import (
    CONTENT_TYPE,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    counter_function,
    generate_latest,
)

__all__ = ["CONTENT_TYPE", "Metrics"]


class Metrics:
    def __init__(
        self,
        index: TopicIndex,
        replaced: Callable[[], int],
        read: Callable[[], int] = lambda: 0,
        in_progress: Callable[[], int] = lambda: 0,
        expired: Callable[[], int] = lambda: 0,
        read_back: Callable[[], int] = lambda: 0,
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
        held_bytes = Gauge(
            "roq_http_held_bytes", "Memory this gateway holds messages' text and meta in "
            "(bounded by http.cache.bytes).", registry=self.registry,
        )  # fmt: skip
        held_bytes.set_function(lambda: index.held.bytes)
        place_bytes = Gauge(
            "roq_http_place_bytes", "Memory this gateway keeps its messages' places in (their "
            "exchange and log offset: at most limits.http_place_bytes_max per message kept).",
            registry=self.registry,
        )  # fmt: skip
        place_bytes.set_function(index.place_bytes)
        busy = Gauge(
            "roq_http_requests_in_progress", "Requests in progress (long polls included) of the "
            "principals held to http.requests.per.principal.", registry=self.registry,
        )  # fmt: skip
        busy.set_function(in_progress)
        # counts the gateway keeps: counters (`_total`) read at each scrape
        counter_function(self.registry, "roq_http_publishers_replaced_total",
                         "Failed publishers this gateway replaced.", replaced)  # fmt: skip
        counter_function(
            self.registry, "roq_http_log_messages_read_total", "Messages this gateway read "
            "from its queues' logs since it started (after its snapshot's position).", read,
        )  # fmt: skip
        counter_function(
            self.registry, "roq_http_expired_messages_total", "Expired messages a get found "
            "and did not return (each once per gateway run).", expired,
        )  # fmt: skip
        counter_function(
            self.registry, "roq_http_held_evictions_total", "Messages whose text this gateway "
            "let go of to stay within http.cache.bytes.", lambda: index.held.evictions,
        )  # fmt: skip
        counter_function(
            self.registry, "roq_http_read_back_messages_total", "Messages a get read back from "
            "their log because this gateway did not hold them.", read_back,
        )  # fmt: skip

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.seconds.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
