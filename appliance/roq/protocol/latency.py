"""The latency histogram of a subscriber's KPI document (StatCommand.SUBSCRIBER_TOTAL, 31).

A subscriber sends, besides RoQ's mean and p99, a histogram of its per-batch latencies: the
analytics job merges histograms across subscribers and periods, which means and p99s cannot be.
It lives in the protocol because it is the message's shape: the subscriber builds it
(`histogram_fields`) and the analytics job reads it (docs/analytics.md), and neither imports the
other. Pure: no sockets, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

# Latency histogram: bucket i holds latencies in [bucket_lower_us(i), bucket_lower_us(i + 1)).
# Eight buckets per power of two: a percentile read from it is within 9 % of the true value.
BUCKETS_PER_OCTAVE = 8
BUCKET_MAX = 40 * BUCKETS_PER_OCTAVE  # 2**40 µs ≈ 12.7 days: anything later goes in the last


def latency_bucket(latency_us: int) -> int:
    """The histogram bucket of one latency sample (negative clock skew counts as 0)."""
    if latency_us < 1:
        return 0
    return min(int(math.log2(latency_us) * BUCKETS_PER_OCTAVE) + 1, BUCKET_MAX)


def bucket_lower_us(index: int) -> float:
    """Smallest latency of bucket `index` (bucket 0 is [0, 1) µs)."""
    return 0.0 if index == 0 else float(2.0 ** ((index - 1) / BUCKETS_PER_OCTAVE))


def bucket_upper_us(index: int) -> float:
    """First latency past bucket `index`: the job reports percentiles as this bound."""
    return float(2.0 ** (index / BUCKETS_PER_OCTAVE))


def histogram_fields(samples_us: list[int]) -> dict[str, Any]:
    """The latency fields of a subscriber KPI document from raw samples (microseconds)."""
    counts: dict[int, int] = {}
    for sample in samples_us:
        index = latency_bucket(sample)
        counts[index] = counts.get(index, 0) + 1
    ordered = sorted(counts)
    return {
        "LatCount": len(samples_us),
        "LatSumUs": sum(samples_us),
        "LatMinUs": min(samples_us, default=0),
        "LatMaxUs": max(samples_us, default=0),
        "LatIdx": ordered,
        "LatCnt": [counts[i] for i in ordered],
        "MeanLat": (sum(samples_us) / len(samples_us) / 1000.0) if samples_us else 0.0,
    }
