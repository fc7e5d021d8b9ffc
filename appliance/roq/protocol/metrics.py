"""The cluster's Prometheus metrics: every name, its type, labels and meaning, declared once, and
the samples a monitor or an exchange sends its host (1040 METRICS on its control port).

A monitor or an exchange has no HTTP listener of its own: its host asks each child for its
samples when it is scraped and serves them with its own on one /metrics (docs/operations.md,
"Metrics"), so a queue costs no port more. The samples are plain numbers with their label
values; the host turns them into Prometheus families with this table (roq/metrics/), which
docs/operations.md's metrics table is checked against (tests/unit/test_doc_tables.py).

Names follow Prometheus's conventions: `roq_` first, the unit in the name (`_bytes`,
`_seconds`, `_messages`), counters end `_total`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_list, field_str
from roq.protocol.commands import ChildCommand

COUNTER, GAUGE = "counter", "gauge"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # counter | gauge
    labels: tuple[str, ...]
    help: str


def _m(name: str, kind: str, labels: str, text: str) -> Metric:
    return Metric(name, kind, tuple(labels.split()) if labels else (), text)


_QX = "queue exchange"
CATALOGUE: tuple[Metric, ...] = (
    # --- every process with a listener (GCM, host) ---
    _m("roq_up", GAUGE, "role", "1 while the process serves (role: gcm, host)."),
    _m("roq_zookeeper_connected", GAUGE, "role", "1 while its ZooKeeper session is connected."),
    _m("roq_zookeeper_session_losses_total", COUNTER, "role",
       "ZooKeeper sessions this process lost (expired) since it started."),
    _m("roq_series_dropped_total", COUNTER, "role",
       "Samples left out of scrapes: their queue was past the bound of queues per process."),
    # --- the GCM ---
    _m("roq_gcm_leader", GAUGE, "", "1 while this GCM is the elected leader."),
    _m("roq_gcm_epoch", GAUGE, "", "The leadership epoch (fencing token) this GCM leads under; "
       "0 while it does not lead."),
    _m("roq_gcm_hosts", GAUGE, "", "Hosts registered in ZooKeeper (leader only)."),
    _m("roq_gcm_queues", GAUGE, "state", "Queues by state (leader only)."),
    # --- the host ---
    _m("roq_host_children", GAUGE, "host role state",
       "Monitors and exchanges this host runs, by role and state (running, restarting, "
       "given_up)."),
    _m("roq_host_child_restarts_total", COUNTER, "host",
       "Children this host started again after they exited."),
    _m("roq_host_exchanges_max", GAUGE, "host", "exchange.max.perhost: exchanges it may run."),
    _m("roq_host_lease_valid", GAUGE, "host",
       "1 while the children's lease (fencing) is valid: they act only while it is."),
    _m("roq_host_scrape_failures_total", COUNTER, "host",
       "Children that did not answer this host's request for their metrics in time."),
    # --- each exchange (gathered by its host) ---
    _m("roq_exchange_messages_in_total", COUNTER, _QX,
       "Messages accepted from publishers (appended to its log)."),
    _m("roq_exchange_bytes_in_total", COUNTER, _QX, "Payload bytes of those messages."),
    _m("roq_exchange_messages_out_total", COUNTER, _QX,
       "Messages forwarded to live subscribers (while at least one was subscribed)."),
    _m("roq_exchange_bytes_out_total", COUNTER, _QX, "Payload bytes of those messages."),
    _m("roq_exchange_bad_batches_total", COUNTER, _QX, "Frames refused as malformed."),
    _m("roq_exchange_subscriptions", GAUGE, _QX, "Subscriptions on its subscriber socket."),
    _m("roq_exchange_log_bytes", GAUGE, _QX, "Bytes its message log holds (end - start)."),
    _m("roq_exchange_log_segments", GAUGE, _QX, "Segment files of its message log."),
    _m("roq_exchange_log_end_bytes", GAUGE, _QX, "The log's end offset (bytes ever appended)."),
    _m("roq_exchange_disk_free_bytes", GAUGE, _QX, "Free bytes of the file system of its log."),
    _m("roq_exchange_replication_lag_bytes", GAUGE, "queue exchange replica",
       "Bytes of its log a replica has not yet acknowledged."),
    _m("roq_exchange_in_sync_copies", GAUGE, _QX,
       "Copies of its log in sync (the leader's own included)."),
    _m("roq_exchange_fenced", GAUGE, _QX,
       "1 while its host's lease is not valid: it accepts nothing (fencing)."),
    _m("roq_exchange_stale_epoch_refusals_total", COUNTER, _QX,
       "Assignments refused because they came from a re-placed monitor's older epoch."),
    _m("roq_exchange_duplicates_total", COUNTER, _QX,
       "Records not appended: their batch's message ids were all appended within "
       "dedup.window.ms (the publisher was acknowledged)."),
    _m("roq_exchange_dedup_ids", GAUGE, _QX, "Message ids its de-duplication window holds."),
    _m("roq_exchange_dedup_forgotten_total", COUNTER, _QX,
       "Message ids its window forgot before dedup.window.ms, past dedup_window_ids_max."),
    # --- each queue's monitor (gathered by its host) ---
    _m("roq_monitor_exchanges", GAUGE, "queue", "Live exchanges of the queue."),
    _m("roq_monitor_log_followers", GAUGE, "queue",
       "Live log followers of the queue (log.followers): copies on hosts without its exchanges."),
    _m("roq_monitor_publishers", GAUGE, _QX, "Publishers sending to each exchange."),
    _m("roq_monitor_relocations_total", COUNTER, "queue", "Publishers moved between exchanges."),
    _m("roq_monitor_scaling_decisions_total", COUNTER, "queue decision",
       "Scaling decisions and their outcomes (scale_out, exchange_added, capacity_exhausted, "
       "...)."),
    _m("roq_monitor_exchange_deaths_total", COUNTER, "queue",
       "Exchanges declared dead (silent past their bound; not those that said they were leaving)."),
    _m("roq_monitor_exchanges_late_total", COUNTER, "queue",
       "Times an exchange silent past its heartbeats was kept as late, not dead."),
    _m("roq_group_lag_messages", GAUGE, "queue group",
       "Messages of the group's counted slots not yet settled (acked or dead-lettered)."),
    _m("roq_group_uncounted_slots", GAUGE, "queue group",
       "Slots whose messages no consumer has counted yet (not in the lag)."),
    _m("roq_group_in_flight_messages", GAUGE, "queue group",
       "Messages handed to consumers and not settled."),
    _m("roq_group_consumers", GAUGE, "queue group", "Consumers in the group."),
    _m("roq_group_acked_total", COUNTER, "queue group", "Messages acknowledged."),
    _m("roq_group_redeliveries_total", COUNTER, "queue group",
       "Messages handed out again (a nack, a lease that expired)."),
    _m("roq_group_dead_letters_total", COUNTER, "queue group",
       "Messages moved to the group's dead-letter queue."),
    _m("roq_group_expired_total", COUNTER, "queue group",
       "Messages past their expiry (TTL) when a consumer would hand them out: dropped."),
    _m("roq_group_duplicates_total", COUNTER, "queue group",
       "Copies of a message id the group read at another place within dedup.window.ms: "
       "settled, not handed out."),
    _m("roq_group_dedup_forgotten_total", COUNTER, "queue group",
       "Message ids the group's window forgot before their time (past work_dedup_ids_max)."),
    _m("roq_tasks_cached", GAUGE, "queue state",
       "Request/response tasks this monitor holds in memory, by state."),
)  # fmt: skip
BY_NAME: Mapping[str, Metric] = {metric.name: metric for metric in CATALOGUE}


@dataclass(frozen=True)
class Sample:
    """One value of one series: `labels` in the order its metric declares them."""

    name: str
    labels: tuple[str, ...]
    value: float

    def fields(self) -> list[Any]:
        return [self.name, list(self.labels), float(self.value)]

    @classmethod
    def decode(cls, entry: Any) -> Self:
        """A child's sample, checked against the catalogue: a child of another version may
        send a name this host does not know (DecodeError, the sample is skipped)."""
        if not isinstance(entry, list) or len(entry) != 3:
            raise DecodeError("a sample must be [name, labels, value]")
        name, labels, value = entry
        metric = BY_NAME.get(name) if isinstance(name, str) else None
        if metric is None:
            raise DecodeError(f"unknown metric {str(name)[:80]!r}")
        if not isinstance(labels, list) or len(labels) != len(metric.labels):
            raise DecodeError(f"{name}: expected labels {', '.join(metric.labels) or 'none'}")
        if not all(isinstance(v, str) and len(v) <= limits.metrics_label_chars_max for v in labels):
            raise DecodeError(f"{name}: a label value is not a short string")
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise DecodeError(f"{name}: the value must be a number")
        return cls(name, tuple(labels), float(value))


def sample(name: str, value: float, *labels: str) -> Sample:
    """A sample of a metric of the catalogue (KeyError for a name it does not declare: a bug)."""
    metric = BY_NAME[name]
    assert len(labels) == len(metric.labels), name
    return Sample(name, tuple(labels), value)


@dataclass(frozen=True)
class MetricsRequest:
    """1040 METRICS: your samples. Answered with `MetricsReply`."""

    def encode(self) -> Document:
        return {"CMD": int(ChildCommand.METRICS)}

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls()


@dataclass(frozen=True)
class MetricsReply:
    """`NAME` and `SAMPLES`: [[name, [label values], value], ...], at most
    `limits.metrics_samples_max`."""

    name: str
    samples: Sequence[Sample]

    def encode(self) -> Document:
        kept = self.samples[: limits.metrics_samples_max]
        return bsonmsg.ok("METRICS", NAME=self.name, SAMPLES=[s.fields() for s in kept])

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> tuple[Self, int]:
        """The reply and how many of its samples were refused (skipped, not fatal)."""
        entries = field_list(doc, "SAMPLES", max_items=limits.metrics_samples_max)
        samples, refused = [], 0
        for entry in entries:
            try:
                samples.append(Sample.decode(entry))
            except DecodeError:
                refused += 1
        return cls(field_str(doc, "NAME"), tuple(samples)), refused
