"""A returning host gives its lost exchanges' logs back: one log keeper per lost exchange.

When the GCM re-places the work of a lost host (gcm/repair.py) it marks the host's exchanges
`lost` and starts successors elsewhere; the lost exchanges never run again. Their logs are on the
host's disk, though, and they may hold what no other copy does: batches an `acks=leader`
publisher had confirmed before the replica had them, and, more often, the only readable copy of
another lost log (the fault harness's rolling restart: m2's exchange lost and its log copied on
m1's exchange, then m1's exchange lost before that copy was sent on, 151 messages confirmed with
`acks=all` unreadable). So a host that is back, and finds such a log, starts a keeper for it:
the exchange program with `--keeper`, under the lost exchange's id and on its log directory. A
keeper binds only its control and log ports, takes no publishers and no subscribers' live
stream, and reports to the queue's monitor, which lists its log and the copies it holds among
the logs of gone exchanges (subscribers replay them from it) and has it send them to live
exchanges until replicationFactor of them hold each one in full (monitor/service.py).

A keeper whose logs all have replicationFactor complete copies on live exchanges is told so by
the monitor (`Retire` in REPLICAS): it marks its lost exchange's log directory retired (a
`RETIRED` file; the files stay until the queue is deleted, readable with `roq log`) and exits
with EXIT_RETIRED, and its host neither restarts it nor starts another for that log.

Read-only helpers here; the host's loop (`service.py`) starts and stops the keepers.
"""

from __future__ import annotations

from pathlib import Path

from roq.coordination.registry import ExchangeRecord, QueueState, Registry
from roq.log import is_retired, log_directory, replica_root


def holds_data(root: str | Path, queue: str, exchange_id: str) -> bool:
    """Whether this host's disk has the exchange's log, or copies it kept of other logs, not
    retired by a keeper before (live exchanges hold them all: `log.mark_retired`)."""
    own = log_directory(root, queue, exchange_id)
    if is_retired(own):
        return False
    if own.is_dir() and any(own.iterdir()):
        return True
    copies = replica_root(root, queue)
    try:
        return any(p.name.endswith(f"@{exchange_id}") for p in copies.iterdir())
    except OSError:
        return False


def lost_logs(registry: Registry, host: str, root: str | Path) -> list[ExchangeRecord]:
    """The exchanges of RUNNING queues recorded on `host`, marked lost, whose logs (or copies)
    are on this host's disk: each needs a keeper."""
    found = []
    for name in registry.queue_names():
        got = registry.queue(name)
        if got is None or got[0].state != QueueState.RUNNING:
            continue
        for record in registry.exchanges(name):
            if record.host == host and record.lost and holds_data(root, name, record.id):
                found.append(record)
    return found
