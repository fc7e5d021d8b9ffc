"""The control socket every process a host starts (monitor, exchange) serves.

The host learns that a child is up when the child answers PING on its control port, and stops it
with SHUTDOWN (then SIGTERM, then SIGKILL, each bounded). A child's main loop registers
`ControlServer.sock` in its poller and calls `handle()` when it is readable; `handle()` always
sends exactly one reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from roq.protocol import bsonmsg
from roq.protocol.commands import ChildCommand, Reason
from roq.protocol.messages.control import Pong
from roq.protocol.principals import Principal
from roq.transport import Kind, bind, open_socket
from roq.transport.rpc import answer

log = logging.getLogger(__name__)

Extra = Callable[[dict[str, Any]], dict[str, Any] | None]


def _authorize(principal: Principal | None, request: dict[str, Any]) -> dict[str, Any] | None:
    if request.get("CMD") == ChildCommand.PING and principal is not None:
        return None
    if principal is not None and principal.superuser:
        return None
    who = principal.name if principal else "a revoked principal"
    return bsonmsg.fail(Reason.FORBIDDEN, f"principal {who} lacks the cluster role")


class ControlServer:
    """REP socket on the child's control port. Owned by the child's main thread."""

    def __init__(self, context: Any, host: str, port: int, name: str, extra: Extra | None = None):
        self.name = name
        self.sock = open_socket(context, Kind.REP)
        # Any principal may ask a child's state (PING: `roq status`); every other command is
        # the cluster's own (the host's SHUTDOWN, the monitor's replica assignments).
        self.endpoint = bind(self.sock, host, port)
        self.stop_requested = False
        self.handler = extra
        self.status: Callable[[], dict[str, Any]] = dict

    def handle(self) -> None:
        answer(self.sock, self._dispatch, self.name, log, _authorize)

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        command = request["CMD"]
        if command == ChildCommand.PING:
            return Pong(self.name, self.status()).encode()
        if command == ChildCommand.SHUTDOWN:
            log.info("%s: shutdown requested", self.name)
            self.stop_requested = True
            return bsonmsg.ok("stopping")
        if self.handler is not None:
            reply = self.handler(request)
            if reply is not None:
                return reply
        return bsonmsg.fail(Reason.UNKNOWN_COMMAND, f"unknown command {command}")

    def close(self) -> None:
        self.sock.close(0)
