"""The port map: each component's ports, as offsets from the first port of its block, named once.

    GCM        P = ports.base        P+0 topology (REP), P+3 admin API (REP), P+5 broadcast (PUB)
    monitor    B, 6 ports            B+0 exchange reports (SUB), B+1 placement (ROUTER),
                                     B+2 to publishers (PUB), B+3 to subscribers (PUB),
                                     B+4 scaling rules (PULL), B+5 control (REP)
    stat       S, 2 ports            S+0 statistics in (SUB), S+1 the KPI stream (PUB)
    exchange   F, 4 ports            F+0 publishers (ROUTER), F+1 subscribers (XPUB),
                                     F+2 control (REP), F+3 log reads and replication (ROUTER)

RoQ's numbers, kept on the wire (docs/protocol.md): its GCM shutdown ports P+1/P+4 and its Java
broadcast P+2 are gone, but the admin API stays at P+3. The host allocates monitor, stat and
exchange blocks of the widths below (host/ports.py).

Code that knows a block's first port asks `port_at` or `endpoint_at`; code that was told one
endpoint of a block (a subscriber knows an exchange's back address F+1) derives another with
`sibling`. No other module adds offsets to ports. Pure: no sockets.
"""

from __future__ import annotations

import enum
from typing import TypeVar


class GcmPort(enum.IntEnum):
    TOPOLOGY = 0
    ADMIN = 3
    BROADCAST = 5


class MonitorPort(enum.IntEnum):
    REPORTS = 0
    PLACEMENT = 1
    TO_PUBLISHERS = 2
    TO_SUBSCRIBERS = 3
    RULES = 4
    CONTROL = 5


class StatPort(enum.IntEnum):
    IN = 0
    KPI = 1


class ExchangePort(enum.IntEnum):
    FRONT = 0
    BACK = 1
    CONTROL = 2
    LOG = 3


GCM_WIDTH = 6  # P..P+5: the unused P+1, P+2, P+4 are RoQ's and stay reserved
MONITOR_WIDTH = 6
STAT_WIDTH = 2
EXCHANGE_WIDTH = 4
# The blocks a host allocates, by role (the role names of the port claims in ZooKeeper).
HOST_BLOCK_WIDTH = {"monitor": MONITOR_WIDTH, "stat": STAT_WIDTH, "exchange": EXCHANGE_WIDTH}

Offset = TypeVar("Offset", GcmPort, MonitorPort, StatPort, ExchangePort)


def host_block(role: str, base: int, slot: int) -> range:
    """The ports of a host's block number `slot` for `role`, counted from the role's base port
    (`monitor.base.port` and so on): blocks of one role sit side by side."""
    width = HOST_BLOCK_WIDTH[role]
    first = base + width * slot
    return range(first, first + width)


def port_at(base: int, offset: GcmPort | MonitorPort | StatPort | ExchangePort) -> int:
    """The port at `offset` of the block that starts at `base`."""
    return base + offset


def endpoint_at(
    address: str, base: int, offset: GcmPort | MonitorPort | StatPort | ExchangePort
) -> str:
    """`tcp://address:port` of the port at `offset` of the block that starts at `base`."""
    return f"tcp://{address}:{base + offset}"


def sibling(endpoint: str, known: Offset, wanted: Offset) -> str:
    """The endpoint at offset `wanted` of the block in which `endpoint` is at offset `known`
    (same host, same scheme): e.g. an exchange's log port from its back address,
    `sibling(back, ExchangePort.BACK, ExchangePort.LOG)`."""
    if type(known) is not type(wanted):
        raise TypeError(f"{known!r} and {wanted!r} are offsets of different blocks")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} does not end in :PORT")
    return f"{host}:{int(port) - known + wanted}"
