"""An exchange's pulse: proof to its monitor that the process is up, sent by its own thread.

The exchange's reports (heartbeats with its load) come from its main loop, which can stall for
seconds while the disk is saturated (an ext4 fdatasync or a file-extending write waits for the
journal) or the CPU is oversubscribed. Declared dead for that, the exchange would lose its
publishers, and with `acks="none"` what they had in flight. The pulse thread does no I/O but one
small send per period, so it keeps beating through such stalls; it says how long ago the loop
last turned, and the monitor only trusts it while that age stays under
`limits.exchange_loop_stall_max_ms` — a loop stuck for longer is dead even if its process is not.
A killed process stops both, and is declared dead as before; a frozen one (SIGSTOP) too, once
its silence passes `limits.monitor_late_silence_max_ms` (monitor/detector.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.protocol import bsonmsg
from roq.protocol.messages.monitor import ExchangePulse
from roq.transport import Kind, connect, disconnect, open_socket, send_nowait

log = logging.getLogger(__name__)


class Pulse(threading.Thread):
    """Owns one PUB socket to the monitor's report port; sends every `period_s` until stopped."""

    def __init__(
        self,
        context: Any,
        monitor: str,
        identity: ExchangePulse,
        period_s: float,
        loop_turned: Callable[[], float],
        acting: Callable[[], bool] = lambda: True,
    ):
        super().__init__(name="roq-pulse", daemon=True)
        self._context, self._monitor = context, monitor
        self._target = monitor  # set by `retarget` (a str: atomic), followed at the next beat
        self._identity = identity  # Id, Front, Started: how the monitor knows the exchange
        self._period_s = period_s
        self._loop_turned = loop_turned  # monotonic time of the main loop's last turn
        self._acting = acting  # False while the exchange is fenced: then it does not beat
        self._stop_event = threading.Event()

    def run(self) -> None:
        sock = open_socket(self._context, Kind.PUB, sndhwm=limits.exchange_pulse_hwm)
        try:
            connect(sock, self._monitor)
            while not self._stop_event.wait(self._period_s):
                if self._target != self._monitor:  # the queue's monitor was re-placed
                    disconnect(sock, self._monitor)
                    self._monitor = self._target
                    connect(sock, self._monitor)
                if not self._acting():
                    continue
                age = time.monotonic() - self._loop_turned()
                pulse = dataclasses.replace(self._identity, loop_age_s=age)
                # not taken: the monitor is not reading, and the next pulse tries again
                send_nowait(sock, [bsonmsg.encode(pulse.encode())])
        finally:
            sock.close(0)

    def retarget(self, monitor: str) -> None:
        """Beat to `monitor` from the next period on (called from the exchange's loop)."""
        self._target = monitor

    def stop(self) -> None:
        self._stop_event.set()
        self.join(max(1.0, 2 * self._period_s))
