"""Live state of a queue, asked from its monitor's control socket (what `roq status` shows)."""

from __future__ import annotations

import logging

from roq.client.locate import MonitorAddress
from roq.errors import ProtocolError, RoqError
from roq.protocol.bsonmsg import Reply
from roq.protocol.messages.control import MonitorStatus, Ping, Pong
from roq.protocol.ports import MonitorPort
from roq.transport import new_context
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)

LIVE_TIMEOUT_MS = 1_000  # a monitor that cannot answer in this long is shown as unreachable


def monitor_status(monitor_host: str, timeout_ms: int = LIVE_TIMEOUT_MS) -> MonitorStatus | None:
    """The monitor's STATUS (exchanges with their per-second rates), or None if unreachable or
    its answer is not a monitor's STATUS."""
    if not monitor_host:
        return None
    context = new_context()
    requester = Requester(context, MonitorAddress(monitor_host).at(MonitorPort.CONTROL), timeout_ms)
    try:
        reply = requester.request(Ping().encode())
        if not Reply.decode(reply).ok:
            return None
        return MonitorStatus.decode(Pong.decode(reply).status)
    except ProtocolError as error:
        log.warning("monitor at %s: its STATUS is not readable: %s", monitor_host, error)
        return None
    except RoqError:
        return None
    finally:
        requester.close()
        context.term()
