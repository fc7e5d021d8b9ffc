"""A monitor's Prometheus samples (protocol/metrics.py), which its host serves on its /metrics:
its queue's exchanges and publishers, scaling decisions, consumer groups (the first
`limits.metrics_groups_max` by name) and the tasks it holds, read in its main loop when the host
asks (1040 METRICS)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from roq import limits
from roq.protocol.metrics import Sample, sample

if TYPE_CHECKING:
    from roq.monitor.service import Monitor


def samples(monitor: Monitor) -> list[Sample]:
    queue, now = monitor.queue, time.monotonic()
    exchanges = list(monitor.exchanges.values())
    found = [
        sample("roq_monitor_exchanges", len(exchanges), queue),
        sample("roq_monitor_log_followers", len(monitor.followers), queue),
        sample("roq_monitor_relocations_total", monitor.relocations, queue),
        sample("roq_monitor_exchange_deaths_total", monitor.deaths, queue),
        sample("roq_monitor_exchanges_late_total", monitor.lates, queue),
        *(
            sample("roq_monitor_publishers", x.publishers(now), queue, x.exchange_id)
            for x in exchanges
        ),
        *(
            sample("roq_monitor_scaling_decisions_total", count, queue, kind)
            for kind, count in sorted(monitor.scaler.decisions.items())
        ),
        *(
            sample("roq_tasks_cached", count, queue, state)
            for state, count in sorted(monitor.tasks.cache.states().items())
        ),
    ]
    return found + _group_samples(monitor)


def _group_samples(monitor: Monitor) -> list[Sample]:
    found = []
    expired = monitor.groups.ttl_expired()
    dedup = monitor.groups.dedup_counts()
    for view, redelivered in monitor.groups.views(limits.metrics_groups_max):
        labels = (monitor.queue, view.name)
        found += [
            sample("roq_group_lag_messages", view.lag, *labels),
            sample("roq_group_uncounted_slots", view.uncounted, *labels),
            sample("roq_group_in_flight_messages", view.in_flight, *labels),
            sample("roq_group_consumers", len(view.consumers), *labels),
            sample("roq_group_acked_total", view.acked, *labels),
            sample("roq_group_redeliveries_total", redelivered, *labels),
            sample("roq_group_dead_letters_total", view.dead_letters, *labels),
            sample("roq_group_expired_total", expired.get(view.name, 0), *labels),
            sample("roq_group_duplicates_total", dedup.get(view.name, (0, 0))[0], *labels),
            sample("roq_group_dedup_forgotten_total", dedup.get(view.name, (0, 0))[1], *labels),
        ]
    return found
