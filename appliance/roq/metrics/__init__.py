"""Prometheus metrics and health checks: the only package that imports prometheus_client.

- `exposition.py`: samples (protocol/metrics.py) into the Prometheus text format, bounded by
  queue; the gateway's own counters (http/metrics.py) use the classes it passes on;
- `listener.py`: the HTTP listener of a GCM or a host (`metrics.port`, `hcm.metrics.port`):
  `GET /metrics`, `/healthz` (the main loop turns), `/readyz` (the process serves).

docs/operations.md, "Metrics" and "Health", describes both.
"""

from roq.metrics.exposition import (
    CONTENT_TYPE,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    bound_queues,
    counter_function,
    generate_latest,
    render,
)
from roq.metrics.listener import Health, Listener

__all__ = [
    "CONTENT_TYPE",
    "CollectorRegistry",
    "Counter",
    "Gauge",
    "Health",
    "Histogram",
    "Listener",
    "bound_queues",
    "counter_function",
    "generate_latest",
    "render",
]
