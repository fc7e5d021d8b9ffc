"""ZooKeeper watches that outlive a failed read.

kazoo's DataWatch and ChildrenWatch read their znode (and set the watch) on kazoo's worker
thread. When that read fails (a request that timed out, `session.ZooKeeperTimeout`, while
ZooKeeper was unreachable or slow), the exception ends in kazoo's worker thread as a logged
traceback, and the watch is set again only after the next reconnection: a read that timed out
while the connection stayed up left the watch unset for good (a GCM or host no longer saw
principal changes or hosts coming and going). These read again after a bounded back-off, with
one warning, until a read succeeds or the watch is stopped. The first read is made by the
caller, as kazoo's: its failure is raised there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from roq import limits
from roq.backoff import Backoff

log = logging.getLogger(__name__)


class _Again:
    """Reads `read` again on a timer thread after a failure, `limits.zk_watch_retry_*` apart."""

    def __init__(self, path: str, read: Callable[[], None]):
        self.path, self._read = path, read
        self._backoff = Backoff(limits.zk_watch_retry_first_s, limits.zk_watch_retry_max_s)
        self.first = True  # the watch's first read is its maker's: a failure is raised there

    def failed(self, error: Exception) -> None:
        delay = self._backoff.next_s()
        log.warning("watch of %s: %s; reading it again in %.1f s", self.path,
                    error or type(error).__name__, delay)  # fmt: skip
        threading.Thread(target=self._later, args=(delay,), name="roq-watch-again",
                         daemon=True).start()  # fmt: skip

    def _later(self, delay_s: float) -> None:
        time.sleep(delay_s)  # the back-off; the read then runs on this thread, as on kazoo's
        self._read()

    def guard(self, read: Callable[[Any], None], event: Any, stopped: Callable[[], bool]) -> None:
        """One read of the watch; a failure of any but the first (the caller's, raised to it)
        is read again after the back-off."""
        try:
            read(event)
        except KazooException as error:
            if self.first:
                raise
            if not stopped():
                self.failed(error)
        else:
            self._backoff.reset()


class _DataWatch(DataWatch):  # type: ignore[misc]
    """A DataWatch whose failed read is tried again (kazoo's `_get_data`: its one read)."""

    def __init__(self, client: Any, path: str, func: Callable[..., Any]):
        self._again = _Again(path, self._get_data)
        try:
            super().__init__(client, path, func)
        finally:
            self._again.first = False

    def _get_data(self, event: Any = None) -> None:
        self._again.guard(super()._get_data, event, lambda: bool(self._stopped))


class _ChildrenWatch(ChildrenWatch):  # type: ignore[misc]
    """A ChildrenWatch whose failed read is tried again (kazoo's `_get_children`)."""

    def __init__(self, client: Any, path: str, func: Callable[..., Any]):
        self._again = _Again(path, self._get_children)
        try:
            super().__init__(client, path, func)
        finally:
            self._again.first = False

    def _get_children(self, event: Any = None) -> None:
        self._again.guard(super()._get_children, event, lambda: bool(self._stopped))


def watch_data(client: Any, path: str, func: Callable[[Any, Any], bool | None]) -> None:
    """kazoo's DataWatch(client, path, func), read again after a failed read."""
    _DataWatch(client, path, func)


def watch_children(client: Any, path: str, func: Callable[[list[str]], bool | None]) -> None:
    """kazoo's ChildrenWatch(client, path, func), read again after a failed read."""
    _ChildrenWatch(client, path, func)
