"""Restart is resume: a host's assignments, read from ZooKeeper, the source of truth.

A RUNNING queue's record names the host of its monitor (and the monitor's ports); each exchange
record names its host, its id (so its log directory, `<directory>/<queue>/<id>`) and its ports.
These records outlive every process. A host that starts under a name with assignments starts
those monitors and exchanges again with the same ids, on the recorded ports when they are free
(new ones otherwise, written back by `Registry.move_queue`/`move_exchange`, a compare-and-set
that a GCM write in between wins). `roq queue start` uses the same records: the queue's host
starts the exchanges recorded on it, the GCM asks the other hosts for theirs.

Host loss moves assignments away (gcm/repair.py): the queue record then names another host for
the monitor, and the exchange records of the lost host are marked `lost`. A host that comes back
adopts only what ZooKeeper still assigns to it, so nothing stale starts; one whose session
expired while its children kept running (a stall, a partition) stops the children whose
assignment moved when it registers again (`moved_children`). Their log directories stay as they
are on disk: the log of a lost exchange is never written again, but a keeper serves it and
sends it to live exchanges (host/keepers.py); a queue delete removes it with the rest of the
queue's files.

Read-only helpers here; the host's loop (`service.py`) starts the processes.
"""

from __future__ import annotations

from collections.abc import Sequence

from roq.coordination.registry import ExchangeRecord, QueueRecord, QueueState, Registry
from roq.errors import RoqError
from roq.host.supervision import Child


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
    """The queue's exchanges recorded on `host` (record, version), oldest id first; not those
    marked lost (the GCM replaced them after the host was lost: their logs stay as they are)."""
    found = []
    for record in registry.exchanges(queue):
        if record.host != host or record.lost:
            continue
        got = registry.exchange(queue, record.id)
        if got is not None:
            found.append(got)
    return found


def served_elsewhere(registry: Registry, queue: str, host: str) -> bool:
    """Whether the queue has a recorded exchange on another live host (the GCM re-attaches
    it), so a start need not give the queue a new, empty exchange here. A log follower takes
    no publishers: it does not count."""
    live = {h.name for h in registry.hosts()}
    return any(
        x.host != host and x.host in live and not x.follower for x in registry.exchanges(queue)
    )


def moved_children(registry: Registry, host: str, children: Sequence[Child]) -> list[Child]:
    """The children ZooKeeper no longer assigns to `host`: those of a queue deleted or stopped
    meanwhile (the GCM's request could not reach a gone host), a monitor whose queue names
    another host, an exchange whose record is marked lost or names another host (one with no
    record yet may be a create the GCM has not recorded: it stays)."""
    moved = []
    for child in children:
        got = registry.queue(child.queue)
        if got is None or got[0].state == QueueState.STOPPED:
            moved.append(child)
            continue
        if got[0].state != QueueState.RUNNING:
            continue  # being created or deleted: the GCM's request in progress decides
        if child.role == "monitor":
            if got[0].host != host:
                moved.append(child)
            continue
        record = registry.exchange(child.queue, child.id)
        if child.role == "keeper":  # kept while its exchange stays lost and this host's
            if record is None or not record[0].lost or record[0].host != host:
                moved.append(child)
        elif record is not None and (record[0].lost or record[0].host != host):
            moved.append(child)
    return moved


def monitor_ports(registry: Registry, queue: str, host: str) -> tuple[int, int]:
    """The monitor's recorded (base, stat) ports if it was on `host`, else (0, 0): none."""
    got = registry.queue(queue)
    if got is None or got[0].host != host:
        return (0, 0)
    return (got[0].monitor_port, got[0].stat_port)


def address_of(endpoint: str) -> str:
    """The ip of tcp://ip:port."""
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
