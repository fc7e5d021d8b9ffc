"""A stop that remembers when it came, and the graces that count from it.

A client told to stop (Ctrl-C, SIGTERM) takes steps that may each wait: a running command's last
moments (`exec_stop_finish_s`), then its settlement, its slots handed back and its leave
(`work_stop_grace_s`). The first counts from the stop itself, not from when a loop next looked
(up to a poll later on a loaded machine), so that the whole stays within the second a user is
promised (README, "Command line"); the second follows it and counts from its own first look.
"""

from __future__ import annotations

import threading
import time


class Stop(threading.Event):
    """An Event that notes the monotonic time it was first set (`set_at`)."""

    def __init__(self) -> None:
        super().__init__()
        self.set_at: float | None = None

    def set(self) -> None:
        if self.set_at is None:
            self.set_at = time.monotonic()
        super().set()


class Grace:
    """`over()` once `grace_s` passed since `stop` was set: since `set_at` for a `Stop`, since this
    grace first saw it set for a plain Event (an application's own) or when `from_stop` is False
    (a step that comes after another's grace: it gets its own once that one is over)."""

    def __init__(self, stop: threading.Event, grace_s: float, from_stop: bool = True):
        self.stop = stop
        self.grace_s = grace_s
        self.from_stop = from_stop
        self._seen: float | None = None

    def over(self) -> bool:
        if not self.stop.is_set():
            return False
        now = time.monotonic()
        if self._seen is None:
            self._seen = now
        since = self.stop.set_at if self.from_stop and isinstance(self.stop, Stop) else None
        return now - (self._seen if since is None else since) > self.grace_s
