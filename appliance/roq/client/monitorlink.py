"""Requests to a queue's monitor on its placement socket (B+1), for the clients that keep their
state there (request/response: client/requests.py; the HTTP gateway's topics: client/topics.py).

A link asks again while the monitor is busy (recovering its state log, ZooKeeper), restarting or
moving (then the GCM is asked where it went), for at most `wait_s` (by default
`limits.work_monitor_wait_s`); any other refusal is raised at once as `MonitorRefused`, with the
monitor's reason. A link belongs to the thread that made it (one ZeroMQ context and socket).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from roq import limits
from roq.client.locate import MonitorAddress, locate_monitor
from roq.errors import RoqError, TransportError
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason
from roq.protocol.ports import MonitorPort
from roq.transport import new_context
from roq.transport.rpc import Requester as _Rpc

log = logging.getLogger(__name__)

Locate = tuple[str | None, str | None, str]  # (gcm, zk, namespace): where the GCM is found


class MonitorRefused(RoqError):
    """The monitor refused the request for good (not busy, not fenced): `reason` says why."""

    def __init__(self, queue: str, reason: str, comment: str):
        super().__init__(f"queue {queue}: {comment}")
        self.reason, self.comment = reason, comment


class MonitorLink:
    def __init__(
        self,
        queue: str,
        locate: Locate,
        wait_s: float = limits.work_monitor_wait_s,
        monitor: MonitorAddress | None = None,
    ):
        """`monitor`: where the queue's monitor was found (by another link of the process):
        not asked again (each question to the GCM found through ZooKeeper opens and closes a
        session, two ZooKeeper transactions), until the monitor moves."""
        self.queue, self._locate, self.wait_s = queue, locate, wait_s
        self.pause_s = limits.work_poll_ms / 1000  # between two asks
        self.tries: int | None = None  # asks of one request at most (None: as wait_s allows)
        self._context = new_context()
        self._monitor = monitor or locate_monitor(queue, *locate)
        self._rpc = self._new_rpc()

    @property
    def monitor(self) -> MonitorAddress:
        return self._monitor

    @property
    def context(self) -> Any:
        """The link's ZeroMQ context (its thread's sockets to the same monitor share it)."""
        return self._context

    def _new_rpc(self) -> _Rpc:
        endpoint = self._monitor.at(MonitorPort.PLACEMENT)
        return _Rpc(self._context, endpoint, limits.work_request_timeout_ms)

    def repeat(self, tries: int, pause_s: float) -> None:
        """Ask each request at most `tries` times, `pause_s` apart, within tries × pause (a
        worker's request.worker.repeats and request.worker.wait.ms, JLupin's repeatsAmount)."""
        self.tries, self.pause_s, self.wait_s = tries, pause_s, tries * pause_s

    def ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The monitor's OK reply to `doc`; MonitorRefused, or RoqError once it did not answer
        within `wait_s` (or `tries` asks)."""
        deadline = time.monotonic() + self.wait_s
        asked = 0
        while True:
            asked += 1
            try:
                reply = self._rpc.request(doc)
            except TransportError as error:
                problem = str(error)
                self.follow()
            else:
                outcome = Reply.decode(reply)
                if outcome.ok:
                    return reply
                if outcome.error == Reason.FENCED:
                    self.follow()
                elif outcome.error != Reason.BUSY:
                    raise MonitorRefused(self.queue, outcome.error, outcome.comment)
                problem = outcome.comment
            if time.monotonic() > deadline or (self.tries is not None and asked >= self.tries):
                raise RoqError(f"queue {self.queue}: the monitor does not answer "
                               f"({asked} asks): {problem}")  # fmt: skip
            time.sleep(self.pause_s)

    def follow(self) -> None:
        """Ask the GCM where the monitor is; a link to it moves there."""
        try:
            found = locate_monitor(self.queue, *self._locate, quick=True)
        except RoqError:
            return
        if found.base != self._monitor.base:
            log.warning("queue %s: the monitor moved to %s", self.queue, found.base)
            self._rpc.close()
            self._monitor = found
            self._rpc = self._new_rpc()

    def close(self) -> None:
        self._rpc.close()
        self._context.term()
