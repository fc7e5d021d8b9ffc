"""Restart is resume: a host's assignments, read from ZooKeeper, the source of truth.

A RUNNING queue's record names the host of its monitor (and the monitor's ports); each exchange
record names its host, its id (so its log directory, `<directory>/<queue>/<id>`) and its ports.
These records outlive every process. A host that starts under a name with assignments starts
those monitors and exchanges again with the same ids, on the recorded ports when they are free
(new ones otherwise, written back by `Registry.move_queue`/`move_exchange`, a compare-and-set
that a GCM write in between wins). `roq queue start` uses the same records: the queue's host
starts the exchanges recorded on it, the GCM asks the other hosts for theirs.

Read-only helpers here; the host's loop (`service.py`) starts the processes.
"""

from __future__ import annotations

from roq.coordination.registry import ExchangeRecord, QueueRecord, QueueState, Registry
from roq.errors import RoqError


class NoCapacity(RoqError):
    """The host runs exchange.max.perhost exchanges and a new one was needed."""


def queues_to_adopt(registry: Registry, host: str) -> list[tuple[QueueRecord, int]]:
    """RUNNING queues with a monitor or an exchange assigned to `host` (record, version)."""
    found = []
    for name in registry.queue_names():
        got = registry.queue(name)
        if got is None or got[0].state != QueueState.RUNNING:
            continue
        if got[0].host == host or recorded_exchanges(registry, name, host):
            found.append(got)
    return found


def recorded_exchanges(
    registry: Registry, queue: str, host: str
) -> list[tuple[ExchangeRecord, int]]:
    """The queue's exchanges recorded on `host` (record, version), oldest id first."""
    found = []
    for record in registry.exchanges(queue):
        if record.host != host:
            continue
        got = registry.exchange(queue, record.id)
        if got is not None:
            found.append(got)
    return found


def served_elsewhere(registry: Registry, queue: str, host: str) -> bool:
    """Whether the queue has a recorded exchange on another live host (the GCM re-attaches
    it), so a start need not give the queue a new, empty exchange here."""
    live = {h.name for h in registry.hosts()}
    return any(x.host != host and x.host in live for x in registry.exchanges(queue))


def monitor_ports(registry: Registry, queue: str, host: str) -> tuple[int, int]:
    """The monitor's recorded (base, stat) ports if it was on `host`, else (0, 0): none."""
    got = registry.queue(queue)
    if got is None or got[0].host != host:
        return (0, 0)
    return (got[0].monitor_port, got[0].stat_port)


def address_of(endpoint: str) -> str:
    """The ip of tcp://ip:port."""
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
