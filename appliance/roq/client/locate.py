"""Finding a queue's monitor: through the GCM's admin API (`GET_HOST_BY_QNAME`, 2000).

Clients ask again when their monitor stops answering: after its host is lost the GCM re-places
it (gcm/repair.py) and answers with the new address (client/publisher.py)."""

from __future__ import annotations

from roq import limits
from roq.client.admin import AdminClient
from roq.errors import RoqError
from roq.protocol.ports import MonitorPort, StatPort, sibling


class MonitorAddress:
    """`tcp://ip:B` of a queue's monitor, with the derived endpoints clients use."""

    def __init__(self, base: str, stat: str = "", epoch: int = 0):
        host, _, port = base.rpartition(":")
        if not host.startswith("tcp://") or not port.isdigit():
            raise RoqError(f"monitor address {base!r} is not tcp://HOST:PORT")
        self.base = base
        # tcp://ip:S+1, the KPI stream (GET_HOST_BY_QNAME's Stat_Monitor_host); statistics
        # are sent to its input, S (`stat_in`)
        self.stat = stat
        # the assignment epoch the GCM recorded for this monitor (0: unknown, or named by the
        # caller); the client refuses monitor messages of older ones (protocol/epoch.py)
        self.epoch = epoch
        self.host = host
        self.port = int(port)

    def at(self, offset: MonitorPort) -> str:
        """The monitor's endpoint at `offset` (the base address is B+0)."""
        return sibling(self.base, MonitorPort.REPORTS, offset)

    @property
    def stat_in(self) -> str:
        """Where statistics are sent (S), or "" when the monitor's stat address is unknown."""
        return sibling(self.stat, StatPort.KPI, StatPort.IN) if self.stat else ""


def locate_monitor(
    queue: str,
    gcm: str | None = None,
    zk: str | None = None,
    namespace: str = "/roq",
    *,
    quick: bool = False,
) -> MonitorAddress:
    """Ask the leading GCM where `queue`'s monitor is (raises AdminRefused if it has none).
    `quick`: one attempt within `limits.monitor_locate_timeout_ms` (a client checking whether
    the monitor moved, from a loop that must not stall for long)."""
    bounds = {"timeout_ms": limits.monitor_locate_timeout_ms, "retries": 1} if quick else {}
    with AdminClient(gcm=gcm, zk=zk, namespace=namespace, **bounds) as admin:
        found = admin.get_host_by_qname(queue)
    return MonitorAddress(found.monitor_host, found.stat_monitor_host, found.epoch)
