"""The `interval` flush policy's fdatasync, run off the owning thread.

An fdatasync takes milliseconds (3–11 ms measured on a virtio disk, docs/benchmarks.md); run on
an exchange's main thread it would stall every batch behind it, which is most of the log's
tail latency. The flusher syncs a duplicate of the active segment's descriptor, so the owner may
roll or close the segment meanwhile; the owner learns the result on its next tick.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass

from roq import limits
from roq.errors import LogUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncDone:
    generation: int  # the log's truncation generation when the sync was asked for
    end_offset: int  # everything before this offset is on stable storage
    error: LogUnavailable | None = None


class Flusher(threading.Thread):
    """One sync at a time: a request while one is in flight is refused (the next tick asks
    again), so at most one descriptor is duplicated and nothing queues."""

    def __init__(self, name: str):
        super().__init__(name=f"roq-flush-{name}"[:64], daemon=True)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._request: tuple[int, int, int] | None = None  # (dup fd, end offset, generation)
        self._busy = False
        self._done: SyncDone | None = None
        self._stopping = False

    def request(self, fd: int, end_offset: int, generation: int) -> bool:
        """Sync `fd` (the flusher closes its duplicate); False if a sync is still in flight."""
        with self._lock:
            if self._busy or self._stopping:
                return False
            self._request = (os.dup(fd), end_offset, generation)
            self._busy = True
        self._wake.set()
        return True

    def take_done(self) -> SyncDone | None:
        with self._lock:
            done, self._done = self._done, None
            return done

    def idle(self) -> bool:
        with self._lock:
            return not self._busy

    def stop(self) -> None:
        """Finish the sync in flight (bounded) and end the thread."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        self.join(limits.shutdown_grace_ms / 1000)

    def run(self) -> None:
        while True:
            self._wake.wait(limits.poll_interval_ms / 1000)
            self._wake.clear()
            with self._lock:
                request, self._request = self._request, None
                stopping = self._stopping
            if request is not None:
                self._sync(*request)
            if stopping:
                return

    def _sync(self, fd: int, end_offset: int, generation: int) -> None:
        error = None
        try:
            os.fdatasync(fd)
        except OSError as failure:
            if failure.errno == errno.EINVAL:
                return self._finish(fd, end_offset, generation, None)  # a device: nothing to sync
            error = LogUnavailable(f"fdatasync failed: {failure.strerror}")
            log.error("%s: %s", self.name, error)
        self._finish(fd, end_offset, generation, error)

    def _finish(self, fd: int, end: int, generation: int, error: LogUnavailable | None) -> None:
        os.close(fd)
        with self._lock:
            self._done = SyncDone(generation, end, error)
            self._busy = False
