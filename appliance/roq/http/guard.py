"""What a connection to the gateway may hold before it has said who it is (issue 31, finding 5).

uvicorn bounds what it can: requests in progress (`limit_concurrency`, which counts open
connections too: past it every request is a 503), an idle keep-alive connection
(`timeout_keep_alive`) and a request head's size (h11's `max_incomplete_event_size`). It does not
bound a connection that sends nothing, or half a head, before its first request or after a
response (a partial head stops the keep-alive timer and nothing starts another): 2,000 such
connections made every request a 503 for as long as they stayed. So the gateway runs uvicorn's
own h11 protocol with two additions, and no HTTP parsing of its own:

- **a head deadline**: a connection must deliver a whole request head within
  `limits.http_head_s` of opening and of each response's end, else it is closed;
- **connections per client address**: past `limits.http_connections_per_ip_max` open from one
  IP address, a new one is closed at once, so one address cannot take the server's
  connections from everybody else.

A request in progress has its own bounds (api.py: its principal's share, its body's read).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from roq import limits

log = logging.getLogger(__name__)


class Guard:
    """The connections open per client address, shared by every connection of one server."""

    def __init__(self, per_ip_max: int, head_s: float):
        self.per_ip_max, self.head_s = per_ip_max, head_s
        self.open: Counter[str] = Counter()
        self.refused = 0  # connections closed at once (their address had too many)
        self._said_at = -limits.refusal_log_interval_s

    def admit(self, address: str) -> bool:
        if self.open[address] >= self.per_ip_max:
            self.refused += 1
            self._say(address)
            return False
        self.open[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]

    def _say(self, address: str) -> None:
        """A flood is said once a minute, not once per connection."""
        now = time.monotonic()
        if now - self._said_at >= limits.refusal_log_interval_s:
            self._said_at = now
            log.warning("http: %s has %d connections open: more are closed at once (%d so far)",
                        address, self.per_ip_max, self.refused)  # fmt: skip


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with a head deadline and a cap per client address."""

    guard: Guard  # set by `protocol`, one per server
    _address: str | None = None  # counted in guard.open while set
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and not self.guard.admit(address):
            transport.close()
            return
        self._address = address
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        if self._address is not None:
            self.guard.release(self._address)
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:  # h11 gave a whole head: a request began
            self._head_arrived()

    def on_response_complete(self) -> None:
        done = self.cycle
        super().on_response_complete()
        # the next request's head is due now, unless a pipelined one began already
        if self.cycle is done and not self.transport.is_closing():
            self._expect_head()

    def _expect_head(self) -> None:
        self._head_arrived()
        self._head_timer = self.loop.call_later(self.guard.head_s, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol(guard: Guard) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...), bound to `guard`."""
    return type("Guarded", (Guarded,), {"guard": guard})
