"""Deleting retired segment files off the owning thread.

Unlinking a 64 MiB segment that was written back takes ~40 ms on the virtio disk of
docs/benchmarks.md (ext4 mounted with `discard` frees and discards its extents in the call).
Retention at 120 MB/s deletes two segments a second, so on an exchange's main thread that was
up to 80 ms of every second with nothing forwarded, in 40 ms stalls. The log instead renames a
segment it retires to `<name>.deleted` (metadata only, at once invisible to the log and to
readers of its directory) and hands the path to the janitor, one thread per process shared by
every log, as Kafka's delayed segment deletion does. A `.deleted` file left by a crash is removed
when the log is opened again.
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path

from roq import limits

log = logging.getLogger(__name__)

PENDING_MAX = 1024  # files waiting; past this the caller deletes inline (bounded, never lost)
DELETED_SUFFIX = ".deleted"


class Janitor(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="roq-log-janitor", daemon=True)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: collections.deque[Path] = collections.deque()
        self.deleted = 0

    def discard(self, path: Path) -> None:
        """Delete `path` soon; inline if too many deletions are already waiting."""
        with self._lock:
            if len(self._pending) < PENDING_MAX:
                self._pending.append(path)
                self._wake.set()
                return
        unlink(path)

    def idle(self) -> bool:
        with self._lock:
            return not self._pending

    def run(self) -> None:
        while True:
            self._wake.wait(limits.poll_interval_ms / 1000)
            self._wake.clear()
            while (path := self._next()) is not None:
                unlink(path)
                self.deleted += 1

    def _next(self) -> Path | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None


def unlink(path: Path) -> None:
    """Errors are logged, not raised: the file is already out of the log (a full disk then
    keeps a little more than retention says, and the next open tries again)."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        log.error("cannot delete retired segment %s: %s", path, error)


class _Shared:
    lock = threading.Lock()
    janitor: Janitor | None = None


def shared() -> Janitor:
    """The process's janitor, started on first use (again in a forked child, where the
    parent's thread does not run)."""
    with _Shared.lock:
        if _Shared.janitor is None or not _Shared.janitor.is_alive():
            _Shared.janitor = Janitor()
            _Shared.janitor.start()
        return _Shared.janitor
