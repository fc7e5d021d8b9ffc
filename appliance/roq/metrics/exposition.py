"""Samples into the Prometheus text format, with the catalogue's types and help texts.

A registry of its own per render, never prometheus_client's global one (which would also export
whatever else the process imported: its GC and platform collectors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from roq.protocol.metrics import BY_NAME, COUNTER, Sample

CONTENT_TYPE = CONTENT_TYPE_LATEST

__all__ = [
    "CONTENT_TYPE", "CollectorRegistry", "Counter", "Gauge", "Histogram", "generate_latest",
]  # fmt: skip


def bound_queues(samples: Iterable[Sample], queues_max: int) -> tuple[list[Sample], int]:
    """The samples of at most `queues_max` queues (the first by name) and every sample without
    a queue label; and how many samples were left out."""
    samples = list(samples)
    queues = sorted({_queue(s) for s in samples} - {None})  # type: ignore[type-var]
    kept_queues = set(queues[:queues_max])
    kept = [s for s in samples if _queue(s) is None or _queue(s) in kept_queues]
    return kept, len(samples) - len(kept)


def _queue(sample: Sample) -> str | None:
    labels = BY_NAME[sample.name].labels
    return sample.labels[labels.index("queue")] if "queue" in labels else None


class _Samples(Collector):
    def __init__(self, samples: Sequence[Sample]):
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for item in self.samples:
            family = families.get(item.name)
            if family is None:
                family = families[item.name] = _family(item.name)
            family.add_metric(list(item.labels), item.value)
        yield from families.values()


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    metric = BY_NAME[name]
    if metric.kind == COUNTER:  # the family's name is without `_total`; its sample has it
        return CounterMetricFamily(name.removesuffix("_total"), metric.help, labels=metric.labels)
    return GaugeMetricFamily(name, metric.help, labels=metric.labels)


class _CounterFunction(Collector):
    def __init__(self, name: str, text: str, read: Callable[[], float]):
        self.name, self.text, self.read = name, text, read

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name.removesuffix("_total"), self.text)
        family.add_metric([], self.read())
        yield family


def counter_function(
    registry: CollectorRegistry, name: str, text: str, read: Callable[[], float]
) -> None:
    """A counter whose value `read()` gives at each scrape (a count the code keeps already):
    prometheus_client's Counter has no `set_function`, and a Gauge would break the `_total`
    convention and `rate()`'s reset handling."""
    registry.register(_CounterFunction(name, text, read))


def render(samples: Sequence[Sample]) -> bytes:
    """The Prometheus text format of `samples`, one family per metric. A series given twice
    (two children of one queue reporting the same group) keeps its first value."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    unique = []
    for item in samples:
        if (item.name, item.labels) not in seen:
            seen.add((item.name, item.labels))
            unique.append(item)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Samples(unique))
    return bytes(generate_latest(registry))
