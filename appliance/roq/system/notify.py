"""systemd readiness notification and watchdog keep-alives (sd_notify) without a dependency.

One datagram to $NOTIFY_SOCKET ('@' = abstract namespace). The shipped executable is one-dir, so
the notifying process is the unit's main PID and the units keep NotifyAccess=main; a one-file
build would notify from the bootloader's child and need NotifyAccess=all (MAINPID= is sent for
that case).

The watchdog: a unit with WatchdogSec= gives its main process $WATCHDOG_USEC (and $WATCHDOG_PID);
`keepalive()`, called on every turn of the daemon's main loop, sends WATCHDOG=1 at most every half
of that interval, so a loop that stops turning misses it and systemd restarts the unit.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
from collections.abc import Callable


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") if systemd asked for it; True if a datagram was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def ready(status: str) -> bool:
    return notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_interval_s() -> float | None:
    """systemd's WatchdogSec= for this process, in seconds; None when there is none (no
    $WATCHDOG_USEC, or $WATCHDOG_PID names another process: a child that inherited them)."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class Watchdog:
    """WATCHDOG=1 at most every half interval, sent by `beat()` from a loop that turns."""

    def __init__(
        self, interval_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.period_s = None if interval_s is None else interval_s / 2
        self._clock = clock
        self._next = 0.0

    def beat(self) -> bool:
        """True if a keep-alive was sent now."""
        if self.period_s is None:
            return False
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.period_s
        return notify("WATCHDOG=1")


@functools.cache
def process_watchdog() -> Watchdog:
    """The process's one watchdog, its interval read from the environment once."""
    return Watchdog(watchdog_interval_s())


def keepalive() -> bool:
    """The process's watchdog beat; True if WATCHDOG=1 was sent now."""
    return process_watchdog().beat()


async def keep_alive_while_the_loop_turns() -> None:
    """An asyncio task (the HTTP gateway's): it beats only while its event loop runs tasks, so
    a loop blocked by a call that never returns misses the watchdog. Ends at once without one."""
    interval = watchdog_interval_s()
    if interval is None:
        return
    while True:
        keepalive()
        await asyncio.sleep(interval / 4)  # keepalive() sends every other wake-up or so
