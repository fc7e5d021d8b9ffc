"""An exchange's Prometheus samples (protocol/metrics.py), which its host serves on its /metrics:
read from the exchange's own counters in its main loop, when the host asks (1040 METRICS)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from roq.protocol.metrics import Sample, sample

if TYPE_CHECKING:
    from roq.exchange.service import Exchange


def samples(exchange: Exchange) -> list[Sample]:
    queue, ident = exchange.spec.queue, exchange.spec.exchange_id
    load = exchange.load

    def of(name: str, value: float) -> Sample:
        return sample(name, value, queue, ident)

    found = [
        of("roq_exchange_messages_in_total", load.total_msgs + load.msgs),
        of("roq_exchange_bytes_in_total", load.total_bytes + load.payload),
        of("roq_exchange_messages_out_total", exchange.forwarded.msgs),
        of("roq_exchange_bytes_out_total", exchange.forwarded.payload),
        of("roq_exchange_bad_batches_total", exchange.bad.count),
        of("roq_exchange_subscriptions", exchange.subscriptions),
        of("roq_exchange_fenced", 0 if exchange._acting else 1),
        of("roq_exchange_stale_epoch_refusals_total", exchange.epochs.refused),
        of("roq_exchange_duplicates_total", exchange.dedup.duplicates),
        of("roq_exchange_dedup_ids", len(exchange.dedup)),
        of("roq_exchange_dedup_forgotten_total", exchange.dedup.forgotten_early),
    ]
    return found + _log_samples(exchange, of) + _replication_samples(exchange)


def _log_samples(exchange: Exchange, of: Callable[[str, float], Sample]) -> list[Sample]:
    log = exchange.log
    if log is None:
        return []
    try:
        free = shutil.disk_usage(log.directory).free
    except OSError:  # the directory went (a retired log): no sample rather than a wrong one
        free = None
    found = [
        of("roq_exchange_log_bytes", log.end_offset - log.start_offset),
        of("roq_exchange_log_segments", len(log.segments)),
        of("roq_exchange_log_end_bytes", log.end_offset),
    ]
    return found + ([of("roq_exchange_disk_free_bytes", free)] if free is not None else [])


def _replication_samples(exchange: Exchange) -> list[Sample]:
    replicator, log = exchange.replicator, exchange.log
    if replicator is None or log is None:
        return []
    queue, ident, end = exchange.spec.queue, exchange.spec.exchange_id, log.end_offset
    replicas = replicator.status()
    found = [
        sample("roq_exchange_replication_lag_bytes", end - max(0, r.acked), queue, ident,
               r.replica_id)
        for r in replicas
    ]  # fmt: skip
    in_sync = 1 + sum(1 for r in replicas if r.in_sync)
    return [*found, sample("roq_exchange_in_sync_copies", in_sync, queue, ident)]
