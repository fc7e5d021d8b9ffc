"""Live state of a queue, asked from its monitor's control socket (what `roq status` shows)."""

from __future__ import annotations

from typing import Any

from roq.client.locate import MonitorAddress
from roq.errors import RoqError
from roq.protocol.commands import ChildCommand, Result
from roq.protocol.ports import MonitorPort
from roq.transport import new_context
from roq.transport.rpc import Requester

LIVE_TIMEOUT_MS = 1_000  # a monitor that cannot answer in this long is shown as unreachable


def monitor_status(monitor_host: str, timeout_ms: int = LIVE_TIMEOUT_MS) -> dict[str, Any] | None:
    """The monitor's STATUS (exchanges with their per-second rates), or None if unreachable."""
    if not monitor_host:
        return None
    context = new_context()
    requester = Requester(context, MonitorAddress(monitor_host).at(MonitorPort.CONTROL), timeout_ms)
    try:
        reply = requester.request({"CMD": int(ChildCommand.PING)})
    except RoqError:
        return None
    finally:
        requester.close()
        context.term()
    if reply.get("RESULT") != Result.OK or not isinstance(reply.get("STATUS"), dict):
        return None
    return dict(reply["STATUS"])
