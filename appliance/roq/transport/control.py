"""The control socket every process a host starts (monitor, exchange) serves.

The host learns that a child is up when the child answers PING on its control port, and stops it
with SHUTDOWN (then SIGTERM, then SIGKILL, each bounded). A child's main loop registers
`ControlServer.sock` in its poller and calls `handle()` when it is readable; `handle()` always
sends exactly one reply. The socket's `table` (protocol/dispatch.py) serves PING, SHUTDOWN,
METRICS (the child's Prometheus samples, for its host's /metrics) and the child's own commands,
given as `extra` routes (the exchange's REPLICAS and MONITOR_MOVED): each handler is given its
typed message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import ChildCommand, Reason
from roq.protocol.dispatch import Done, Encodable, Route, Table, route
from roq.protocol.messages.control import Ping, Pong, Shutdown
from roq.protocol.metrics import MetricsReply, MetricsRequest, Sample
from roq.protocol.principals import Principal
from roq.transport import Kind, bind, open_socket
from roq.transport.rpc import answer

log = logging.getLogger(__name__)


def _authorize(principal: Principal | None, request: dict[str, Any]) -> dict[str, Any] | None:
    """The socket's gate, before the request is decoded: PING from any principal, every other
    command from the cluster's own (a refused sender learns nothing of its request's shape)."""
    if request.get("CMD") == ChildCommand.PING and principal is not None:
        return None
    if principal is not None and principal.superuser:
        return None
    who = principal.name if principal else "a revoked principal"
    return bsonmsg.fail(Reason.FORBIDDEN, f"principal {who} lacks the cluster role")


def _unknown(command: object) -> str:
    return f"unknown command {command}"


class ControlServer:
    """REP socket on the child's control port. Owned by the child's main thread."""

    def __init__(
        self,
        context: Any,
        host: str,
        port: int,
        name: str,
        extra: Mapping[int, Route[Any, None]] | None = None,
    ):
        self.name = name
        self.sock = open_socket(context, Kind.REP)
        # Any principal may ask a child's state (PING: `roq status`); every other command is
        # the cluster's own (the host's SHUTDOWN, the monitor's replica assignments).
        self.endpoint = bind(self.sock, host, port)
        self.stop_requested = False
        self.status: Callable[[], Mapping[str, Any]] = dict
        # its Prometheus samples, which its host serves on its /metrics (protocol/metrics.py)
        self.metrics: Callable[[], Sequence[Sample]] = tuple
        own: dict[int, Route[Any, None]] = {
            ChildCommand.PING: route(Ping.decode, self.ping),
            ChildCommand.SHUTDOWN: route(Shutdown.decode, self.shutdown),
            ChildCommand.METRICS: route(MetricsRequest.decode, self.samples),
        }
        self.table: Table[None] = Table(name, {**(extra or {}), **own}, unknown=_unknown)

    def handle(self) -> None:
        answer(self.sock, self._dispatch, self.name, log, _authorize)

    def _dispatch(self, request: Document) -> Document:
        reply = self.table(request, None)
        assert reply is not None  # a REP socket's handlers hold nothing
        return reply

    def ping(self, _: Ping) -> Encodable:
        return Pong(self.name, self.status())

    def samples(self, _: MetricsRequest) -> Encodable:
        return MetricsReply(self.name, self.metrics())

    def shutdown(self, _: Shutdown) -> Encodable:
        log.info("%s: shutdown requested", self.name)
        self.stop_requested = True
        return Done("stopping")

    def close(self) -> None:
        self.sock.close(0)
